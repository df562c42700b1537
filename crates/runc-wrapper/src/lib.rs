//! `gpufence-runtime`: the runc wrapper, and `gpufence runtime configure`.
//!
//! Pipeline on `create`/`run`: argv (pure, [`args`]) → config + cached inventory (device numbers
//! re-read from `dev-root`) + CDI specs → [`crate::plan::plan`] (pure) → [`apply_to_spec`] (pure)
//! → ld cache refresh in a private mount namespace ([`ldcache`], instead of runc running the
//! plan's createContainer hook) → host files (state dir, quota, generated ld.so.preload) → atomic `config.json` write → `exec`
//! of the real runtime with the original argv. Every other subcommand is exec'd straight through by
//! [`passthrough`] before anything else runs (no configuration read while its record of which
//! runtime the configuration names is fresh); `delete` also removes the container's state
//! directory once the real runtime has let go of the container.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::config::Config;
use crate::exit::Exit;
use crate::plan::intake::{CdiSource, IntakeError};
use crate::real_runtime::real_runtime;
use crate::state::refusals::Reason;

pub mod apply;
pub mod args;
pub mod fileid;
pub mod ldcache;
pub mod ldfacts;
pub mod passthrough;
pub mod phases;
pub mod runclog;

// The decision's and the node's modules under the crate's own paths (`crate::plan`, …).
use gpufence_core::{
    allocation, cdi, config, exit, fnv, fsutil, inventory, logging, plan, real_runtime, text,
};
use gpufence_node::{driverfolders, enter, hostfiles, state};

pub use apply::{ApplyError, apply_to_spec};

/// Entry point of `gpufence-runtime` (argv including argv[0]).
pub fn main(argv: Vec<OsString>) -> Result<(), Exit> {
    let rest: &[OsString] = argv.get(1..).unwrap_or(&[]);
    let parsed = args::parse(rest);
    if parsed.is_create() {
        return create(&parsed, rest);
    }

    // Pass-through (without a fresh record) and `delete`: the configuration only names the
    // real runtime and the state directory. A broken configuration must not stop containers
    // from being listed, killed or deleted. The file's identity is taken before it is read, for
    // the pass-through record (passthrough.rs; the create path does not write one).
    let source = passthrough::ConfigSource::from_env();
    let identity = passthrough::config_identity(&source);
    let (cfg, loaded) = match Config::load(None) {
        Ok(cfg) => (cfg, true),
        Err(e) => {
            eprintln!(
                "gpufence-runtime: {e}; using defaults for {:?}",
                parsed.subcommand
            );
            (Config::default(), false)
        }
    };
    let rt = real_runtime(&cfg)?;
    if let (true, Some(id)) = (loaded, &identity) {
        let dir = Path::new(passthrough::CACHE_DIR);
        // Best effort: without a record the next pass-through call takes this path again. Not
        // said when the directory is not this user's to write (a rootless engine).
        match passthrough::store(dir, &source, id, &cfg) {
            Err(e) if e.kind() != std::io::ErrorKind::PermissionDenied => {
                eprintln!("gpufence-runtime: {}: {e}", dir.display())
            }
            _ => {}
        }
    }
    if parsed.is_delete() {
        return delete(&parsed, &cfg, &rt, rest);
    }
    Err(exec(&rt, rest))
}

/// `create`/`run`: plan, edit the bundle, then exec the real runtime.
fn create(parsed: &args::RuncArgs, rest: &[OsString]) -> Result<(), Exit> {
    let mut phases = phases::Phases::start();
    let cfg = match Config::load(None) {
        Ok(c) => c,
        Err(e) => {
            let e = Exit::invalid(e).because(Reason::Config);
            return Err(report(parsed, &Config::default(), e));
        }
    };
    // What the create path built (the parsed and edited spec, the intake) stays alive
    // until the exec replaces the process: freeing it is work nobody needs.
    let _prepared = match prepare_create(parsed, &cfg, &mut phases) {
        Ok(p) => p,
        Err(e) => return Err(report(parsed, &cfg, e)),
    };
    let rt = real_runtime(&cfg).map_err(|e| report(parsed, &cfg, e))?;
    if let Some(p) = &phases {
        p.write(parsed.container_id.as_deref().unwrap_or(""), &cfg.state_dir);
    }
    Err(exec(&rt, rest))
}

/// The error goes to runc's `--log` file too (in runc's format), where containerd looks for the
/// reason a create failed. The binary's `finish` prints it on stderr. Counted by reason.
fn report(parsed: &args::RuncArgs, cfg: &Config, e: Exit) -> Exit {
    if let Some(log) = &parsed.log {
        let msg = format!("gpufence-runtime: {}", e.message);
        if let Err(io) = runclog::append_error(log, &msg, parsed.log_is_json()) {
            eprintln!("gpufence-runtime: cannot write {}: {io}", log.display());
        }
    }
    let reason = e.reason.unwrap_or(if e.code == 1 {
        Reason::Spec
    } else {
        Reason::Host
    });
    crate::state::refusals::count(&cfg.state_dir, reason);
    tracing::error!(container = parsed.container_id.as_deref().unwrap_or(""), reason = reason.as_str(), error = %e.message, "refused");
    e
}

/// What the create path built, kept by `main` until the exec (see there).
struct Prepared {
    _spec: serde_json::Value,
    _edited: serde_json::Value,
    _intake: crate::plan::intake::Intake,
}

/// Plan and apply for `create`/`run`: everything before the exec. Writes nothing when it fails.
fn prepare_create(
    parsed: &args::RuncArgs,
    cfg: &Config,
    phases: &mut Option<phases::Phases>,
) -> Result<Option<Prepared>, Exit> {
    let mut mark = |name| {
        if let Some(p) = phases.as_mut() {
            p.mark(name)
        }
    };
    mark("config");
    let id = parsed
        .container_id
        .as_deref()
        .ok_or_else(|| Exit::invalid("create: no container id on the command line"))?;
    if !crate::text::valid_container_id(id) {
        return Err(Exit::invalid(format!(
            "container id {id:?}: not a valid container id"
        )));
    }
    if container_exists(parsed, cfg, id) {
        // The real runtime refuses a duplicate id; don't touch the live container's state.
        return Ok(None);
    }
    let bundle = match &parsed.bundle {
        Some(b) => b.clone(),
        None => {
            std::env::current_dir().map_err(|e| Exit::env(format!("current directory: {e}")))?
        }
    };
    let config_path = bundle.join("config.json");
    let original = std::fs::read(&config_path)
        .map_err(|e| Exit::invalid(format!("{}: {e}", config_path.display())))?;
    let spec: serde_json::Value = serde_json::from_slice(&original)
        .map_err(|e| Exit::invalid(format!("{}: {e}", config_path.display())))?;
    mark("bundle");

    crate::logging::init(cfg);
    mark("log");
    let mut inventory_us = None;
    let mut intake = crate::plan::intake::intake(
        cfg,
        &spec,
        id,
        // The cache under `state-dir`; NVML is initialised only when the cache is missing or the
        // node changed (and the result is cached).
        |cfg| {
            let t = std::time::Instant::now();
            let r = crate::inventory::load(cfg).map_err(|e| e.to_string());
            inventory_us = Some(t.elapsed().as_micros());
            r
        },
        &CdiSource::of(cfg),
        None,
    )
    .map_err(|e| {
        let reason = e.reason();
        match e {
            IntakeError::Allocation { .. } => Exit::invalid(e).because(reason),
            IntakeError::Inventory { .. } | IntakeError::Mps { .. } => Exit::env(e).because(reason),
        }
    })?;
    if let (Some(p), Some(us)) = (phases.as_mut(), inventory_us) {
        p.split("inventory", us);
    }
    let mut mark = |name| {
        if let Some(p) = phases.as_mut() {
            p.mark(name)
        }
    };
    if intake.sandbox.is_some() {
        return Ok(None);
    }
    mark("plan");
    // The driver folders, named and (once per driver) made on the host: one pass.
    crate::driverfolders::settle_intake(cfg, &mut intake, crate::driverfolders::Mode::Prepare);
    mark("folders");
    let (plan, request) = (&intake.plan, &intake.request);
    crate::plan::log_decision(id, plan);
    mark("logline");
    let folders = plan.driver_folders.as_ref();

    // The ld cache is refreshed here, not by a createContainer hook in runc (ldcache.rs), unless
    // the container has a user namespace.
    let (ld_cache, mounts) = (plan.layout_ld_cache(), plan.layout_mounts());
    let folding = folders.map(|f| &f.folding);
    let (refresh, hook) = ldcache::render(cfg, ld_cache, request, &bundle, mounts, folding, id)?;
    let render = apply::Render {
        mounts: folders.map(|f| f.mounts.as_slice()),
        env: folders.map_or(&[], |f| f.env.as_slice()),
        hooks: hook.into_iter().collect(),
    };
    let mut edited = spec.clone();
    apply::render_spec(&mut edited, plan, &render)
        .map_err(|e| Exit::invalid(format!("container {id}: {e}")))?;
    mark("apply");
    if let Some(r) = refresh {
        r.run(id)?;
    }
    mark("ldcache");
    crate::hostfiles::write_host_files(cfg, id, plan)
        .map_err(|e| Exit::new(e.code(), e.to_string()))?;
    mark("hostfiles");
    crate::state::meta::record(
        plan,
        &request.annotations,
        status_locator(parsed, cfg, &bundle),
    );
    if edited != spec {
        let bytes = serde_json::to_vec(&edited)
            .map_err(|e| Exit::env(format!("{}: {e}", config_path.display())))?;
        crate::fsutil::replace_keeping_mode(&config_path, &bytes)
            .map_err(|e| Exit::env(format!("{}: {e}", config_path.display())))?;
    }
    mark("spec");
    Ok(Some(Prepared {
        _spec: spec,
        _edited: edited,
        _intake: intake,
    }))
}

/// Whether the real runtime already has a container with this id (its state under `--root`).
fn container_exists(parsed: &args::RuncArgs, cfg: &Config, id: &str) -> bool {
    runtime_state_root(parsed, cfg)
        .join(id)
        .join("state.json")
        .exists()
}

/// Where `gpufence ps` will find the container's init process: the pid file (absolute) and the
/// real runtime's state root.
fn status_locator(
    parsed: &args::RuncArgs,
    cfg: &Config,
    bundle: &Path,
) -> crate::state::meta::Locator {
    let cwd = std::env::current_dir().unwrap_or_else(|_| bundle.to_path_buf());
    crate::state::meta::Locator {
        pid: None,
        pid_file: parsed
            .pid_file
            .as_ref()
            .map(|p| cwd.join(p).display().to_string()),
        runtime_root: Some(
            cwd.join(runtime_state_root(parsed, cfg))
                .display()
                .to_string(),
        ),
    }
}

fn runtime_state_root(parsed: &args::RuncArgs, cfg: &Config) -> PathBuf {
    if let Some(r) = &parsed.root {
        return r.clone();
    }
    // The runtime actually run (`runtime.path`, else the one found on PATH): crun keeps its
    // state elsewhere, and a wrong root would report a live container gone.
    let is_crun = real_runtime(cfg)
        .ok()
        .and_then(|p| p.file_name().map(|n| n == "crun"))
        .unwrap_or(false);
    PathBuf::from(if is_crun { "/run/crun" } else { "/run/runc" })
}

/// Replace this process with the real runtime, same arguments. Returns only on failure.
fn exec(rt: &Path, rest: &[OsString]) -> Exit {
    let e = Command::new(rt).arg0(rt).args(rest).exec();
    Exit::env(format!("exec {}: {e}", rt.display()))
}

/// `delete`: run the real runtime, then remove `state-dir/<id>` once the container is gone
/// (removing it earlier would empty the quota directory of a container still running).
fn delete(parsed: &args::RuncArgs, cfg: &Config, rt: &Path, rest: &[OsString]) -> Result<(), Exit> {
    let id = parsed
        .container_id
        .as_deref()
        .filter(|i| crate::text::valid_container_id(i));
    let Some(id) = id else {
        return Err(exec(rt, rest));
    };
    if !crate::hostfiles::has_container_state(cfg, id) {
        // Nothing of ours to clean up (no GPU, or already removed): plain exec.
        return Err(exec(rt, rest));
    }
    let status = Command::new(rt)
        .arg0(rt)
        .args(rest)
        .status()
        .map_err(|e| Exit::env(format!("exec {}: {e}", rt.display())))?;
    let code = status.code().unwrap_or_else(|| {
        128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
    });
    if code == 0 || !container_exists(parsed, cfg, id) {
        crate::logging::init(cfg);
        if let Err(e) = crate::hostfiles::remove_container_state(cfg, id) {
            eprintln!("gpufence-runtime: {e}");
        }
    }
    std::process::exit(code)
}
