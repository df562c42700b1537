//! Mock nvml.
