//! What the scheduler decided, normalised from any dialect (gpufence annotations, CDI
//! annotations, HAMi, Aliyun gpushare, NVIDIA device plugin).
//!
//! Reading is pure: it takes the parsed `config.json`, the inventory, the configuration and the
//! CDI specs found on the host (loaded at the edge) and returns one [`Allocation`] or a
//! one-line [`AllocationError`] naming the key, the value and why.

use serde::{Deserialize, Serialize};

pub mod cli;

use crate::cdi::ContainerEdits;
use crate::config::Dialect;
use crate::inventory::Capability;

/// A GPU or MIG device of this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum DeviceRef {
    /// A whole GPU, by NVML index.
    Gpu { index: u32 },
    /// A MIG device: parent GPU index and MIG device index.
    Mig { gpu: u32, mig: u32 },
}

/// One allocated device with its limits, in the container's device order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedDevice {
    pub device: DeviceRef,
    /// `GPU-…` or `MIG-…` (from the inventory).
    pub uuid: String,
    /// Bytes; `None` = the whole device.
    pub memory_limit: Option<u64>,
    /// Percent 1–100; `None` = no limit.
    pub cores: Option<u8>,
}

/// Devices of other CDI kinds named by `cdi.k8s.io/*` annotations, resolved with their edits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForeignCdiDevice {
    /// Fully qualified `vendor/class=name`.
    pub name: String,
    /// The spec file that defined it.
    pub spec_path: String,
    /// Device edits followed by the spec's common edits.
    pub edits: ContainerEdits,
}

/// The normalised allocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    /// Dialects that expressed this allocation (more than one only when they agree).
    pub dialects: Vec<Dialect>,
    /// Devices in container order (CUDA ordinal `i` = position `i`).
    pub devices: Vec<AllocatedDevice>,
    /// Let allocations beyond the quota spill to host memory instead of failing.
    pub oversubscribe: bool,
    /// Driver capabilities to expose (default `compute,utility`).
    pub capabilities: Vec<Capability>,
    /// Devices of other CDI kinds.
    pub foreign_cdi: Vec<ForeignCdiDevice>,
}

/// Why an allocation is refused: one line naming the input key, its value and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}={value:?}: {why}")]
pub struct AllocationError {
    /// The annotation or env key at fault (or the CDI spec file).
    pub key: String,
    /// The offending value (truncated for display by the constructor).
    pub value: String,
    pub why: String,
}

impl AllocationError {
    /// Build an error, truncating huge values so the message stays one readable line.
    pub fn new(key: impl Into<String>, value: &str, why: impl Into<String>) -> Self {
        const MAX: usize = 120;
        let value = if value.len() > MAX {
            let mut end = MAX;
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}…({} bytes)", &value[..end], value.len())
        } else {
            value.to_string()
        };
        let why: String = why.into();
        AllocationError {
            key: key.into(),
            value: value.replace('\n', "\\n"),
            why: why.replace('\n', " "),
        }
    }
}
