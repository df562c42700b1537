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
/// The shared accounting region inside the container state directory (the shim's
/// `region::FILE_NAME`). The host creates it empty and world-read-writable (0666) beside the
/// quota, so every process of the container, whatever its uid or user namespace, can map it while
/// the directory itself stays root-owned 0755 (a container user cannot create files on the host).
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
///
/// Deterministic: the same inputs always give the same plan (the runtime and the hook rely on
/// it). The JSON shape is documented in `docs/plan-json.md`.
pub fn plan(
    spec: &serde_json::Value,
    container_id: &str,
    inventory: &crate::inventory::Inventory,
    config: &crate::config::Config,
    cdi_specs: &[crate::cdi::LoadedSpec],
) -> Result<Plan, crate::allocation::AllocationError> {
    use crate::allocation::{AllocationError, DeviceRef};
    use crate::inventory::{Capability, DeviceNode};

    validate_container_id(container_id)?;
    let intake = crate::allocation::read(spec, inventory, config, cdi_specs)?;
    let mut plan = Plan {
        container_id: container_id.to_string(),
        env_overrides: intake.env_overrides,
        notes: intake.notes,
        ..Plan::default()
    };
    let Some(alloc) = intake.allocation else {
        return Ok(plan);
    };
    let mut edits = crate::cdi::ContainerEdits::default();

    if !alloc.devices.is_empty() {
        // Device nodes: each allocated GPU (a MIG device's parent GPU and its nvidia-caps nodes),
        // then the control nodes.
        fn push<'a>(n: &'a DeviceNode, nodes: &mut Vec<&'a DeviceNode>) {
            if !nodes.iter().any(|x| x.path == n.path) {
                nodes.push(n);
            }
        }
        let mut nodes: Vec<&DeviceNode> = Vec::new();
        for d in &alloc.devices {
            let missing = || {
                AllocationError::new(
                    "inventory",
                    &d.uuid,
                    "allocated device is not in the inventory",
                )
            };
            match d.device {
                DeviceRef::Gpu { index } => {
                    let g = inventory.gpu_by_index(index).ok_or_else(missing)?;
                    push(&g.node, &mut nodes);
                }
                DeviceRef::Mig { gpu, mig } => {
                    let g = inventory.gpu_by_index(gpu).ok_or_else(missing)?;
                    let m = g
                        .mig_devices
                        .iter()
                        .find(|m| m.index == mig)
                        .ok_or_else(missing)?;
                    push(&g.node, &mut nodes);
                    for c in &m.caps {
                        push(c, &mut nodes);
                    }
                }
            }
        }
        let display = alloc
            .capabilities
            .iter()
            .any(|c| matches!(c, Capability::Graphics | Capability::Display));
        let mut control: Vec<&DeviceNode> = inventory
            .control_nodes
            .iter()
            .filter(|n| {
                let name = std::path::Path::new(&n.path)
                    .file_name()
                    .and_then(|f| f.to_str())
                    .unwrap_or_default();
                matches!(name, "nvidiactl" | "nvidia-uvm" | "nvidia-uvm-tools")
                    || (display && name == "nvidia-modeset")
            })
            .collect();
        control.sort_by(|a, b| a.path.cmp(&b.path));
        for n in control {
            if !nodes.iter().any(|x| x.path == n.path) {
                nodes.push(n);
            }
        }
        edits.device_nodes = nodes.iter().map(|n| device_node_edit(n)).collect();

        // Mounts: driver files, the shim, ld.so.preload, the state directory, the quota.
        let mut files: Vec<&crate::inventory::DriverFile> =
            inventory.files_for(&alloc.capabilities).collect();
        files.sort_by(|a, b| a.container_path.cmp(&b.container_path));
        files.dedup_by(|a, b| a.container_path == b.container_path);
        edits.mounts = driver_mounts(files.iter().copied());
        edits.mounts.push(crate::cdi::MountEdit {
            host_path: config.shim.library.display().to_string(),
            container_path: CONTAINER_SHIM_PATH.to_string(),
            kind: None,
            options: RO_BIND.iter().map(|s| s.to_string()).collect(),
        });
        if container_id.starts_with('.')
            || [LD_SO_PRELOAD_FILE, crate::inventory::CACHE_FILE].contains(&container_id)
        {
            // state-dir/<id> would collide with a node-wide file (or a temp file) in state-dir.
            return Err(AllocationError::new(
                "container id",
                container_id,
                "reserved in state-dir for a node-wide file; a GPU container cannot use it",
            ));
        }
        let state_dir = config.container_state_dir(container_id);
        let state_dir_s = state_dir.display().to_string();
        let quota_host = state_dir.join("quota").display().to_string();
        let preload_host = config
            .state_dir
            .join(LD_SO_PRELOAD_FILE)
            .display()
            .to_string();
        let ld_so_preload = config.shim.inject == crate::config::ShimInject::LdSoPreload;
        if ld_so_preload {
            edits.mounts.push(crate::cdi::MountEdit {
                host_path: preload_host.clone(),
                container_path: "/etc/ld.so.preload".to_string(),
                kind: None,
                options: RO_BIND.iter().map(|s| s.to_string()).collect(),
            });
        }
        edits.mounts.push(crate::cdi::MountEdit {
            host_path: state_dir_s.clone(),
            container_path: CONTAINER_STATE_DIR.to_string(),
            kind: None,
            options: ["rw", "nosuid", "nodev", "noexec", "bind"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        });
        edits.mounts.push(crate::cdi::MountEdit {
            host_path: quota_host.clone(),
            container_path: CONTAINER_QUOTA_FILE.to_string(),
            kind: None,
            options: ["ro", "nosuid", "nodev", "noexec", "bind"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        });

        // Hooks: refresh the ld cache for the mounted driver libraries.
        let dirs = library_dirs(files.iter().copied());
        if !dirs.is_empty() {
            edits.hooks.push(ldcache_hook(config, &dirs));
        }

        // Env.
        let uuids: Vec<&str> = alloc.devices.iter().map(|d| d.uuid.as_str()).collect();
        edits
            .env
            .push(format!("NVIDIA_VISIBLE_DEVICES={}", uuids.join(",")));
        edits
            .env
            .push(format!("GPUFENCE_STATE={CONTAINER_STATE_DIR}"));
        for (i, d) in alloc.devices.iter().enumerate() {
            if let Some(m) = d.memory_limit {
                edits.env.push(format!("GPUFENCE_MEMORY_LIMIT_{i}={m}"));
            }
            if let Some(c) = d.cores {
                edits.env.push(format!("GPUFENCE_CORES_{i}={c}"));
            }
        }
        if alloc.oversubscribe {
            edits.env.push("GPUFENCE_OVERSUBSCRIBE=1".to_string());
        }
        if config.shim.inject == crate::config::ShimInject::Env {
            let existing = existing_env(spec, "LD_PRELOAD").filter(|v| !v.trim().is_empty());
            let value = match existing {
                Some(v) if v.split([':', ' ']).any(|p| p == CONTAINER_SHIM_PATH) => v,
                Some(v) => format!("{CONTAINER_SHIM_PATH}:{v}"),
                None => CONTAINER_SHIM_PATH.to_string(),
            };
            edits.env.push(format!("LD_PRELOAD={value}"));
        }
        if config.shim.is_hami_core() {
            for (i, d) in alloc.devices.iter().enumerate() {
                if let Some(m) = d.memory_limit {
                    let v = if m % (1 << 20) == 0 {
                        format!("{}m", m >> 20)
                    } else {
                        m.to_string()
                    };
                    edits.env.push(format!("CUDA_DEVICE_MEMORY_LIMIT_{i}={v}"));
                }
            }
            let first = alloc.devices[0].cores;
            if first.is_some() && alloc.devices.iter().all(|d| d.cores == first) {
                edits
                    .env
                    .push(format!("CUDA_DEVICE_SM_LIMIT={}", first.unwrap_or(100)));
            }
            for (i, d) in alloc.devices.iter().enumerate() {
                if let Some(c) = d.cores {
                    edits.env.push(format!("CUDA_DEVICE_SM_LIMIT_{i}={c}"));
                }
            }
            edits.env.push(format!(
                "CUDA_DEVICE_MEMORY_SHARED_CACHE={CONTAINER_STATE_DIR}/{HAMI_CACHE_FILE}"
            ));
        }

        // The quota and the files the apply step writes.
        let quota = crate::quota::Quota {
            oversubscribe: alloc.oversubscribe,
            devices: alloc
                .devices
                .iter()
                .enumerate()
                .map(|(i, d)| crate::quota::DeviceQuota {
                    ordinal: i as u32,
                    uuid: d.uuid.clone(),
                    memory: d.memory_limit,
                    cores: d.cores,
                })
                .collect(),
            quiet_refusals: !config.shim.refusal_messages,
        };
        plan.host_files.push(HostFile {
            path: quota_host,
            contents: quota.render(),
            mode: 0o444,
        });
        if ld_so_preload {
            plan.host_files.push(HostFile {
                path: preload_host,
                contents: format!("{CONTAINER_SHIM_PATH}\n"),
                mode: 0o444,
            });
        }
        plan.quota = Some(quota);
        plan.state_dir = Some(state_dir_s);
    }

    // Foreign CDI devices: their edits, faithfully, after ours; they may not touch what
    // enforces the quota.
    for f in &alloc.foreign_cdi {
        check_foreign(f)?;
        edits.append(&f.edits);
    }

    // cgroup rules: one per device node.
    for d in &edits.device_nodes {
        let kind = match d.kind.as_deref() {
            Some("c") | Some("u") => 'c',
            Some("b") => 'b',
            Some("p") => continue,
            _ => {
                return Err(AllocationError::new(
                    "deviceNodes",
                    &d.path,
                    "device node has no type (c or b), and none was found on the host",
                ));
            }
        };
        if d.permissions.as_deref() == Some("none") {
            continue;
        }
        let (Some(major), Some(minor)) = (d.major, d.minor) else {
            return Err(AllocationError::new(
                "deviceNodes",
                &d.path,
                "device node has no major/minor, and none was found on the host",
            ));
        };
        let (Ok(major), Ok(minor)) = (u32::try_from(major), u32::try_from(minor)) else {
            return Err(AllocationError::new(
                "deviceNodes",
                &d.path,
                "major/minor out of range",
            ));
        };
        let access = match d.permissions.as_deref() {
            None | Some("") => "rwm".to_string(),
            Some(p) => p.to_string(),
        };
        let rule = CgroupRule {
            kind,
            major,
            minor,
            access,
        };
        if !plan.cgroup_rules.contains(&rule) {
            plan.cgroup_rules.push(rule);
        }
    }

    // Env the plan sets need no override.
    let set_keys: Vec<&str> = edits
        .env
        .iter()
        .filter_map(|e| e.split_once('=').map(|(k, _)| k))
        .collect();
    plan.env_overrides.retain(|o| {
        let k = o.split_once('=').map(|(k, _)| k).unwrap_or(o);
        !set_keys.contains(&k)
    });
    plan.edits = edits;
    plan.allocation = Some(alloc);
    Ok(plan)
}

/// Node-wide generated `ld.so.preload` (under `state-dir`), naming the container's shim path.
pub const LD_SO_PRELOAD_FILE: &str = "ld.so.preload";
/// HAMi-core's shared accounting region, inside the state directory (compatibility mode).
pub const HAMI_CACHE_FILE: &str = "vgpu.cache";

/// The container id becomes a host path component: runc's rule (`^[\w+-\.]+$`, i.e. letters,
/// digits, `_ + , - .`), not `.` or `..`, at most 255 bytes.
pub fn validate_container_id(id: &str) -> Result<(), crate::allocation::AllocationError> {
    let err = |why: &str| crate::allocation::AllocationError::new("container id", id, why);
    if id.is_empty() {
        return Err(err("empty"));
    }
    if id == "." || id == ".." {
        return Err(err("not a valid path component"));
    }
    if id.len() > 255 {
        return Err(err("longer than 255 bytes"));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b',' | b'-' | b'.'))
    {
        return Err(err("only letters, digits and _ + , - . are allowed"));
    }
    Ok(())
}

fn existing_env(spec: &serde_json::Value, key: &str) -> Option<String> {
    spec.get("process")?
        .get("env")?
        .as_array()?
        .iter()
        .filter_map(|e| e.as_str())
        .find_map(|e| {
            e.split_once('=')
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string())
        })
}

/// Foreign edits may not replace what enforces the quota: the state directory, the quota file,
/// the shim, `/etc/ld.so.preload`, `LD_PRELOAD` or `GPUFENCE_*` env. Paths are checked again
/// (specs can be built without the loader).
fn check_foreign(
    f: &crate::allocation::ForeignCdiDevice,
) -> Result<(), crate::allocation::AllocationError> {
    let err = |why: String| crate::allocation::AllocationError::new(&f.spec_path, &f.name, why);
    crate::cdi::parse::validate_edits(&f.edits).map_err(err)?;
    let reserved = |p: &str| {
        let p = p.trim_end_matches('/');
        p == CONTAINER_STATE_DIR
            || p.starts_with(&format!("{CONTAINER_STATE_DIR}/"))
            || p == CONTAINER_SHIM_PATH
            || p == "/etc/ld.so.preload"
            || p.is_empty()
    };
    for m in &f.edits.mounts {
        if reserved(&m.container_path) {
            return Err(err(format!(
                "mount over {} is reserved for gpufence",
                m.container_path
            )));
        }
    }
    for d in &f.edits.device_nodes {
        if reserved(&d.path) {
            return Err(err(format!(
                "device node at {} is reserved for gpufence",
                d.path
            )));
        }
    }
    for e in &f.edits.env {
        let k = e.split_once('=').map(|(k, _)| k).unwrap_or(e);
        if k == "LD_PRELOAD" || k.starts_with("GPUFENCE_") {
            return Err(err(format!("env {k} is reserved for gpufence")));
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{DeviceNode, Gpu, Inventory};

    fn inv() -> Inventory {
        let node = |p: &str, minor| DeviceNode {
            path: p.to_string(),
            host_path: p.into(),
            kind: 'c',
            major: 195,
            minor,
        };
        Inventory {
            driver_version: "580.65.06".into(),
            cuda_driver_version: 12080,
            gpus: vec![Gpu {
                index: 0,
                minor: 0,
                uuid: "GPU-a".into(),
                name: "x".into(),
                memory_bytes: 1 << 34,
                pci_bus_id: "00000000:01:00.0".into(),
                compute_capability: (9, 0),
                mig_enabled: false,
                mig_capable: false,
                mig_devices: vec![],
                node: node("/dev/nvidia0", 0),
            }],
            control_nodes: vec![node("/dev/nvidiactl", 255)],
            driver_files: vec![],
        }
    }

    #[test]
    fn container_ids() {
        for ok in ["a", "A-b_c.d+e,f", "0"] {
            assert!(validate_container_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "ä", "a\0b"] {
            let e = validate_container_id(bad).unwrap_err();
            assert_eq!(e.key, "container id");
        }
    }

    #[test]
    fn no_allocation_no_driver_files_no_shim() {
        let spec = serde_json::json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}});
        let p = plan(&spec, "c", &inv(), &crate::config::Config::default(), &[]).unwrap();
        assert!(p.grants_nothing());
        assert!(p.edits.is_empty() && p.host_files.is_empty() && p.state_dir.is_none());
        assert_eq!(p.env_overrides, ["NVIDIA_VISIBLE_DEVICES=void"]);
    }

    #[test]
    fn allocation_with_no_driver_libraries_has_no_ldcache_hook() {
        let spec = serde_json::json!({"annotations": {"gpufence.dev/devices": "0"},
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}});
        let p = plan(&spec, "c", &inv(), &crate::config::Config::default(), &[]).unwrap();
        assert!(p.edits.hooks.is_empty());
        assert_eq!(p.cgroup_rules.len(), 2);
        assert!(p.env_overrides.is_empty());
        assert!(
            p.notes[0].contains("replaced by the allocated devices"),
            "{:?}",
            p.notes
        );
        assert!(
            p.edits
                .env
                .contains(&"NVIDIA_VISIBLE_DEVICES=GPU-a".to_string())
        );
    }
}
