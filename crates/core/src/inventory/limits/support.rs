//! What the node supports for driver memory limits, as the inventory records it.

use serde::{Deserialize, Serialize};

use super::cgroup::CgroupMode;

/// What the node supports for driver memory limits (recorded in the inventory cache).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DriverSupport {
    /// How cgroups are mounted (`unified`, `hybrid`, `legacy`).
    pub cgroup: CgroupMode,
    /// NVML exports `nvmlDeviceSetMemoryLimits_v1` and `nvmlDeviceGetMemoryLimits_v1`.
    pub nvml_exports: bool,
    /// UUIDs of the GPUs for which NVML accepts memory-limit calls (never MIG).
    pub gpus: Vec<String>,
}
