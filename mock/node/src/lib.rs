//! The simulated node description (`GPUFENCE_MOCK_NODE`, format in docs/contract.md), shared by the
//! mock NVML and the mock CUDA driver.
//!
//! Lookup order: `$GPUFENCE_MOCK_NODE`; else `gpufence-mock-node.json` beside the mock library
//! itself (where `gpufence-sim` installs it); else `/etc/gpufence-mock-node.json`.
//!
//! Visibility follows the real driver inside a container: a GPU is visible only when its device
//! node `<dev_root>/dev/nvidia<minor>` exists and opening it is not refused by the device cgroup
//! (a fake node opens with ENXIO when allowed, EPERM when denied). `dev_root` defaults to `/`.

use std::ffi::CStr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub mod memlimits;
pub mod mps;
pub mod timeline;

pub const ENV: &str = "GPUFENCE_MOCK_NODE";
pub const FILE_NAME: &str = "gpufence-mock-node.json";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub driver_version: String,
    /// The CUDA version the driver reports (`cuDriverGetVersion`, NVML's CUDA driver version);
    /// absent: the one a real driver of `driver_version` reports ([`cuda_version_of_driver`]).
    #[serde(default)]
    pub cuda_driver_version: Option<i32>,
    pub gpus: Vec<Gpu>,
    /// Root under which `/dev/nvidia*` are checked for visibility (default `/`).
    #[serde(default)]
    pub dev_root: Option<String>,
    /// The driver supports NVML memory limits (R615); per-cgroup state kept in this directory
    /// (see `memlimits`). Absent: `nvmlDeviceSetMemoryLimits_v1` is not supported.
    #[serde(default)]
    pub memory_limits_dir: Option<String>,
    /// The node-wide device timeline file (see [`timeline`]); where it does not exist (inside a
    /// container) the one beside the node file is used.
    #[serde(default)]
    pub timeline: Option<String>,
}

impl Node {
    /// The CUDA version this node's driver reports.
    pub fn cuda_version(&self) -> i32 {
        self.cuda_driver_version
            .unwrap_or_else(|| cuda_version_of_driver(&self.driver_version))
    }
}

/// The CUDA version a real NVIDIA driver of branch `driver_version` reports (`cuDriverGetVersion`):
/// the CUDA release the branch shipped with (580 → 13.0, 575 → 12.9, 570 → 12.8, 560 → 12.6,
/// 550 → 12.4, 535 → 12.2, 525 → 12.0); a branch in between reports its predecessor's, an
/// unparsable one 13.0.
pub fn cuda_version_of_driver(driver_version: &str) -> i32 {
    const BRANCHES: [(u32, i32); 11] = [
        (580, 13000),
        (575, 12090),
        (570, 12080),
        (565, 12070),
        (560, 12060),
        (555, 12050),
        (550, 12040),
        (545, 12030),
        (535, 12020),
        (530, 12010),
        (525, 12000),
    ];
    let Some(major) = driver_version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok())
    else {
        return 13000;
    };
    BRANCHES
        .iter()
        .find(|(branch, _)| major >= *branch)
        .map_or(11080, |(_, cuda)| *cuda)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    pub uuid: String,
    pub name: String,
    pub memory_mib: u64,
    pub minor: u32,
    pub pci_bus_id: String,
    pub compute_capability: [i32; 2],
    #[serde(default)]
    pub mig: Vec<Mig>,
    /// `enabled`, `disabled` or `unsupported`; default `enabled` when `mig` is non-empty, else
    /// `unsupported`.
    #[serde(default)]
    pub mig_mode: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigMode {
    Enabled,
    Disabled,
    Unsupported,
}

impl Gpu {
    pub fn mig_mode(&self) -> MigMode {
        match self.mig_mode.as_deref() {
            Some("enabled") => MigMode::Enabled,
            Some("disabled") => MigMode::Disabled,
            Some(_) => MigMode::Unsupported,
            None if !self.mig.is_empty() => MigMode::Enabled,
            None => MigMode::Unsupported,
        }
    }
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib.saturating_mul(1 << 20)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mig {
    pub uuid: String,
    pub gi: u32,
    pub ci: u32,
    pub profile: String,
    pub memory_mib: u64,
}

impl Mig {
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib.saturating_mul(1 << 20)
    }
}

/// Find the node file (see the module docs). `anchor` is any function of the calling library,
/// used to find the library's own directory.
pub fn locate(anchor: *const libc::c_void) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(ENV) {
        return Some(PathBuf::from(p));
    }
    if let Some(dir) = library_dir(anchor) {
        let p = dir.join(FILE_NAME);
        if p.exists() {
            return Some(p);
        }
    }
    let p = PathBuf::from("/etc").join(FILE_NAME);
    p.exists().then_some(p)
}

fn library_dir(anchor: *const libc::c_void) -> Option<PathBuf> {
    // SAFETY: Dl_info is a plain C struct of pointers and integers; all-zero is a valid value
    // (null pointers) and dladdr overwrites it before any field is read.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address; info is a valid out-pointer.
    if unsafe { libc::dladdr(anchor, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    let path = PathBuf::from(name.to_str().ok()?);
    path.parent().map(Path::to_path_buf)
}

/// The node description and the timeline file that goes with it.
pub fn load_with_timeline(anchor: *const libc::c_void) -> Result<(Node, PathBuf), String> {
    let path = locate(anchor).ok_or_else(|| format!("no {ENV} and no {FILE_NAME} found"))?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let node = parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let t = timeline::path_for(&path, node.timeline.as_deref());
    Ok((node, t))
}

/// Load and parse the node file.
pub fn load(anchor: *const libc::c_void) -> Result<Node, String> {
    let path = locate(anchor).ok_or_else(|| format!("no {ENV} and no {FILE_NAME} found"))?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn parse(text: &str) -> Result<Node, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}

impl Node {
    /// GPUs visible to this process, in NVML/CUDA order (by PCI bus id).
    pub fn visible_gpus(&self) -> Vec<&Gpu> {
        let mut root = PathBuf::from(self.dev_root.as_deref().unwrap_or("/"));
        // Inside a container the host's simulated-node directory does not exist (the node file
        // is bind-mounted from the driver root as is): the container's own /dev is then the one.
        if !root.join("dev").is_dir() {
            root = PathBuf::from("/");
        }
        let mut v: Vec<&Gpu> = self
            .gpus
            .iter()
            .filter(|g| node_usable(&root.join(format!("dev/nvidia{}", g.minor))))
            .collect();
        v.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
        v
    }
}

/// A device node is usable when it exists and the device cgroup lets us open it (a fake node
/// then fails with ENXIO, a real one opens).
fn node_usable(p: &Path) -> bool {
    match std::fs::OpenOptions::new().read(true).write(true).open(p) {
        Ok(_) => true,
        Err(e) => matches!(e.raw_os_error(), Some(libc::ENXIO) | Some(libc::ENODEV)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_design_example() {
        let n = parse(
            r#"{ "driver_version": "580.65.06", "cuda_driver_version": 12080,
  "gpus": [ { "uuid": "GPU-1", "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "minor": 0,
              "pci_bus_id": "00000000:19:00.0", "compute_capability": [9, 0],
              "mig": [ { "uuid": "MIG-1", "gi": 1, "ci": 0, "profile": "1g.10gb", "memory_mib": 9984 } ] } ] }"#,
        )
        .unwrap();
        assert_eq!(n.gpus[0].mig_mode(), MigMode::Enabled);
        assert_eq!(n.cuda_version(), 12080, "an explicit version is kept");
        assert_eq!(n.gpus[0].mig[0].memory_bytes(), 9984 << 20);
        assert!(parse("{}").is_err());
    }

    #[test]
    fn cuda_version_follows_the_driver_branch() {
        assert_eq!(cuda_version_of_driver("580.65.06"), 13000);
        assert_eq!(cuda_version_of_driver("570.172.08"), 12080);
        assert_eq!(cuda_version_of_driver("550.54.15"), 12040);
        assert_eq!(cuda_version_of_driver("590.1"), 13000);
        assert_eq!(cuda_version_of_driver("520.61.05"), 11080);
        let n = parse(r#"{ "driver_version": "550.54.15", "gpus": [] }"#).unwrap();
        assert_eq!(n.cuda_version(), 12040);
    }
}
