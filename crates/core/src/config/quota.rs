//! `[quota] backend = "auto" | "shim" | "driver" | "both"`.

use serde::{Deserialize, Serialize};

/// How memory quotas are enforced on this node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuotaBackend {
    /// Driver where the node supports it (NVML exports the memory-limit calls and accepts them
    /// for the GPU, the GPU is not MIG, `/sys/fs/cgroup` is cgroup v2), else the shim.
    #[default]
    Auto,
    /// The preloaded shim only (every driver; a process that escapes the preload escapes it).
    Shim,
    /// NVML memory limits on the container's cgroup only (enforced by the driver for every
    /// process of the cgroup); refused where the node cannot do it.
    Driver,
    /// Both: the driver's limit, and the shim for the virtual totals `nvidia-smi` and
    /// `cuMemGetInfo` show.
    Both,
}

impl QuotaBackend {
    pub fn name(self) -> &'static str {
        match self {
            QuotaBackend::Auto => "auto",
            QuotaBackend::Shim => "shim",
            QuotaBackend::Driver => "driver",
            QuotaBackend::Both => "both",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct QuotaConfig {
    pub backend: QuotaBackend,
}
