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
