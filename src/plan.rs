//! The plan: container edits, a pure function of (config.json, inventory, config, CDI specs).
//!
//! One plan feeds every output: the runtime applies it to `config.json`, the hook applies it in
//! the container's namespaces, `gpufence plan` prints it. Its JSON form (`gpufence plan --json`)
//! is a stable interface documented in the README.

use serde::{Deserialize, Serialize};

use crate::allocation::Allocation;
use crate::cdi::ContainerEdits;
use crate::quota::Quota;

/// Where the per-container state directory appears inside the container.
pub const CONTAINER_STATE_DIR: &str = "/run/gpufence";
/// Where the quota file appears inside the container.
pub const CONTAINER_QUOTA_FILE: &str = "/run/gpufence/quota";
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
}

impl Plan {
    /// True when the plan grants nothing (no device nodes, no mounts, no shim).
    pub fn grants_nothing(&self) -> bool {
        self.allocation.is_none()
            && self.edits.device_nodes.is_empty()
            && self.edits.mounts.is_empty()
            && self.cgroup_rules.is_empty()
            && self.quota.is_none()
    }
}

/// Compute the plan for one container. Pure: no I/O. `spec` is the parsed `config.json`;
/// `inventory` must already carry device numbers read from `dev-root` at this moment;
/// `cdi_specs` are the specs found in `/etc/cdi` and `/var/run/cdi`.
pub fn plan(
    spec: &serde_json::Value,
    container_id: &str,
    inventory: &crate::inventory::Inventory,
    config: &crate::config::Config,
    cdi_specs: &[crate::cdi::LoadedSpec],
) -> Result<Plan, crate::allocation::AllocationError> {
    let _ = (spec, inventory, config, cdi_specs);
    Ok(Plan {
        container_id: container_id.to_string(),
        ..Plan::default()
    })
}

/// Mount options for driver files and the shim.
pub const RO_BIND: [&str; 4] = ["ro", "nosuid", "nodev", "bind"];

/// The CDI/OCI device-node edit for an inventory device node.
pub fn device_node_edit(n: &crate::inventory::DeviceNode) -> crate::cdi::DeviceNodeEdit {
    crate::cdi::DeviceNodeEdit {
        path: n.path.clone(),
        host_path: Some(n.host_path.display().to_string()),
        kind: Some(n.kind.to_string()),
        major: Some(i64::from(n.major)),
        minor: Some(i64::from(n.minor)),
        file_mode: Some(0o666),
        permissions: Some("rw".to_string()),
        uid: None,
        gid: None,
    }
}

/// The cgroup allow rule for an inventory device node.
pub fn cgroup_rule(n: &crate::inventory::DeviceNode) -> CgroupRule {
    CgroupRule {
        kind: n.kind,
        major: n.major,
        minor: n.minor,
        access: "rw".to_string(),
    }
}

/// Read-only bind mounts of driver files (same path in the container as under `driver-root`).
pub fn driver_mounts<'a>(
    files: impl IntoIterator<Item = &'a crate::inventory::DriverFile>,
) -> Vec<crate::cdi::MountEdit> {
    files
        .into_iter()
        .map(|f| crate::cdi::MountEdit {
            host_path: f.host_path.display().to_string(),
            container_path: f.container_path.clone(),
            kind: None,
            options: RO_BIND.iter().map(|s| s.to_string()).collect(),
        })
        .collect()
}

/// Directories (inside the container) holding mounted driver libraries, for the ldcache hook.
pub fn library_dirs<'a>(
    files: impl IntoIterator<Item = &'a crate::inventory::DriverFile>,
) -> Vec<String> {
    let mut dirs: Vec<String> = files
        .into_iter()
        .filter(|f| f.kind == crate::inventory::FileKind::Library)
        .filter_map(|f| {
            std::path::Path::new(&f.container_path)
                .parent()
                .map(|p| p.display().to_string())
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The createContainer hook that refreshes the container's ld cache for `folders`:
/// `gpufence hook update-ldcache --folder DIR…`, with an explicit env so it never inherits the
/// container's.
pub fn ldcache_hook(config: &crate::config::Config, folders: &[String]) -> crate::cdi::HookEdit {
    let mut args = vec!["gpufence".to_string()];
    if let Some(src) = &config.source {
        args.push("--config".to_string());
        args.push(src.display().to_string());
    }
    args.extend(["hook".to_string(), "update-ldcache".to_string()]);
    for f in folders {
        args.push("--folder".to_string());
        args.push(f.clone());
    }
    crate::cdi::HookEdit {
        hook_name: "createContainer".to_string(),
        path: config.gpufence_binary.display().to_string(),
        args,
        env: vec!["PATH=/usr/sbin:/usr/bin:/sbin:/bin".to_string()],
        timeout: Some(10),
    }
}
