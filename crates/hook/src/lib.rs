//! `gpufence hook …`: enforcement as an OCI hook (CRI-O / podman hooks.d).
//!
//! The runtime can no longer be asked to add devices or mounts, so the hook does it itself, in
//! the container's mount namespace and device cgroup, before the container process runs. Input
//! an image author controls (the rootfs, the env, annotations passed through) is treated as
//! hostile: every rootfs path is resolved inside the rootfs ([`safepath`]), host sources are
//! opened before joining the container's namespace ([`mounts`]), nothing of the container's env
//! or binaries is used, and any failure aborts the container's creation.

pub mod apply;
pub mod error;
pub mod inputs;
pub mod install;
pub mod limits;
pub mod state;

// The decision's and the node's modules under the crate's own paths (`crate::plan`, …).
use gpufence_core::{allocation, backend, cdi, child, config, exit, inventory, logging, plan};
use gpufence_node::state as node_state;
use gpufence_node::{cgroup, driverfolders, driverlimits, enter, hostfiles};

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;

use tracing::{error, info, warn};

use crate::exit::Exit;
pub use error::HookError;

/// Which OCI stage invoked the hook (both run in the runtime's namespace, before pivot_root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Prestart,
    CreateRuntime,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Prestart => "prestart",
            Stage::CreateRuntime => "createRuntime",
        }
    }
}

/// The hook entry: state JSON from `stdin`, enforcement, `Exit` on failure.
pub fn enforce(config: Option<&Path>, stage: Stage, stdin: &mut impl Read) -> Result<(), Exit> {
    // Nothing this process does needs more than HOST; drop the rest before reading input.
    crate::enter::caps::restrict(crate::enter::caps::HOST).map_err(|e| Exit::env(e.to_string()))?;
    let raw = state::read_oci_state(stdin).map_err(|e| Exit::invalid(e.to_string()))?;
    let st = state::parse_state(&raw).map_err(|e| Exit::invalid(e.to_string()))?;
    let cfg = crate::config::Config::load(config)?;
    crate::logging::init(&cfg);
    let id = st.id.clone();
    match enforce_state(&cfg, stage, &st) {
        Ok(()) => Ok(()),
        Err(e) => {
            use crate::node_state::refusals::{Reason, count};
            let reason = match &e {
                HookError::Allocation(_) | HookError::Plan(_) => Reason::Allocation,
                HookError::Inventory(_) => Reason::Inventory,
                HookError::Config(_) => Reason::Config,
                HookError::State(_) => Reason::Spec,
                _ => Reason::Host,
            };
            count(&cfg.state_dir, reason);
            error!(container = %id, stage = stage.name(), reason = reason.as_str(), error = %e, "refused: container creation aborted");
            Err(Exit::new(
                e.code(),
                format!("hook {}: container {id}: {e}", stage.name()),
            ))
        }
    }
}

fn enforce_state(
    cfg: &crate::config::Config,
    stage: Stage,
    st: &state::State,
) -> Result<(), HookError> {
    let id = st.id.as_str();
    let (spec, rootfs) = state::read_config(&st.bundle)?;
    let (plan, inventory_majors, request) = inputs::plan(cfg, &spec, id)?;
    if plan.grants_nothing() {
        info!(
            container = id,
            stage = stage.name(),
            notes = ?plan.notes,
            "no allocation: nothing granted"
        );
        return Ok(());
    }
    info!(
        container = id,
        stage = stage.name(),
        devices = plan.edits.device_nodes.len(),
        mounts = plan.edits.mounts.len(),
        memory_backends = ?plan
            .memory_backends
            .iter()
            .map(|b| format!("{}:{}", b.ordinal, b.backend.name()))
            .collect::<Vec<_>>(),
        mps = plan.mps.is_some(),
        "enforcing plan"
    );
    if applied_by_runtime(&spec, &cfg.container_state_dir(id)) {
        // gpufence-runtime already put the plan into config.json (both installed): applying it
        // twice would stack mounts. Skipping grants nothing the spec does not already hold.
        info!(
            container = id,
            "config.json already carries gpufence's edits (gpufence-runtime): nothing to do"
        );
        return Ok(());
    }
    apply::log_unapplied(&plan, id);
    let state_dir = plan.state_dir.as_ref().map(std::path::PathBuf::from);
    let created_state_dir = state_dir.as_ref().is_some_and(|d| !d.exists());
    let r = enforce_plan(cfg, st, &rootfs, &plan, &inventory_majors);
    if r.is_ok() {
        let pid = st.pid.and_then(|p| u32::try_from(p).ok());
        let locator = crate::node_state::meta::Locator {
            pid,
            ..Default::default()
        };
        crate::node_state::meta::record(&plan, &request.annotations, locator);
    }
    // Fail closed without leftovers: the state directory is ours (id validated, under
    // state-dir); remove_dir_all does not follow symlinks.
    if r.is_err()
        && created_state_dir
        && let Some(d) = &state_dir
        && d.starts_with(&cfg.state_dir)
        && d != &cfg.state_dir
        && let Err(e) = std::fs::remove_dir_all(d)
    {
        warn!(container = id, path = %d.display(), error = %e, "cleanup failed");
    }
    r
}

/// Whether `config.json` already mounts this container's quota (the runtime applied the plan).
/// The source must be `state_dir/quota` itself: an image `VOLUME /run/gpufence/quota` is a
/// mount at the same destination too.
fn applied_by_runtime(spec: &serde_json::Value, state_dir: &Path) -> bool {
    spec.get("mounts")
        .and_then(|m| m.as_array())
        .is_some_and(|m| {
            m.iter().any(|m| {
                m.get("destination").and_then(|d| d.as_str())
                    == Some(crate::plan::CONTAINER_QUOTA_FILE)
                    && m.get("source")
                        .and_then(|s| s.as_str())
                        .is_some_and(|s| Path::new(s) == state_dir.join("quota"))
            })
        })
}

fn enforce_plan(
    cfg: &crate::config::Config,
    st: &state::State,
    rootfs: &Path,
    plan: &crate::plan::Plan,
    inventory_majors: &[u32],
) -> Result<(), HookError> {
    let id = st.id.as_str();
    let pid = st.pid.unwrap_or_default();
    let mut nodes = apply::node_specs(plan)?;
    // The same state directory and host files as gpufence-runtime writes (same code): only
    // under state-dir, no symlink followed below it, atomic writes.
    crate::hostfiles::write_host_files(cfg, id, plan).map_err(|e| HookError::HostFiles {
        code: e.code(),
        message: e.to_string(),
    })?;
    let mut mounts = apply::detach_mounts(plan)?;
    let ldcache = ldcache_run(plan)?;
    let userns_root = userns_root(pid)?;
    if let Some((uid, gid)) = userns_root {
        info!(
            container = id,
            uid, gid, "user-namespaced container: device nodes bind-mounted from the host"
        );
        let mut dev = apply::nodes_as_mounts(plan)?;
        dev.append(&mut mounts);
        mounts = dev;
        nodes.clear();
    }

    // The container's mount namespace must be another one than ours: mounting "into the
    // container" in the host's namespace would change the host.
    let ns = open_ns(pid)?;
    let own = nix::sys::stat::stat("/proc/self/ns/mnt").map_err(|errno| HookError::Host {
        path: "/proc/self/ns/mnt".into(),
        op: "stat",
        errno,
    })?;
    let theirs = nix::sys::stat::fstat(&ns).map_err(|errno| HookError::Host {
        path: format!("/proc/{pid}/ns/mnt"),
        op: "stat",
        errno,
    })?;
    if (own.st_dev, own.st_ino) == (theirs.st_dev, theirs.st_ino) {
        return Err(HookError::Namespace {
            code: 2,
            message: "the container shares the host's mount namespace: refusing to mount".into(),
        });
    }

    // Device cgroup.
    let read = |p: String| {
        std::fs::read_to_string(&p).map_err(|e| HookError::Host {
            path: p.clone(),
            op: "read",
            errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })
    };
    let cg = crate::cgroup::locate(
        &read(format!("/proc/{pid}/cgroup"))?,
        &read("/proc/self/mountinfo".into())?,
    )?;
    if let Some(v1) = &cg.v1 {
        crate::cgroup::allow_v1(v1, &plan.cgroup_rules)?;
        info!(container = id, cgroup = %v1.display(), rules = ?plan.cgroup_rules.iter().map(|r| r.to_string()).collect::<Vec<_>>(), "v1 device rules allowed");
    }
    if let Some(v2) = &cg.v2 {
        let proc_devices = read("/proc/devices".into()).unwrap_or_default();
        let extra = inventory_majors
            .iter()
            .copied()
            .chain(plan.cgroup_rules.iter().map(|r| r.major));
        let majors = crate::cgroup::gated_majors(&proc_devices, extra);
        let widened = crate::cgroup::gate_v2(v2, &plan.cgroup_rules, &majors)?;
        info!(container = id, cgroup = %v2.display(), gated_majors = ?majors, runtime_programs_widened = widened, "v2 device gate attached");
    }
    if !plan.driver_limits.is_empty() {
        let (spec, _) = state::read_config(&st.bundle)?;
        let ns = crate::driverlimits::container_namespace(pid, &spec, id)
            .map_err(|e| HookError::Plan(e.to_string()))?;
        driver_limits_in_child(cfg, id, &ns.display().to_string(), &plan.driver_limits)?;
    }
    crate::enter::caps::restrict(crate::enter::caps::IN_NAMESPACE)?;
    let prepared = apply::Prepared {
        nodes,
        mounts,
        ldcache,
        userns_root,
    };
    apply::apply_in_namespace(
        apply::Namespace::Join(ns),
        rootfs,
        prepared,
        id,
        cfg.timeouts.worker(),
    )?;
    info!(container = id, "hook enforcement complete");
    Ok(())
}

/// Set the driver's memory limits through NVML in a forked child under the worker deadline:
/// NVML may start threads (and a driver may hang), and the hook forks its namespace worker
/// afterwards, which needs a single-threaded process.
fn driver_limits_in_child(
    cfg: &crate::config::Config,
    id: &str,
    namespace: &str,
    limits: &[crate::backend::DriverLimit],
) -> Result<(), HookError> {
    let f = crate::child::fork_with_deadline("driver limits", cfg.timeouts.worker(), |out| {
        let r = crate::inventory::limits::nvml::Nvml::open(&cfg.nvml_library)
            .map_err(|e| e.to_string())
            .and_then(|mut lib| {
                crate::driverlimits::apply(cfg, id, namespace, limits, &mut lib)
                    .map_err(|e| e.to_string())
            });
        match r {
            Ok(_) => 0,
            Err(e) => {
                let _ = std::io::Write::write_all(out, e.as_bytes());
                1
            }
        }
    })
    .map_err(|e| HookError::Plan(e.to_string()))?;
    f.verdict("driver limits worker")
        .map_err(|(_, message)| HookError::Plan(message))
}

/// Host uid/gid of the container's root when the container has its own user namespace.
fn userns_root(pid: i64) -> Result<Option<(u32, u32)>, HookError> {
    crate::enter::userns::root_of(pid).map_err(|e| match e {
        crate::enter::userns::UsernsError::Host { path, op, errno } => {
            HookError::Host { path, op, errno }
        }
        e @ crate::enter::userns::UsernsError::Unmapped(_) => HookError::Namespace {
            code: 1,
            message: e.to_string(),
        },
    })
}

fn open_ns(pid: i64) -> Result<OwnedFd, HookError> {
    let p = format!("/proc/{pid}/ns/mnt");
    nix::fcntl::open(
        p.as_str(),
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|errno| HookError::Host {
        path: p,
        op: "open",
        errno,
    })
}

/// The plan's ld cache refresh ([`crate::plan::LdCache`]), or a foreign CDI spec's
/// `update-ldcache` hook: the hook cannot add hooks to the container, so it refreshes the cache
/// itself, in the container's mount namespace, after mounting.
pub(crate) fn ldcache_run(
    plan: &crate::plan::Plan,
) -> Result<Option<apply::LdcacheRun>, HookError> {
    let folders = match plan.layout_ld_cache() {
        Some(l) => Some(l.folders.clone()),
        None => plan
            .edits
            .hooks
            .iter()
            .find_map(crate::plan::ldcache_hook_folders),
    };
    let links = plan
        .driver_folders
        .as_ref()
        .map(|f| f.folding.binary_links())
        .unwrap_or_default();
    Ok(folders.map(|folders| apply::LdcacheRun { folders, links }))
}

/// `gpufence hook poststop`: remove the container's state directory.
pub fn poststop(config: Option<&Path>, stdin: &mut impl Read) -> Result<(), Exit> {
    let raw = state::read_oci_state(stdin).map_err(|e| Exit::invalid(e.to_string()))?;
    #[derive(serde::Deserialize)]
    struct Min {
        id: String,
    }
    let m: Min = serde_json::from_slice(&raw)
        .map_err(|e| Exit::invalid(format!("OCI state on stdin: invalid JSON: {e}")))?;
    if !state::valid_id(&m.id) {
        return Err(Exit::invalid("OCI state on stdin: invalid container id"));
    }
    let cfg = crate::config::Config::load(config)?;
    crate::logging::init(&cfg);
    crate::driverlimits::clear_at_exit(&cfg, &m.id);
    let d = cfg.container_state_dir(&m.id);
    match std::fs::remove_dir_all(&d) {
        Ok(()) => {
            info!(container = %m.id, path = %d.display(), "state directory removed");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Exit::env(format!(
            "hook poststop: container {}: removing {}: {e}",
            m.id,
            d.display()
        ))),
    }
}
