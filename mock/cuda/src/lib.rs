//! Mock cuda.
