//! What the inventory records: plain data every stage shares (the GPUs and MIG devices, device
//! nodes, driver files by capability, driver memory-limit support).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::limits::support::DriverSupport;

/// Everything the node has.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// e.g. `580.65.06`.
    pub driver_version: String,
    /// CUDA driver API version as NVML reports it, e.g. `12080`.
    pub cuda_driver_version: i32,
    pub gpus: Vec<Gpu>,
    /// `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset` as found under `dev-root`.
    pub control_nodes: Vec<DeviceNode>,
    /// Driver files found under `driver-root`.
    pub driver_files: Vec<DriverFile>,
    /// Driver memory limits (NVML R615) and the cgroup layout: what `quota.backend = auto` reads.
    #[serde(default)]
    pub memory_limits: DriverSupport,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// Minor number: `/dev/nvidia<minor>`.
    pub minor: u32,
    /// `GPU-…`.
    pub uuid: String,
    pub name: String,
    pub memory_bytes: u64,
    /// `00000000:19:00.0`.
    pub pci_bus_id: String,
    /// (major, minor), e.g. (9, 0).
    pub compute_capability: (u32, u32),
    /// MIG mode currently enabled. `false` also where the GPU does not support MIG.
    pub mig_enabled: bool,
    /// Whether the GPU supports MIG at all.
    pub mig_capable: bool,
    /// MIG devices (empty unless `mig_enabled`).
    pub mig_devices: Vec<MigDevice>,
    /// The GPU's device node (`/dev/nvidia<minor>`).
    pub node: DeviceNode,
}

/// One MIG device (a GPU instance + compute instance).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigDevice {
    /// Index among the parent's MIG devices (the `M` of `N:M`).
    pub index: u32,
    /// `MIG-…`.
    pub uuid: String,
    /// GPU instance id.
    pub gi: u32,
    /// Compute instance id.
    pub ci: u32,
    /// e.g. `1g.10gb`.
    pub profile: String,
    pub memory_bytes: u64,
    /// `nvidia-caps` nodes this MIG device needs (gi access, ci access).
    pub caps: Vec<DeviceNode>,
}

/// A device node: where it is in the container and on the host.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path inside the container, e.g. `/dev/nvidia0`.
    pub path: String,
    /// Path on the host (under `dev-root`).
    pub host_path: PathBuf,
    /// `c` (character) or `b` (block).
    #[serde(rename = "type")]
    pub kind: char,
    pub major: u32,
    pub minor: u32,
}

/// Driver capabilities as `NVIDIA_DRIVER_CAPABILITIES` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    Compute,
    Utility,
    Video,
    Graphics,
    Display,
    Ngx,
    Compat32,
}

impl Capability {
    pub const ALL: [Capability; 7] = [
        Capability::Compute,
        Capability::Utility,
        Capability::Video,
        Capability::Graphics,
        Capability::Display,
        Capability::Ngx,
        Capability::Compat32,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Capability::Compute => "compute",
            Capability::Utility => "utility",
            Capability::Video => "video",
            Capability::Graphics => "graphics",
            Capability::Display => "display",
            Capability::Ngx => "ngx",
            Capability::Compat32 => "compat32",
        }
    }
    pub fn from_name(s: &str) -> Option<Capability> {
        Capability::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// What kind of driver file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// A shared library with the driver-version suffix (`libcuda.so.580.65.06`).
    Library,
    /// An executable (`nvidia-smi`).
    Binary,
    /// GSP firmware.
    Firmware,
    /// A daemon socket (persistenced, fabricmanager, MPS).
    Socket,
    /// A configuration/data file (Vulkan ICD JSON, …).
    Config,
    /// Node-wide device state shared read-write by every process of the node (only the
    /// simulated node's device timeline; mounted read-write).
    DeviceState,
}

/// One driver file to expose in containers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DriverFile {
    /// Path on the host (under `driver-root`).
    pub host_path: PathBuf,
    /// Path inside the container (host path with `driver-root` stripped).
    pub container_path: String,
    pub kind: FileKind,
    pub capability: Capability,
    /// For libraries: the soname (`libcuda.so.1`), so the ldcache hook can create the link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soname: Option<String>,
}

impl Inventory {
    /// A node with nothing: no driver, no GPU.
    pub fn empty() -> Inventory {
        Inventory {
            driver_version: String::new(),
            cuda_driver_version: 0,
            gpus: Vec::new(),
            control_nodes: Vec::new(),
            driver_files: Vec::new(),
            memory_limits: Default::default(),
        }
    }

    /// Majors of every device node the inventory knows (GPU, MIG capability, control).
    pub fn device_majors(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .gpus
            .iter()
            .flat_map(|g| {
                std::iter::once(g.node.major).chain(
                    g.mig_devices
                        .iter()
                        .flat_map(|m| m.caps.iter().map(|c| c.major)),
                )
            })
            .chain(self.control_nodes.iter().map(|n| n.major))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    pub fn gpu_by_index(&self, index: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.index == index)
    }
    pub fn gpu_by_uuid(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.uuid.eq_ignore_ascii_case(uuid))
    }
    /// (parent GPU, MIG device) for a `MIG-…` UUID.
    pub fn mig_by_uuid(&self, uuid: &str) -> Option<(&Gpu, &MigDevice)> {
        self.gpus.iter().find_map(|g| {
            g.mig_devices
                .iter()
                .find(|m| m.uuid.eq_ignore_ascii_case(uuid))
                .map(|m| (g, m))
        })
    }
    /// Driver files needed for a set of capabilities.
    pub fn files_for<'a>(
        &'a self,
        caps: &'a [Capability],
    ) -> impl Iterator<Item = &'a DriverFile> + 'a {
        self.driver_files
            .iter()
            .filter(move |f| caps.contains(&f.capability))
    }
}
