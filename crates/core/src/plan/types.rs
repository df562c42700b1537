//! The plan as data: [`Plan`] and what it carries (cgroup rules, host files, the ld cache, the
//! folders layout), and the container paths every part of the plan agrees on.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::allocation::Allocation;
use crate::cdi::{ContainerEdits, MountEdit};
use crate::quota::Quota;

/// Where the per-container state directory appears inside the container.
pub const CONTAINER_STATE_DIR: &str = "/run/gpufence";
/// Where the quota file appears inside the container.
pub const CONTAINER_QUOTA_FILE: &str = "/run/gpufence/quota";
/// The shared accounting region inside the container state directory (the shim's
/// `region::FILE_NAME`), created by the first shim process in the container's own size-bounded
/// tmpfs (`state_tmpfs`), never on the host.
pub const ACCOUNTING_FILE: &str = "accounting";
/// Where the shim is mounted inside the container.
pub const CONTAINER_SHIM_PATH: &str = "/usr/lib/gpufence/libgpufence.so";

/// A cgroup device rule (`c 195:0 rw`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CgroupRule {
    /// `c` or `b`.
    #[serde(rename = "type")]
    pub kind: char,
    pub major: u32,
    pub minor: u32,
    /// Subset of `rwm`.
    pub access: String,
}

impl std::fmt::Display for CgroupRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}:{} {}",
            self.kind, self.major, self.minor, self.access
        )
    }
}

/// The container's ld cache, refreshed so the driver libraries the plan mounts are found by
/// soname: which folders (container paths) enter it. A typed part of the plan that every applier
/// renders its own way — `gpufence-runtime` writes the cache in-process before runc (or, for a
/// user-namespaced container, adds the createContainer hook [`super::ldcache_hook`] renders), the hook
/// refreshes it inside the container's mount namespace, the NRI plugin and CDI specs add the hook.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LdCache {
    /// Folders holding the mounted libraries, sorted.
    pub folders: Vec<String>,
}

/// A file the apply step must write on the host before the container starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostFile {
    pub path: String,
    pub contents: String,
    /// Octal permission bits, e.g. 0o444.
    pub mode: u32,
}

/// Everything to do to one container.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub container_id: String,
    /// `None` = no allocation: the container gets no GPU.
    pub allocation: Option<Allocation>,
    /// Device nodes (with major/minor), mounts, env, hooks to add.
    pub edits: ContainerEdits,
    /// cgroup allow rules matching `edits.device_nodes`.
    pub cgroup_rules: Vec<CgroupRule>,
    /// The quota handed to the shim (also rendered into `host_files`).
    pub quota: Option<Quota>,
    /// Host directory to create for the container's state (`state-dir/<id>`).
    pub state_dir: Option<String>,
    /// Files to write on the host (quota, generated ld.so.preload).
    pub host_files: Vec<HostFile>,
    /// Untrusted GPU env neutralised: `KEY=new value` replacements for the process env.
    pub env_overrides: Vec<String>,
    /// Human-readable notes about decisions (e.g. which env was neutralised and why).
    pub notes: Vec<String>,
    /// Per device: where its memory quota is enforced (`shim`, `driver`, `both`, `none`).
    #[serde(default)]
    pub memory_backends: Vec<crate::backend::DeviceBackend>,
    /// Limits the createRuntime hook sets through NVML on the container's cgroup.
    #[serde(default)]
    pub driver_limits: Vec<crate::backend::DriverLimit>,
    /// MPS sharing (daemon pipe and shm, client limits).
    #[serde(default)]
    pub mps: Option<crate::mps::MpsPlan>,
    /// GPU env not acted on as written, and why (`allocation.trust-env = "kubelet"`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub neutralised: Vec<crate::allocation::kubelet_env::Neutralised>,
    /// What kubelet recorded for this container (`allocation.trust-env = "kubelet"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<crate::allocation::kubelet_env::KubeletReport>,
    /// What the shim's quota protects against and what it does not (`SHIM_ISOLATION`), when
    /// the plan hands the container a quota; `None` otherwise.
    #[serde(default)]
    pub isolation: Option<String>,
    /// The ld cache refresh the driver libraries need (`None`: no library mounted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ld_cache: Option<LdCache>,
    /// `runtime.driver-layout = "folders"`: the same driver files served by folder binds, set by
    /// the node once it has named (or made) the folders' directory on this host
    /// (`gpufence_node::driverfolders`); every applier renders it in place of the per-file
    /// edits ([`Plan::layout_mounts`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_folders: Option<DriverFolders>,
}

/// The plain statement of what a preloaded shim's quota is: it keeps tenants from each other's
/// mistakes and honest overuse; a hostile process inside the container can get past any
/// library it is handed (it may skip the preload or call the driver directly).
pub const SHIM_ISOLATION: &str = "the shim's memory quota protects tenants from each other's \
    mistakes and honest overuse; it is not a hard boundary against a hostile process in this \
    container, which can bypass a preloaded library — hard isolation against a hostile tenant \
    needs the driver backend or MIG";

impl Plan {
    /// The mounts as the appliers render them: the driver folders' where the node settled them
    /// ([`DriverFolders`]), else the per-file edits.
    pub fn layout_mounts(&self) -> &[MountEdit] {
        self.driver_folders
            .as_ref()
            .map_or(&self.edits.mounts, |f| &f.mounts)
    }

    /// The ld cache as the appliers render it (the driver folders' where settled).
    pub fn layout_ld_cache(&self) -> Option<&LdCache> {
        match &self.driver_folders {
            Some(f) => f.ld_cache.as_ref(),
            None => self.ld_cache.as_ref(),
        }
    }

    /// True when the plan grants nothing (no device nodes, no mounts, no shim).
    pub fn grants_nothing(&self) -> bool {
        self.allocation.is_none()
            && self.edits.device_nodes.is_empty()
            && self.edits.mounts.is_empty()
            && self.cgroup_rules.is_empty()
            && self.quota.is_none()
    }
}

/// Node-wide generated `ld.so.preload` (under `state-dir`), naming the container's shim path.
pub const LD_SO_PRELOAD_FILE: &str = "ld.so.preload";
/// Node-wide record of the driver libraries' ld cache facts (under `state-dir`, the runtime's).
pub const LD_FACTS_FILE: &str = "ld-facts";
/// HAMi-core's shared accounting region, inside the state directory (compatibility mode).
pub const HAMI_CACHE_FILE: &str = "vgpu.cache";

/// Bytes of the per-container tmpfs at `/run/gpufence`: the shim's accounting region (≈ 521 KiB)
/// with room to spare; HAMi-core's shared cache needs more.
pub const STATE_TMPFS_SIZE: &str = "1m";
/// The same for `shim.library` = HAMi-core's `libvgpu.so` (its `vgpu.cache` and lock).
pub const STATE_TMPFS_SIZE_HAMI: &str = "16m";

/// Mount options for driver files and the shim.
pub const RO_BIND: [&str; 4] = ["ro", "nosuid", "nodev", "bind"];

/// Mount options of node-wide device state files (see `FileKind::DeviceState`).
pub const RW_STATE_BIND: [&str; 5] = ["rw", "nosuid", "nodev", "noexec", "bind"];

/// One file in a folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// File name inside the folder (the container path's last component).
    pub name: String,
    pub host: PathBuf,
    /// A soname link to create beside it (`libcuda.so.1` → `libcuda.so.580.65.06`).
    pub soname: Option<String>,
}

/// One folder bind: its sub-directory in the prepared directory, where it appears, its files.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Folder {
    pub name: &'static str,
    pub container: String,
    /// The folder its members come from (their container paths in the `files` layout).
    pub from: String,
    pub members: Vec<Member>,
    /// Empty files to create, for read-write binds placed over them inside the folder.
    pub placeholders: Vec<String>,
}

/// What [`super::folders::fold`] decided for one plan.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Folding {
    pub folders: Vec<Folder>,
    /// Indices (in `plan.edits.mounts`) of the file binds the folders replace.
    pub folded: Vec<usize>,
    /// Read-write binds moved into a folder: index, new container path.
    pub moved: Vec<(usize, String)>,
    /// The library folder the folded libraries came from (renamed in the ld cache hook).
    pub lib_from: Option<String>,
}

/// `runtime.driver-layout = "folders"` as rendered for this host: the plan's driver file binds
/// served by folder binds from one prepared host directory. Every applier renders these mounts,
/// env and ld cache folders in place of the plan's per-file edits; where the directory cannot be
/// named or made (another filesystem, a driver file replaced since) the node leaves it `None`
/// and the appliers render the per-file edits, with one log line and a note.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DriverFolders {
    /// The prepared directory on the host (`runtime.driver-folders/<version>-<hash>`).
    pub dir: String,
    /// Whether it exists already (else the first create makes it).
    pub prepared: bool,
    /// The container's mounts with this layout (in place of `edits.mounts`).
    pub mounts: Vec<MountEdit>,
    /// The ld cache with this layout (the libraries' folder is [`super::folders::LIB_FOLDER`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ld_cache: Option<LdCache>,
    /// Env set with this layout, after the plan's (`PATH` naming [`super::folders::BIN_FOLDER`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// `LD_LIBRARY_PATH=…` naming the ld cache's folders after the container's own entries (the
    /// order the ld cache would have: an image's `LD_LIBRARY_PATH` comes before the cache), for
    /// the appliers that cannot write the container's ld cache before it starts (`gpufence nri`,
    /// the CDI spec); `None` when the container names every folder already. `gpufence-runtime`
    /// and hook mode write the cache instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library_path: Option<String>,
    /// Files folded, folders made.
    pub files: usize,
    pub folders: usize,
    /// What was folded: the runtime builds the prepared directory from it.
    #[serde(skip)]
    pub folding: Folding,
}
