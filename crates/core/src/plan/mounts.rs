//! Plan step: the mounts — driver files read-only, the shim, the generated `ld.so.preload`, the
//! container's own state tmpfs and its read-only quota.

use crate::allocation::AllocationError;
use crate::cdi::MountEdit;
use crate::config::{Config, ShimInject};
use crate::inventory::DriverFile;

use super::{
    CONTAINER_QUOTA_FILE, CONTAINER_SHIM_PATH, LD_SO_PRELOAD_FILE, RO_BIND, driver_mounts,
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
            || [LD_SO_PRELOAD_FILE, crate::inventory::CACHE_FILE].contains(&container_id)
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
    m.push(super::state_tmpfs(config.shim.is_hami_core()));
    m.push(bind(
        &state.quota,
        CONTAINER_QUOTA_FILE,
        &["ro", "nosuid", "nodev", "noexec", "bind"],
    ));
    m
}
