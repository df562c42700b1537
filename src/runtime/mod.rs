//! `gpufence-runtime`: the runc wrapper, and `gpufence runtime configure`.
//!
//! Pipeline on `create`/`run`: argv (pure, [`args`]) → config + cached inventory (device numbers
//! re-read from `dev-root`) + CDI specs → [`crate::plan::plan`] (pure) → [`apply_to_spec`] (pure)
//! → ld cache refresh in a private mount namespace ([`ldcache`], instead of runc running the
//! plan's createContainer hook) → host files (state dir, quota, generated ld.so.preload) → atomic `config.json` write → `exec`
//! of the real runtime with the original argv. Every other subcommand execs straight through
//! without reading anything but the configuration; `delete` also removes the container's state
//! directory once the real runtime has let go of the container.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use crate::config::Config;
use crate::exit::Exit;
use crate::plan::Plan;
use crate::status::refusals::Reason;

pub mod apply;
pub mod args;
pub mod cli;
pub mod configure;
pub mod ldcache;
pub mod runclog;

pub use apply::{ApplyError, apply_to_spec};

/// Entry point of `gpufence-runtime` (argv including argv[0]).
pub fn main(argv: Vec<OsString>) -> Result<(), Exit> {
    let rest: &[OsString] = argv.get(1..).unwrap_or(&[]);
    let parsed = args::parse(rest);

    if parsed.is_create() {
        let cfg = match Config::load(None) {
            Ok(c) => c,
            Err(e) => {
                let e = Exit::invalid(e).because(Reason::Config);
                return Err(report(&parsed, &Config::default(), e));
            }
        };
        if let Err(e) = prepare_create(&parsed, &cfg) {
            return Err(report(&parsed, &cfg, e));
        }
        let rt = real_runtime(&cfg).map_err(|e| report(&parsed, &cfg, e))?;
        return Err(exec(&rt, rest));
    }

    // Pass-through: the configuration only names the real runtime and the state directory. A
    // broken configuration must not stop containers from being listed, killed or deleted.
    let cfg = Config::load(None).unwrap_or_else(|e| {
        eprintln!(
            "gpufence-runtime: {e}; using defaults for {:?}",
            parsed.subcommand
        );
        Config::default()
    });
    let rt = real_runtime(&cfg)?;
    if parsed.is_delete() {
        return delete(&parsed, &cfg, &rt, rest);
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
    crate::status::refusals::count(&cfg.state_dir, reason);
    tracing::error!(container = parsed.container_id.as_deref().unwrap_or(""), reason = reason.as_str(), error = %e.message, "refused");
    e
}

/// Plan and apply for `create`/`run`: everything before the exec. Writes nothing when it fails.
fn prepare_create(parsed: &args::RuncArgs, cfg: &Config) -> Result<(), Exit> {
    let id = parsed
        .container_id
        .as_deref()
        .ok_or_else(|| Exit::invalid("create: no container id on the command line"))?;
    if !args::valid_container_id(id) {
        return Err(Exit::invalid(format!(
            "container id {id:?}: not a valid container id"
        )));
    }
    if container_exists(parsed, cfg, id) {
        // The real runtime refuses a duplicate id; don't touch the live container's state.
        return Ok(());
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

    crate::logging::init(cfg);
    if let Some(kind) = sandbox_kind(&spec) {
        // Pod annotations reach the sandbox (pause) container too; it never gets a GPU.
        tracing::info!(container = id, kind, "pod sandbox: no GPU, spec untouched");
        return Ok(());
    }

    let (inventory, inventory_error) = match load_inventory(cfg) {
        Ok(inv) => (inv, None),
        Err(e) => (empty_inventory(), Some(e)),
    };
    let cdi_specs = load_cdi_specs(&spec);
    let mut plan = match crate::plan::plan(&spec, id, &inventory, cfg, &cdi_specs) {
        Ok(p) => p,
        Err(e) => {
            return Err(Exit::invalid(match inventory_error {
                Some(inv) => format!("container {id}: {e} (inventory unavailable: {inv})"),
                None => format!("container {id}: {e}"),
            })
            .because(Reason::Allocation));
        }
    };
    if let Some(inv) = &inventory_error {
        if !plan.grants_nothing() {
            return Err(
                Exit::env(format!("container {id}: inventory: {inv}")).because(Reason::Inventory)
            );
        }
        tracing::warn!(container = id, error = %inv, "inventory unavailable; container has no allocation");
    }
    log_decision(id, &plan);

    // The ld cache is refreshed here, not by a createContainer hook in runc (ldcache.rs).
    let refresh = ldcache::take_over(cfg, &spec, &bundle, &mut plan, id)?;
    let mut edited = spec.clone();
    apply_to_spec(&mut edited, &plan).map_err(|e| Exit::invalid(format!("container {id}: {e}")))?;
    if let Some(r) = refresh {
        r.run(id)?;
    }
    write_host_files(cfg, id, &plan)?;
    crate::status::meta::record(
        &plan,
        spec.get("annotations").and_then(|a| a.as_object()),
        status_locator(parsed, cfg, &bundle),
    );
    if edited != spec {
        let bytes = serde_json::to_vec(&edited)
            .map_err(|e| Exit::env(format!("{}: {e}", config_path.display())))?;
        write_atomic(&config_path, &bytes)
            .map_err(|e| Exit::env(format!("{}: {e}", config_path.display())))?;
    }
    Ok(())
}

/// The CRI annotation marking a pod sandbox (pause) container, if this is one.
pub(crate) fn sandbox_kind(spec: &serde_json::Value) -> Option<&'static str> {
    let ann = spec.get("annotations")?;
    let is = |k: &str, v: &str| ann.get(k).and_then(|x| x.as_str()) == Some(v);
    if is("io.kubernetes.cri.container-type", "sandbox") {
        Some("containerd")
    } else if is("io.kubernetes.cri-o.ContainerType", "sandbox") {
        Some("cri-o")
    } else if is("io.kubernetes.docker.type", "podsandbox") {
        Some("dockershim")
    } else {
        None
    }
}

/// One line per decision: container id, dialects, devices, quotas.
fn log_decision(id: &str, plan: &Plan) {
    match &plan.allocation {
        None => tracing::info!(
            container = id,
            env_overrides = ?plan.env_overrides,
            notes = ?plan.notes,
            "no allocation: no GPU"
        ),
        Some(a) => {
            let dialects: Vec<&str> = a.dialects.iter().map(|d| d.name()).collect();
            let devices: Vec<String> = a
                .devices
                .iter()
                .map(|d| match d.device {
                    crate::allocation::DeviceRef::Gpu { index } => format!("{index}={}", d.uuid),
                    crate::allocation::DeviceRef::Mig { gpu, mig } => {
                        format!("{gpu}:{mig}={}", d.uuid)
                    }
                })
                .collect();
            let quotas: Vec<String> = a
                .devices
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    format!(
                        "{i}:mem={}:cores={}",
                        d.memory_limit.map_or("-".to_string(), |m| m.to_string()),
                        d.cores.map_or("-".to_string(), |c| c.to_string())
                    )
                })
                .collect();
            tracing::info!(
                container = id,
                dialects = ?dialects,
                devices = ?devices,
                quotas = ?quotas,
                oversubscribe = a.oversubscribe,
                device_nodes = plan.edits.device_nodes.len(),
                mounts = plan.edits.mounts.len(),
                "allocation applied"
            );
        }
    }
}

/// The inventory from the cache under `state-dir` (NVML is initialised only when the cache is
/// missing or the node changed, and the result is cached), with device numbers re-read from the
/// nodes under `dev-root` now.
fn load_inventory(cfg: &Config) -> Result<crate::inventory::Inventory, String> {
    let mut inv = crate::inventory::load(cfg).map_err(|e| e.to_string())?;
    crate::inventory::refresh_device_numbers(&mut inv, cfg).map_err(|e| e.to_string())?;
    Ok(inv)
}

fn empty_inventory() -> crate::inventory::Inventory {
    crate::inventory::Inventory {
        driver_version: String::new(),
        cuda_driver_version: 0,
        gpus: Vec::new(),
        control_nodes: Vec::new(),
        driver_files: Vec::new(),
    }
}

/// CDI specs from /etc/cdi and /var/run/cdi, read only when the spec names CDI devices (the
/// only dialect that needs them), so the common create path reads no directories.
pub(crate) fn load_cdi_specs(spec: &serde_json::Value) -> Vec<crate::cdi::LoadedSpec> {
    let wants_cdi = spec
        .get("annotations")
        .and_then(|a| a.as_object())
        .is_some_and(|a| a.keys().any(|k| k.starts_with("cdi.k8s.io/")));
    if !wants_cdi {
        return Vec::new();
    }
    let (specs, errors) = crate::cdi::load_spec_dirs(&crate::cdi::parse::default_spec_dirs());
    for e in errors {
        tracing::warn!(error = %e, "CDI spec skipped");
    }
    specs
}

/// Where `gpufence ps` will find the container's init process: the pid file (absolute) and the
/// real runtime's state root.
fn status_locator(
    parsed: &args::RuncArgs,
    cfg: &Config,
    bundle: &Path,
) -> crate::status::meta::Locator {
    let cwd = std::env::current_dir().unwrap_or_else(|_| bundle.to_path_buf());
    crate::status::meta::Locator {
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

/// Whether the real runtime already has a container with this id (its state under `--root`).
fn container_exists(parsed: &args::RuncArgs, cfg: &Config, id: &str) -> bool {
    runtime_state_root(parsed, cfg)
        .join(id)
        .join("state.json")
        .exists()
}

fn runtime_state_root(parsed: &args::RuncArgs, cfg: &Config) -> PathBuf {
    if let Some(r) = &parsed.root {
        return r.clone();
    }
    let is_crun = cfg
        .runtime
        .path
        .as_ref()
        .and_then(|p| p.file_name())
        .is_some_and(|n| n == "crun");
    PathBuf::from(if is_crun { "/run/crun" } else { "/run/runc" })
}

/// True when `p` is `base/<one component>/…` with no `..` anywhere.
fn is_under(p: &Path, base: &Path) -> bool {
    p.is_absolute()
        && !p.components().any(|c| c == Component::ParentDir)
        && p.strip_prefix(base)
            .is_ok_and(|r| r.components().count() >= 1)
}

/// The container's state directory and the files the plan asks for (quota 0444, generated
/// ld.so.preload), each written atomically, and the empty shared accounting file (0666) when the
/// container has a quota. Only paths inside `state-dir` are accepted.
pub(crate) fn write_host_files(cfg: &Config, id: &str, plan: &Plan) -> Result<(), Exit> {
    let base = &cfg.state_dir;
    let outside = |what: &str, p: &Path| {
        Exit::invalid(format!(
            "container {id}: {what} {} is outside state-dir {}",
            p.display(),
            base.display()
        ))
    };
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = &plan.state_dir {
        let d = PathBuf::from(d);
        if !is_under(&d, base) {
            return Err(outside("state directory", &d));
        }
        dirs.push(d);
    }
    for f in &plan.host_files {
        let p = PathBuf::from(&f.path);
        if !is_under(&p, base) {
            return Err(outside("host file", &p));
        }
        if let Some(parent) = p.parent() {
            dirs.push(parent.to_path_buf());
        }
    }
    for d in &dirs {
        create_dir_nofollow(base, d)
            .map_err(|e| Exit::env(format!("state directory {}: {e}", d.display())))?;
    }
    for f in &plan.host_files {
        let p = Path::new(&f.path);
        write_file_atomic(p, f.contents.as_bytes(), f.mode, None)
            .map_err(|e| Exit::env(format!("{}: {e}", p.display())))?;
    }
    if let (Some(d), Some(_)) = (&plan.state_dir, &plan.quota) {
        let p = Path::new(d).join(crate::plan::ACCOUNTING_FILE);
        create_accounting(&p).map_err(|e| Exit::env(format!("{}: {e}", p.display())))?;
    }
    Ok(())
}

/// Create the container's accounting file empty with mode 0666 (the shim sizes and stamps it on
/// first use), so container processes of any uid can share it without write access to the
/// directory. An existing regular file is kept as is (live processes may have it mapped); a
/// symlink or anything else there is an error.
fn create_accounting(p: &Path) -> std::io::Result<()> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o666)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(p)
    {
        // umask may have masked the mode.
        Ok(f) => f.set_permissions(std::fs::Permissions::from_mode(0o666)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if std::fs::symlink_metadata(p)?.is_file() {
                Ok(())
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "exists and is not a regular file",
                ))
            }
        }
        Err(e) => Err(e),
    }
}

/// `mkdir -p` of `dir` (under `base`), refusing symlinks on the way below `base`.
fn create_dir_nofollow(base: &Path, dir: &Path) -> std::io::Result<()> {
    crate::config::create_state_dir(base)?;
    let rel = dir
        .strip_prefix(base)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "outside state-dir"))?;
    let mut cur = base.to_path_buf();
    for c in rel.components() {
        cur.push(c);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a directory", cur.display()),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&cur)?;
                std::fs::set_permissions(&cur, std::fs::Permissions::from_mode(0o755))?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Write `path` atomically: a temp file beside it (never following a symlink), then rename.
/// `owner` keeps the original file's uid/gid.
fn write_file_atomic(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.gpufence-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode & 0o7777)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
        }
        // umask may have masked the mode.
        f.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Replace `config.json` atomically with the same mode and owner.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let meta = std::fs::metadata(path)?;
    write_file_atomic(
        path,
        bytes,
        meta.permissions().mode(),
        Some((meta.uid(), meta.gid())),
    )
}

/// The real runtime: `runtime.path`, else the first of runc, crun on PATH — never this binary.
fn real_runtime(cfg: &Config) -> Result<PathBuf, Exit> {
    let me = std::env::current_exe()
        .ok()
        .and_then(|p| std::fs::canonicalize(p).ok());
    let is_me = |p: &Path| me.is_some() && std::fs::canonicalize(p).ok() == me;
    if let Some(p) = &cfg.runtime.path {
        if is_me(p) {
            return Err(Exit::invalid(format!(
                "runtime.path {} is gpufence-runtime itself",
                p.display()
            )));
        }
        return Ok(p.clone());
    }
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    for name in ["runc", "crun"] {
        for dir in std::env::split_paths(&path) {
            let cand = dir.join(name);
            let executable = std::fs::metadata(&cand)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
            if executable && !is_me(&cand) {
                return Ok(cand);
            }
        }
    }
    Err(Exit::env(
        "no OCI runtime: set runtime.path or put runc or crun on PATH",
    ))
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
        .filter(|i| args::valid_container_id(i));
    let Some(id) = id else {
        return Err(exec(rt, rest));
    };
    let dir = cfg.container_state_dir(id);
    if std::fs::symlink_metadata(&dir).is_err() {
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
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!("gpufence-runtime: remove {}: {e}", dir.display()),
        }
    }
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under() {
        let b = Path::new("/run/gpufence/c1");
        assert!(is_under(Path::new("/run/gpufence/c1/quota"), b));
        assert!(!is_under(Path::new("/run/gpufence/c1"), b));
        assert!(!is_under(Path::new("/run/gpufence/c1/../c2/quota"), b));
        assert!(!is_under(Path::new("/etc/passwd"), b));
        assert!(!is_under(Path::new("run/gpufence/c1/x"), b));
    }

    #[test]
    fn atomic_write_keeps_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config.json");
        std::fs::write(&p, b"{}").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomic(&p, b"{\"a\":1}").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{\"a\":1}");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o640
        );
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn accounting_file_shared_by_every_container_user() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            state_dir: d.path().join("state"),
            ..Config::default()
        };
        let own = cfg.container_state_dir("c1");
        let quota = crate::quota::Quota {
            oversubscribe: false,
            devices: vec![],
            quiet_refusals: false,
        };
        let plan = Plan {
            state_dir: Some(own.display().to_string()),
            quota: Some(quota.clone()),
            ..Plan::default()
        };
        write_host_files(&cfg, "c1", &plan).unwrap();
        let acc = own.join(crate::plan::ACCOUNTING_FILE);
        let m = std::fs::symlink_metadata(&acc).unwrap();
        assert!(m.is_file());
        assert_eq!(m.len(), 0);
        assert_eq!(m.permissions().mode() & 0o7777, 0o666);
        // The directory itself stays closed to container users.
        assert_eq!(
            std::fs::metadata(&own).unwrap().permissions().mode() & 0o7777,
            0o755
        );
        // An existing region (live processes may have it mapped) is kept.
        std::fs::write(&acc, b"live").unwrap();
        write_host_files(&cfg, "c1", &plan).unwrap();
        assert_eq!(std::fs::read(&acc).unwrap(), b"live");
        // No quota, no region.
        let own2 = cfg.container_state_dir("c2");
        let no_quota = Plan {
            state_dir: Some(own2.display().to_string()),
            ..Plan::default()
        };
        write_host_files(&cfg, "c2", &no_quota).unwrap();
        assert!(!own2.join(crate::plan::ACCOUNTING_FILE).exists());
        // A symlink planted at the region's name is not followed.
        let own3 = cfg.container_state_dir("c3");
        std::fs::create_dir_all(&own3).unwrap();
        let target = d.path().join("target");
        std::os::unix::fs::symlink(&target, own3.join(crate::plan::ACCOUNTING_FILE)).unwrap();
        let plan3 = Plan {
            state_dir: Some(own3.display().to_string()),
            quota: Some(quota),
            ..Plan::default()
        };
        assert!(write_host_files(&cfg, "c3", &plan3).is_err());
        assert!(!target.exists());
    }

    #[test]
    fn host_files_stay_in_state_dir() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            state_dir: d.path().join("state"),
            ..Config::default()
        };
        let own = cfg.container_state_dir("c1");
        let plan = Plan {
            state_dir: Some(own.display().to_string()),
            host_files: vec![crate::plan::HostFile {
                path: own.join("quota").display().to_string(),
                contents: "version=1\n".into(),
                mode: 0o444,
            }],
            ..Plan::default()
        };
        write_host_files(&cfg, "c1", &plan).unwrap();
        let q = own.join("quota");
        assert_eq!(std::fs::read_to_string(&q).unwrap(), "version=1\n");
        assert_eq!(
            std::fs::metadata(&q).unwrap().permissions().mode() & 0o777,
            0o444
        );
        // Rewriting a read-only file works (rename, not truncate).
        write_host_files(&cfg, "c1", &plan).unwrap();

        // A node-wide file directly under state-dir is fine.
        let node_wide = Plan {
            host_files: vec![crate::plan::HostFile {
                path: cfg.state_dir.join("ld.so.preload").display().to_string(),
                contents: "/usr/lib/gpufence/libgpufence.so\n".into(),
                mode: 0o444,
            }],
            ..Plan::default()
        };
        write_host_files(&cfg, "c1", &node_wide).unwrap();

        let evil = Plan {
            host_files: vec![crate::plan::HostFile {
                path: d.path().join("elsewhere").display().to_string(),
                contents: String::new(),
                mode: 0o444,
            }],
            ..Plan::default()
        };
        assert!(write_host_files(&cfg, "c1", &evil).is_err());
        assert!(!d.path().join("elsewhere").exists());

        // A symlink planted where the container directory goes is refused.
        std::os::unix::fs::symlink("/tmp", cfg.state_dir.join("c2")).unwrap();
        let plan2 = Plan {
            state_dir: Some(cfg.container_state_dir("c2").display().to_string()),
            ..Plan::default()
        };
        assert!(write_host_files(&cfg, "c2", &plan2).is_err());
    }
}
