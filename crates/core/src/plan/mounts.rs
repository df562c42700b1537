//! Plan step: the mounts — driver files read-only, the shim, the generated `ld.so.preload`, the
//! container's own state tmpfs and its read-only quota.

use crate::allocation::AllocationError;
use crate::cdi::MountEdit;
use crate::config::{Config, ShimInject};
use crate::inventory::DriverFile;

use super::{
    CONTAINER_QUOTA_FILE, CONTAINER_SHIM_PATH, CONTAINER_STATE_DIR, LD_FACTS_FILE,
    LD_SO_PRELOAD_FILE, RO_BIND, RW_STATE_BIND, STATE_TMPFS_SIZE, STATE_TMPFS_SIZE_HAMI,
};

/// Host paths of one container's state.
#[derive(Debug, Clone)]
pub struct StatePaths {
    /// `state-dir/<id>`.
    pub dir: String,
    /// `state-dir/<id>/quota`.
    pub quota: String,
    /// The node-wide generated `state-dir/ld.so.preload`, when the shim is injected that way.
    pub preload: Option<String>,
}

impl StatePaths {
    /// The paths for `container_id`; refused when `state-dir/<id>` would collide with a
    /// node-wide file (or a temp file) in state-dir.
    pub fn new(config: &Config, container_id: &str) -> Result<StatePaths, AllocationError> {
        if container_id.starts_with('.')
            || [
                LD_SO_PRELOAD_FILE,
                LD_FACTS_FILE,
                crate::inventory::CACHE_FILE,
            ]
            .contains(&container_id)
        {
            return Err(AllocationError::new(
                "container id",
                container_id,
                "reserved in state-dir for a node-wide file; a GPU container cannot use it",
            ));
        }
        let dir = config.container_state_dir(container_id);
        Ok(StatePaths {
            quota: dir.join("quota").display().to_string(),
            dir: dir.display().to_string(),
            preload: (config.shim.inject == ShimInject::LdSoPreload).then(|| {
                config
                    .state_dir
                    .join(LD_SO_PRELOAD_FILE)
                    .display()
                    .to_string()
            }),
        })
    }
}

fn bind(host: &str, container: &str, options: &[&str]) -> MountEdit {
    MountEdit {
        host_path: host.to_string(),
        container_path: container.to_string(),
        kind: None,
        options: options.iter().map(|s| s.to_string()).collect(),
    }
}

/// Every mount of a container with gpufence devices, in the order runc must make them.
pub fn mounts(files: &[&DriverFile], config: &Config, state: &StatePaths) -> Vec<MountEdit> {
    let mut m = driver_mounts(files.iter().copied());
    m.push(bind(
        &config.shim.library.display().to_string(),
        CONTAINER_SHIM_PATH,
        &RO_BIND,
    ));
    if let Some(preload) = &state.preload {
        m.push(bind(preload, "/etc/ld.so.preload", &RO_BIND));
    }
    m.push(state_tmpfs(config.shim.is_hami_core()));
    m.push(bind(
        &state.quota,
        CONTAINER_QUOTA_FILE,
        &["ro", "nosuid", "nodev", "noexec", "bind"],
    ));
    m
}

/// `/run/gpufence` inside the container: a tmpfs of its own (never the host's state directory),
/// sized by the host and with inodes for its root, the quota's mount point and one file — the
/// accounting region, created by the first shim process (mode 1777: whatever its uid). Its pages
/// are charged to the container's memory cgroup and vanish with its mount namespace; the host
/// never reads it, so nothing the container plants there is ever followed by a host process.
pub fn state_tmpfs(hami: bool) -> crate::cdi::MountEdit {
    let (size, inodes) = if hami {
        (STATE_TMPFS_SIZE_HAMI, 5)
    } else {
        (STATE_TMPFS_SIZE, 3)
    };
    crate::cdi::MountEdit {
        host_path: "tmpfs".to_string(),
        container_path: CONTAINER_STATE_DIR.to_string(),
        kind: Some("tmpfs".to_string()),
        options: [
            "nosuid".to_string(),
            "nodev".to_string(),
            "noexec".to_string(),
            "mode=1777".to_string(),
            format!("size={size}"),
            format!("nr_inodes={inodes}"),
        ]
        .to_vec(),
    }
}

/// Bind mounts of driver files (same path in the container as under `driver-root`):
/// read-only, except node-wide device state, which every process of the node writes.
pub fn driver_mounts<'a>(
    files: impl IntoIterator<Item = &'a crate::inventory::DriverFile>,
) -> Vec<crate::cdi::MountEdit> {
    files
        .into_iter()
        .map(|f| crate::cdi::MountEdit {
            host_path: f.host_path.display().to_string(),
            container_path: f.container_path.clone(),
            kind: None,
            options: if f.kind == crate::inventory::FileKind::DeviceState {
                RW_STATE_BIND.iter()
            } else {
                RO_BIND.iter()
            }
            .map(|s| s.to_string())
            .collect(),
        })
        .collect()
}
