//! What an allocation is, as plain data every reader and the plan share: the devices granted
//! (with what backs each and its replica share), the foreign CDI devices, where each facet was
//! read from.

use serde::{Deserialize, Serialize};

use crate::cdi::ContainerEdits;
use crate::config::Dialect;
use crate::inventory::Capability;
use crate::kubelet::ContainerRecord;

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
    /// What backs the grant: kubelet's record, the admission policy, or belief
    /// ([`super::backing`], `allocation.trust-annotations`).
    #[serde(default)]
    pub backing: Backing,
    /// The time-slicing replicas of this device kubelet records the container holding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<ReplicaShare>,
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
    /// What backs the grant ([`super::backing`]).
    #[serde(default)]
    pub backing: Backing,
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
    /// `gpufence.dev/cores-policy: burst`: compute shares may use idle GPU time.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cores_burst: bool,
    /// Where each facet was taken from (every dialect that expressed it; they agree).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<FacetSource>,
}

/// Where an input was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// An OCI annotation (pod or container annotation passed by the CRI runtime).
    Annotation,
    /// Env that kubelet's device-manager checkpoint records a device plugin set.
    Kubelet,
    /// Process env believed as written (`allocation.trust-env = true`).
    Env,
    /// A mount in `config.json` (the NVIDIA device plugin's volume-mounts strategy).
    Mount,
    /// A device node the engine put into `config.json` (`linux.devices`:
    /// [`super::spec_devices`]).
    Device,
}

/// One facet of the allocation and the input it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FacetSource {
    /// `devices`, `memory`, `cores` or `oversubscribe`.
    pub facet: String,
    pub dialect: Dialect,
    pub origin: Origin,
    pub key: String,
    pub value: String,
}

/// What backs one granted device (`gpufence plan` shows it for every device).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Backing {
    /// kubelet's device-manager checkpoint: the device plugin of `resource` allocated it to this
    /// container (`ids`: the plugin's device ids that name it, else all of the resource's).
    DevicePlugin { resource: String, ids: Vec<String> },
    /// kubelet's DRA state: a claim prepared for this pod (`namespace/name`); `device`: the
    /// device node it arrived as, `share`: the share of a shared device (KEP-5075) its driver
    /// wrote ([`super::dra_share`]).
    DraClaim {
        claim: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        share: Option<String>,
    },
    /// `allocation.trust-annotations = "admission"`: the operator's admission policy reserves
    /// the annotation keys to the scheduler.
    Admission,
    /// Believed as written: `trust-annotations = true`, or not a CRI container.
    #[default]
    Trusted,
}

impl std::fmt::Display for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backing::DevicePlugin { resource, ids } => {
                write!(f, "kubelet device plugin {resource} [{}]", ids.join(", "))
            }
            Backing::DraClaim {
                claim,
                device,
                share,
            } => {
                write!(f, "kubelet DRA claim {claim}")?;
                let detail: Vec<String> = device
                    .iter()
                    .map(|d| format!("device {d}"))
                    .chain(share.iter().map(|s| format!("share {s}")))
                    .collect();
                if !detail.is_empty() {
                    write!(f, " ({})", detail.join(", "))?;
                }
                Ok(())
            }
            Backing::Admission => f.write_str("admission policy"),
            Backing::Trusted => f.write_str("trusted"),
        }
    }
}

/// One device's time-slicing replica share ([`super::replicas`] takes and describes it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaShare {
    /// The resource the replicas were allocated as (`nvidia.com/gpu`, `nvidia.com/gpu.shared`).
    pub resource: String,
    /// Replicas the container holds (r).
    pub held: u32,
    /// Replicas of the device kubelet registers (N).
    pub of: u32,
    /// floor(device memory × r / N), bytes.
    pub memory: u64,
    /// 100 × r / N percent (at least 1); `None` on a MIG device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u8>,
}

/// What kubelet said about this container, for `gpufence plan` and the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletReport {
    /// `record` (read and verified), `unavailable` (expected, but unreadable or not believable),
    /// `absent` (not consulted: trust-env is not "kubelet", or no kubelet for this container).
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// kubelet's DRA state file read with the checkpoint (`kubelet.dra-checkpoint`, or
    /// `gpufence plan --dra-checkpoint`); set with a `record`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra_state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The record for this container (pod UID, container name, per resource: device ids, env…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<ContainerRecord>,
}

/// A GPU env value that was not acted on as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Neutralised {
    pub key: String,
    pub value: String,
    /// What the container sees instead (`None`: left in place, not acted on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    pub why: String,
}

/// What the allocation intake decided for one container.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Intake {
    /// `None`: no trusted dialect expresses an allocation (the container gets no GPU).
    pub allocation: Option<Allocation>,
    /// Untrusted GPU env neutralised: `KEY=value` replacements for the process env.
    pub env_overrides: Vec<String>,
    /// Decisions worth telling the operator (ignored or neutralised env).
    pub notes: Vec<String>,
    /// GPU env not acted on as written (trust-env = "kubelet").
    pub neutralised: Vec<Neutralised>,
    /// What kubelet recorded for this container (trust-env = "kubelet").
    pub kubelet: Option<KubeletReport>,
}
