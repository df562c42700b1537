//! The plan: container edits, a pure function of (config.json, inventory, config, CDI specs).
//!
//! One plan feeds every output: the runtime applies it to `config.json`, the hook applies it in
//! the container's namespaces, `gpufence plan` prints it. Its JSON form (`gpufence plan --json`)
//! is a stable interface documented in docs/plan-json.md.

use crate::allocation::input::Inputs;

pub mod cgroup;
pub mod env;
pub mod folders;
pub mod intake;
mod log;
pub mod mounts;
pub mod nodes;
pub mod quota;
pub mod types;

pub use log::log_decision;
pub use mounts::{driver_mounts, state_tmpfs};
pub use nodes::device_node_edit;
pub use types::{
    ACCOUNTING_FILE, CONTAINER_QUOTA_FILE, CONTAINER_SHIM_PATH, CONTAINER_STATE_DIR, CgroupRule,
    HAMI_CACHE_FILE, HostFile, LD_FACTS_FILE, LD_SO_PRELOAD_FILE, LdCache, Plan, RO_BIND,
    RW_STATE_BIND, SHIM_ISOLATION, STATE_TMPFS_SIZE, STATE_TMPFS_SIZE_HAMI,
};

/// Compute the plan for one container. Pure: no I/O. `spec` is the parsed `config.json`;
/// `inventory` must already carry device numbers read from `dev-root` at this moment;
/// `cdi_specs` are the specs found in `/etc/cdi` and `/var/run/cdi`.
///
/// Deterministic: the same inputs always give the same plan (the runtime and the hook rely on
/// it). The JSON shape is documented in `docs/plan-json.md`. The steps, in order: the
/// allocation ([`crate::allocation::read_request`]), device [`nodes`], [`mounts`] (driver files, shim,
/// state), the ld cache refresh, [`env`], the [`quota`] and host files, foreign CDI edits, and the
/// cgroup rules for every device node ([`cgroup`]).
pub fn plan(
    spec: &serde_json::Value,
    container_id: &str,
    inventory: &crate::inventory::Inventory,
    config: &crate::config::Config,
    cdi_specs: &[crate::cdi::LoadedSpec],
) -> Result<Plan, crate::allocation::AllocationError> {
    let none = crate::kubelet::KubeletSource::Absent;
    plan_with(spec, container_id, inventory, config, cdi_specs, &none)
}

/// [`plan_request`] for a bare `config.json`: parses it ([`Inputs::from_spec`]) and plans.
pub fn plan_with(
    spec: &serde_json::Value,
    container_id: &str,
    inventory: &crate::inventory::Inventory,
    config: &crate::config::Config,
    cdi_specs: &[crate::cdi::LoadedSpec],
    kubelet: &crate::kubelet::KubeletSource,
) -> Result<Plan, crate::allocation::AllocationError> {
    let request = Inputs::from_spec(spec)?;
    plan_request(
        &request,
        container_id,
        inventory,
        config,
        cdi_specs,
        kubelet,
    )
}

/// The plan for one parsed request, with what kubelet recorded for the container
/// ([`crate::allocation::record::load`]). Pure.
pub fn plan_request(
    request: &Inputs,
    container_id: &str,
    inventory: &crate::inventory::Inventory,
    config: &crate::config::Config,
    cdi_specs: &[crate::cdi::LoadedSpec],
    kubelet: &crate::kubelet::KubeletSource,
) -> Result<Plan, crate::allocation::AllocationError> {
    validate_container_id(container_id)?;
    let intake = crate::allocation::read_request(request, inventory, config, cdi_specs, kubelet)?;
    let mut plan = Plan {
        container_id: container_id.to_string(),
        env_overrides: intake.env_overrides,
        notes: intake.notes,
        neutralised: intake.neutralised,
        kubelet: intake.kubelet,
        ..Plan::default()
    };
    let Some(alloc) = intake.allocation else {
        return Ok(plan);
    };
    let mut edits = crate::cdi::ContainerEdits::default();

    if !alloc.devices.is_empty() {
        edits.device_nodes = nodes::device_nodes(&alloc, inventory)?;
        let files = nodes::driver_files(&alloc, inventory);
        let state = mounts::StatePaths::new(config, container_id)?;
        edits.mounts = mounts::mounts(&files, config, &state);
        let dirs = library_dirs(files.iter().copied());
        if !dirs.is_empty() {
            plan.ld_cache = Some(LdCache { folders: dirs });
        }
        edits.env = env::env(request, &alloc, config);
        let mut q = quota::quota(&alloc, config);
        // Memory backends (shim, driver, both) and MPS: their own modules, pure.
        let backends = crate::backend::decide(&alloc, inventory, config)?;
        crate::backend::shim_quota(&mut q, &backends);
        plan.driver_limits = crate::backend::driver_limits(&alloc, &backends);
        if !plan.driver_limits.is_empty() {
            edits
                .hooks
                .push(crate::backend::limits_hook(config, &plan.driver_limits));
        }
        let driver = backends.iter().any(|b| b.backend.uses_driver());
        plan.memory_backends = backends;
        if let Some(m) = crate::mps::plan(request, &alloc, inventory, config)? {
            let (mounts, env) = crate::mps::edits(&m);
            edits.mounts.extend(mounts);
            edits.env.extend(env);
            plan.mps = Some(m);
        }
        plan.host_files = quota::host_files(&q, &state);
        plan.quota = Some(q);
        plan.isolation = Some(
            if driver {
                crate::backend::DRIVER_ISOLATION
            } else {
                SHIM_ISOLATION
            }
            .to_string(),
        );
        plan.state_dir = Some(state.dir);
    }

    // Foreign CDI devices: their edits, faithfully, after ours; they may not touch what
    // enforces the quota.
    for f in &alloc.foreign_cdi {
        check_foreign(f)?;
        edits.append(&f.edits);
    }
    plan.cgroup_rules = cgroup::rules(&edits.device_nodes)?;

    // What enforces the quota (the state tmpfs and its quota, the shim, ld.so.preload) last, so
    // no other mount can land on it — an image symlink can turn a driver mount's target into
    // `/etc` or `/etc/ld.so.preload`, and runc follows it inside the rootfs; parent-first within
    // each group, so a directory mount never hides one below it (the quota under the state
    // tmpfs); stable, so equal depths keep their order.
    // (Keys computed once per mount: a stable sort compares each many times.)
    edits
        .mounts
        .sort_by_cached_key(|m| mount_order(&m.container_path));

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

/// The container id becomes a host path component: [`crate::text::container_id_problem`].
pub fn validate_container_id(id: &str) -> Result<(), crate::allocation::AllocationError> {
    match crate::text::container_id_problem(id) {
        None => Ok(()),
        Some(why) => Err(crate::allocation::AllocationError::new(
            "container id",
            id,
            why,
        )),
    }
}

/// Foreign edits may not replace what enforces the quota: the state directory, the quota file,
/// the shim, `/etc/ld.so.preload`, `LD_PRELOAD` or `GPUFENCE_*` env. Paths are checked again
/// (specs can be built without the loader).
fn check_foreign(
    f: &crate::allocation::ForeignCdiDevice,
) -> Result<(), crate::allocation::AllocationError> {
    let err = |why: String| crate::allocation::AllocationError::new(&f.spec_path, &f.name, why);
    crate::cdi::parse::validate_edits(&f.edits).map_err(err)?;
    let reserved = |p: &str| is_reserved_destination(p) || p.trim_end_matches('/').is_empty();
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

/// Whether a container path is gpufence's to mount: the state directory and anything below it,
/// the shim, `/etc/ld.so.preload` (and anything below those two). Any other mount there (an
/// image `VOLUME /run/gpufence/quota`, a foreign CDI edit) is dropped or refused, never
/// combined with ours. Lexical: `//`, `.` and a trailing `/` do not change the answer; `..`
/// goes up, never above `/` (as runc resolves a destination inside the rootfs).
pub fn is_reserved_destination(p: &str) -> bool {
    let mut norm: Vec<&str> = Vec::with_capacity(8);
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                norm.pop();
            }
            c => norm.push(c),
        }
    }
    [
        CONTAINER_STATE_DIR,
        CONTAINER_SHIM_PATH,
        "/etc/ld.so.preload",
    ]
    .iter()
    .any(|r| {
        // `norm` starts with every component of `r`.
        let mut have = norm.iter();
        r.split('/')
            .filter(|c| !c.is_empty())
            .all(|c| have.next() == Some(&c))
    })
}

/// The order mounts are made in, by container path: everything else, then what enforces the
/// quota ([`is_reserved_destination`]) — so no other mount, redirected by an image symlink, can
/// land on it —, parent-first (by depth) within each group. Used by the plan and by hook mode,
/// which attaches the mounts itself.
pub fn mount_order(container_path: &str) -> (bool, usize) {
    (
        is_reserved_destination(container_path),
        mount_depth(container_path),
    )
}

/// Number of path components of a container path (`/run/gpufence` = 2).
fn mount_depth(p: &str) -> usize {
    p.split('/').filter(|c| !c.is_empty() && *c != ".").count()
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

/// Directories (inside the container) holding mounted driver libraries, for the ld cache refresh.
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

/// The createContainer hook that refreshes the container's ld cache for `folders` (how an
/// applier that lets the runtime run hooks renders [`LdCache`]):
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

/// The folders of a `… hook update-ldcache --folder DIR…` createContainer hook (the inverse of
/// [`ldcache_hook`]); `None` for any other hook or one without folders.
pub fn ldcache_hook_folders(h: &crate::cdi::HookEdit) -> Option<Vec<String>> {
    if h.hook_name != "createContainer" || !h.args.iter().any(|a| a == "update-ldcache") {
        return None;
    }
    let folders: Vec<String> = h
        .args
        .windows(2)
        .filter(|w| w[0] == "--folder")
        .map(|w| w[1].clone())
        .collect();
    (!folders.is_empty()).then_some(folders)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::inv;

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
