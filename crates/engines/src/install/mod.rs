//! `gpufence install` / `gpufence uninstall`: what the installer image (and an operator) runs to
//! put gpufence on a node whose root directory is mounted at `--host-root`.
//!
//! install: copy `gpufence`, `gpufence-runtime` and the shim into the host (a host file that
//! differs and was not installed by gpufence is backed up first), write
//! `/etc/gpufence/config.toml` only if absent, register the runtime handler
//! (`runtime configure`, recorded for an exact undo), warm the inventory cache when the host has
//! a driver (`/dev/nvidiactl` under the configured `dev-root`), and restart the engine when its
//! configuration changed. Every file install wrote is listed in the manifest
//! `/var/lib/gpufence/install.json`, so that uninstall takes back exactly that: the engine's
//! files byte-for-byte, gpufence's files (backups put back), `config.toml` only when it is still
//! the one install wrote, and the directories install created when they are empty.
//!
//! Both are idempotent (nothing changed means no restart) and have a dry run. Paths written into
//! files (the runtime binary, the drop-in) are the host's; files are reached under the host root.

pub mod host;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::configure::{Engine, Mode, in_root};
use crate::nri_config;
use crate::unconfigure::{self, ApplyError, Target};
use host::Host;

/// Where gpufence lives on the host (the .deb's layout).
pub const HOST_GPUFENCE: &str = "/usr/bin/gpufence";
pub const HOST_RUNTIME: &str = "/usr/bin/gpufence-runtime";
/// What the static entry [`HOST_RUNTIME`] execs for `create`/`run`/`delete`: beside it.
pub const HOST_RUNTIME_WRAPPER: &str = "/usr/bin/gpufence-runtime-wrapper";
pub const HOST_SHIM: &str = "/usr/lib/gpufence/libgpufence.so";
pub const HOST_CONFIG: &str = "/etc/gpufence/config.toml";
pub const HOST_STATE: &str = "/var/lib/gpufence";
const MANIFEST: &str = "install.json";

/// The node configuration installed when the host has none (`packaging/config.toml`).
pub const DEFAULT_CONFIG: &str = include_str!("../../../../packaging/config.toml");

/// How the engine is restarted after its configuration changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Restart {
    /// systemd when the host runs it (`/run/systemd/system`), else SIGHUP for docker (which
    /// reloads its runtimes), else none.
    Auto,
    /// `systemctl restart <unit>` inside the host root.
    Systemd,
    /// SIGHUP to the pid in the engine's pid file (docker reloads `runtimes` on SIGHUP).
    Signal,
    /// Do not restart; print what to restart.
    None,
}

/// The installer's own files (in the image: /usr/bin and /usr/lib/gpufence).
#[derive(Debug, Clone)]
pub struct Sources {
    pub gpufence: PathBuf,
    pub runtime: PathBuf,
    pub runtime_wrapper: PathBuf,
    pub shim: PathBuf,
}

impl Sources {
    /// Beside `bin_dir` (`gpufence`, `gpufence-runtime`, `gpufence-runtime-wrapper`); the shim at
    /// `bin_dir/../lib/gpufence/libgpufence.so` (image, package) or `bin_dir/libgpufence.so`
    /// (a cargo build).
    pub fn beside(bin_dir: &Path) -> Sources {
        let packaged = bin_dir.join("../lib/gpufence/libgpufence.so");
        Sources {
            gpufence: bin_dir.join("gpufence"),
            runtime: bin_dir.join("gpufence-runtime"),
            runtime_wrapper: bin_dir.join("gpufence-runtime-wrapper"),
            shim: if packaged.exists() {
                packaged
            } else {
                bin_dir.join("libgpufence.so")
            },
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub host_root: PathBuf,
    pub engine: Engine,
    /// The engine's main configuration, as the host sees it.
    pub engine_config: PathBuf,
    pub handler: String,
    pub sources: Sources,
    pub restart: Restart,
    pub dry_run: bool,
    /// Install even in front of a runc/crun release with known container escapes.
    pub allow_vulnerable_runtime: bool,
    /// The applier: the runtime handler, or the NRI plugin (containerd, CRI-O).
    pub mode: Mode,
}

impl Options {
    fn here(&self, host_path: &Path) -> PathBuf {
        in_root(&self.host_root, host_path)
    }
    fn target(&self) -> Target {
        Target {
            root: self.host_root.clone(),
            engine: self.engine,
            config: self.engine_config.clone(),
            binary: PathBuf::from(HOST_RUNTIME),
            handler: self.handler.clone(),
            record_dir: self.here(&Path::new(HOST_STATE).join("configure")),
            mode: self.mode,
        }
    }
    fn manifest_path(&self) -> PathBuf {
        self.here(&Path::new(HOST_STATE).join(MANIFEST))
    }
}

/// What install wrote, for uninstall.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub version: String,
    pub files: Vec<InstalledFile>,
    /// `config.toml` as install wrote it (it was absent); `None`: the host's own.
    pub config: Option<String>,
    /// Directories install created, outermost first.
    pub created_dirs: Vec<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstalledFile {
    /// As the host sees it.
    pub path: PathBuf,
    /// `<len>:<fnv64>` of what install wrote.
    pub digest: String,
    /// Where the host's previous file was kept (host view), if there was one.
    pub backup: Option<PathBuf>,
}

/// Why install/uninstall stopped: one line naming the file or command.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Manifest { path: PathBuf, message: String },
    #[error(transparent)]
    Engine(#[from] ApplyError),
    #[error("restart {unit}: {message}")]
    Restart { unit: &'static str, message: String },
    #[error("{0}: not a directory (--host-root names the host's root directory)")]
    HostRoot(PathBuf),
    #[error("{}", .0.message)]
    Runtime(crate::exit::Exit),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InstallError + '_ {
    move |source| InstallError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `<len>:<fnv64>` of `data`: enough to tell whether a file is still the one install wrote.
pub fn digest(data: &[u8]) -> String {
    let h = crate::fnv::fnv1a64(data);
    format!("{}:{h:016x}", data.len())
}

fn read_manifest(path: &Path) -> Result<Option<Manifest>, InstallError> {
    match std::fs::read_to_string(path) {
        Ok(t) => serde_json::from_str(&t)
            .map(Some)
            .map_err(|e| InstallError::Manifest {
                path: path.to_path_buf(),
                message: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path)(e)),
    }
}

/// Write `data` to `path` atomically with `mode` (temp file beside it + rename).
fn put(path: &Path, data: &[u8], mode: u32) -> Result<(), InstallError> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let mut tmp = tempfile::Builder::new()
        .prefix(".gpufence-install")
        .tempfile_in(dir)
        .map_err(io(dir))?;
    tmp.write_all(data).map_err(io(path))?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io(path))?;
    tmp.as_file().sync_all().map_err(io(path))?;
    tmp.persist(path).map_err(|e| io(path)(e.error))?;
    Ok(())
}

/// Create `host_dir` (and its missing parents) under the host root, noting what was created.
fn ensure_dir(o: &Options, host_dir: &Path, m: &mut Manifest) -> Result<(), InstallError> {
    let mut missing = Vec::new();
    let mut d = Some(host_dir);
    while let Some(dir) = d {
        if dir == Path::new("/") || o.here(dir).exists() {
            break;
        }
        missing.push(dir.to_path_buf());
        d = dir.parent();
    }
    for dir in missing.into_iter().rev() {
        if !o.dry_run {
            std::fs::create_dir(o.here(&dir)).map_err(io(&dir))?;
        }
        if !m.created_dirs.contains(&dir) {
            m.created_dirs.push(dir);
        }
    }
    Ok(())
}

/// Copy one of gpufence's files into the host.
fn install_file(
    o: &Options,
    src: &Path,
    host_path: &str,
    mode: u32,
    previous: Option<&Manifest>,
    m: &mut Manifest,
    report: &mut Vec<String>,
) -> Result<bool, InstallError> {
    let data = std::fs::read(src).map_err(io(src))?;
    install_bytes(o, &data, Path::new(host_path), mode, previous, m, report)
}

/// Write `data` as the host's `host_path` (a host file that differs and was not installed by
/// gpufence is backed up first), listed in the manifest. Whether the file changed.
fn install_bytes(
    o: &Options,
    data: &[u8],
    host_path: &Path,
    mode: u32,
    previous: Option<&Manifest>,
    m: &mut Manifest,
    report: &mut Vec<String>,
) -> Result<bool, InstallError> {
    let host_path = host_path.to_path_buf();
    let dest = o.here(&host_path);
    let known = previous.and_then(|p| p.files.iter().find(|f| f.path == host_path));
    let current = std::fs::read(&dest).ok();
    if current.as_deref() == Some(data) {
        // Identical: ours when a previous install wrote it, else the host's (left at uninstall).
        m.files.extend(known.cloned());
        report.push(format!("{}: up to date", dest.display()));
        return Ok(false);
    }
    let mut backup = known.and_then(|k| k.backup.clone());
    if current.is_some() && known.is_none() {
        let b = Path::new(HOST_STATE)
            .join("backup")
            .join(host_path.strip_prefix("/").unwrap_or(&host_path));
        ensure_dir(o, b.parent().unwrap_or(Path::new("/")), m)?;
        if !o.dry_run {
            std::fs::rename(&dest, o.here(&b)).map_err(io(&dest))?;
        }
        report.push(format!(
            "kept the host's {} as {}",
            dest.display(),
            o.here(&b).display()
        ));
        backup = Some(b);
    }
    ensure_dir(o, host_path.parent().unwrap_or(Path::new("/")), m)?;
    if !o.dry_run {
        put(&dest, data, mode)?;
    }
    report.push(format!(
        "{} {}",
        if o.dry_run {
            "would install"
        } else {
            "installed"
        },
        dest.display()
    ));
    m.files.push(InstalledFile {
        path: host_path,
        digest: digest(data),
        backup,
    });
    Ok(true)
}

/// `gpufence install`.
pub fn install(o: &Options, host: &mut dyn Host) -> Result<Vec<String>, InstallError> {
    if !o.host_root.is_dir() {
        return Err(InstallError::HostRoot(o.host_root.clone()));
    }
    let mpath = o.manifest_path();
    let previous = read_manifest(&mpath)?;
    let mut m = Manifest {
        version: env!("CARGO_PKG_VERSION").to_string(),
        created_dirs: previous
            .as_ref()
            .map(|p| p.created_dirs.clone())
            .unwrap_or_default(),
        ..Manifest::default()
    };
    let mut report = Vec::new();
    let s = &o.sources;
    for (src, dest, mode) in [
        (&s.gpufence, HOST_GPUFENCE, 0o755),
        (&s.runtime, HOST_RUNTIME, 0o755),
        (&s.runtime_wrapper, HOST_RUNTIME_WRAPPER, 0o755),
        (&s.shim, HOST_SHIM, 0o644),
    ] {
        if (dest == HOST_RUNTIME || dest == HOST_RUNTIME_WRAPPER) && o.mode == Mode::Nri {
            continue;
        }
        install_file(o, src, dest, mode, previous.as_ref(), &mut m, &mut report)?;
    }

    let cfg = o.here(Path::new(HOST_CONFIG));
    let engine_cdi = o.engine.config().cdi_dirs(&o.host_root, &o.engine_config);
    if let Err(e) = &engine_cdi {
        report.push(format!(
            "CDI directories: {}'s cdi_spec_dirs cannot be read ({e}); gpufence resolves CDI \
             devices from cdi.spec-dirs",
            o.engine.name()
        ));
    }
    let engine_cdi = engine_cdi.ok().flatten();
    if cfg.exists() {
        m.config = previous.as_ref().and_then(|p| p.config.clone());
        report.push(format!("{}: kept (exists)", cfg.display()));
        let text = std::fs::read_to_string(&cfg).map_err(io(&cfg))?;
        if let (Ok(c), Some(dirs)) = (
            crate::config::Config::from_toml(&text, Path::new(HOST_CONFIG)),
            &engine_cdi,
        ) && let Some(line) = crate::cdi_dirs::disagreement(&c, o.engine, dirs)
        {
            report.push(line);
        }
    } else {
        let config_text = match &engine_cdi {
            Some(dirs) => crate::cdi_dirs::with_spec_dirs(DEFAULT_CONFIG, dirs),
            None => DEFAULT_CONFIG.to_string(),
        };
        ensure_dir(
            o,
            Path::new(HOST_CONFIG).parent().unwrap_or(Path::new("/")),
            &mut m,
        )?;
        if !o.dry_run {
            put(&cfg, config_text.as_bytes(), 0o644)?;
        }
        m.config = Some(config_text);
        report.push(format!(
            "{} {}",
            if o.dry_run { "would write" } else { "wrote" },
            cfg.display()
        ));
    }

    crate::check_real_runtime(&o.host_root, o.allow_vulnerable_runtime)
        .map_err(InstallError::Runtime)?;
    ensure_dir(o, &Path::new(HOST_STATE).join("configure"), &mut m)?;
    let engine_report = unconfigure::apply_configure(&o.target(), o.dry_run)?;
    let mut changed = engine_report.iter().any(|l| l.starts_with("wrote "));
    report.extend(engine_report);
    if o.mode == Mode::Nri {
        changed |= install_nri_plugin(o, previous.as_ref(), &mut m, &mut report)?;
    }

    if !o.dry_run {
        let mut json = serde_json::to_string_pretty(&m).expect("manifest serialises");
        json.push('\n');
        put(&mpath, json.as_bytes(), 0o600)?;
    }
    report.push(warm_inventory(o, host));
    if changed {
        report.push(restart(o, host)?);
    }
    Ok(report)
}

/// The pre-registered NRI plugin: `<plugin dir>/90-<name>` (containerd's `plugin_path` from the
/// host's main file; CRI-O's `nri_plugin_dir` from its files), starting `gpufence nri` with the
/// host's configuration. Whether it changed (the runtime starts pre-registered plugins only
/// when it starts).
fn install_nri_plugin(
    o: &Options,
    previous: Option<&Manifest>,
    m: &mut Manifest,
    report: &mut Vec<String>,
) -> Result<bool, InstallError> {
    let Some(dir) = o
        .engine
        .config()
        .nri_plugin_dir(&o.host_root, &o.engine_config, &o.handler)
    else {
        return Ok(false);
    };
    ensure_dir(o, &dir, m)?;
    let wrapper = nri_config::wrapper(Path::new(HOST_GPUFENCE), Path::new(HOST_CONFIG));
    let file = dir.join(nri_config::plugin_file(&o.handler));
    install_bytes(o, wrapper.as_bytes(), &file, 0o755, previous, m, report)
}

/// Run `gpufence inventory` in the host when it has a driver; never fatal (the runtime builds
/// the cache itself at the first GPU container).
fn warm_inventory(o: &Options, host: &mut dyn Host) -> String {
    let cfg_path = o.here(Path::new(HOST_CONFIG));
    let dev_root = std::fs::read_to_string(&cfg_path)
        .ok()
        .and_then(|t| crate::config::Config::from_toml(&t, &cfg_path).ok())
        .map(|c| c.dev_root)
        .unwrap_or_else(|| PathBuf::from("/"));
    let ctl = o.here(&dev_root.join("dev/nvidiactl"));
    if !ctl.exists() {
        return format!(
            "no driver ({} absent): inventory cache not warmed",
            ctl.display()
        );
    }
    if o.dry_run {
        return "would warm the inventory cache (gpufence inventory)".into();
    }
    let under_systemd = systemd(o);
    // NVML lists only the GPUs the caller may open: a cache taken where the device cgroup
    // denies them (a pod) would tell the runtime the node has none. Under systemd the scan runs
    // as a transient unit, outside this pod's cgroup, like the runtime; elsewhere only when the
    // device nodes open from here.
    if !under_systemd && let Some(denied) = denied_device(ctl.parent().unwrap_or(Path::new("/"))) {
        return format!(
            "inventory cache not warmed: {}: no access from here (device cgroup); gpufence-runtime builds it at the first GPU container",
            denied.display()
        );
    }
    let argv: &[&str] = if under_systemd {
        &[
            "systemd-run",
            "--quiet",
            "--wait",
            "--collect",
            HOST_GPUFENCE,
            "inventory",
        ]
    } else {
        &[HOST_GPUFENCE, "inventory"]
    };
    match host.run(&o.host_root, argv) {
        Ok(()) => "inventory cache warmed".into(),
        Err(e) => format!(
            "inventory cache not warmed ({e}); gpufence-runtime builds it at the first GPU container"
        ),
    }
}

/// The first of `dev/nvidiactl`, `dev/nvidia<N>` that this process may not open (EPERM: its
/// device cgroup denies it).
fn denied_device(dev: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let entries = std::fs::read_dir(dev).ok()?;
    let mut nodes: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n == "nvidiactl"
                    || n.strip_prefix("nvidia")
                        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .collect();
    nodes.sort();
    nodes.into_iter().find(|p| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(p)
            .is_err_and(|e| e.raw_os_error() == Some(libc::EPERM))
    })
}

fn systemd(o: &Options) -> bool {
    o.here(Path::new("/run/systemd/system")).is_dir()
}

/// Restart (or reload) the engine the way the host runs it.
fn restart(o: &Options, host: &mut dyn Host) -> Result<String, InstallError> {
    let engine = o.engine.config().identity();
    let unit = engine.id;
    let reload = engine.reload_on_hangup;
    let pid_file = reload.map(|r| o.here(Path::new(r.pid_file)));
    let how = match o.restart {
        Restart::Auto if systemd(o) => Restart::Systemd,
        Restart::Auto if pid_file.as_ref().is_some_and(|p| p.exists()) => Restart::Signal,
        Restart::Auto => Restart::None,
        r => r,
    };
    let fail = |message: String| InstallError::Restart { unit, message };
    if o.dry_run {
        return Ok(format!("would restart {unit} ({how:?})"));
    }
    match how {
        Restart::Systemd => {
            host.run(&o.host_root, &["systemctl", "restart", unit])
                .map_err(fail)?;
            Ok(format!("restarted {unit} (systemd)"))
        }
        Restart::Signal => {
            let (Some(r), Some(pid_file)) = (reload, pid_file) else {
                return Err(fail(
                    "only dockerd reloads its runtimes on SIGHUP; use --restart systemd or restart it yourself".into(),
                ));
            };
            let pid: i32 = std::fs::read_to_string(&pid_file)
                .map_err(|e| fail(format!("{}: {e}", pid_file.display())))?
                .trim()
                .parse()
                .map_err(|_| fail(format!("{}: not a pid", pid_file.display())))?;
            host.hangup(pid).map_err(fail)?;
            Ok(format!(
                "sent SIGHUP to {} (pid {pid}): runtimes reloaded",
                r.daemon
            ))
        }
        _ => Ok(format!("not restarted: {}", o.engine.restart_hint())),
    }
}

/// `gpufence uninstall`.
pub fn uninstall(o: &Options, host: &mut dyn Host) -> Result<Vec<String>, InstallError> {
    if !o.host_root.is_dir() {
        return Err(InstallError::HostRoot(o.host_root.clone()));
    }
    let mpath = o.manifest_path();
    let manifest = read_manifest(&mpath)?;
    let mut report = unconfigure::apply_unconfigure(&o.target(), o.dry_run)?;
    let changed = report
        .iter()
        .any(|l| l.starts_with("restored ") || l.starts_with("removed "));
    if changed {
        report.push(restart(o, host)?);
    }
    let Some(m) = manifest else {
        report.push(format!(
            "{}: nothing installed by gpufence install",
            mpath.display()
        ));
        return Ok(report);
    };
    let verb = |done: &'static str, would: &'static str| if o.dry_run { would } else { done };
    for f in &m.files {
        let here = o.here(&f.path);
        match std::fs::read(&here) {
            Ok(d) if digest(&d) == f.digest => {}
            Ok(_) => {
                report.push(format!("kept {}: changed since install", here.display()));
                continue;
            }
            Err(_) => continue,
        }
        if !o.dry_run {
            match &f.backup {
                Some(b) => std::fs::rename(o.here(b), &here).map_err(io(&here))?,
                None => std::fs::remove_file(&here).map_err(io(&here))?,
            }
        }
        let what = if f.backup.is_some() {
            verb("restored", "would restore")
        } else {
            verb("removed", "would remove")
        };
        report.push(format!("{what} {}", here.display()));
    }
    let cfg = o.here(Path::new(HOST_CONFIG));
    match (&m.config, std::fs::read_to_string(&cfg)) {
        (Some(w), Ok(c)) if *w == c => {
            if !o.dry_run {
                std::fs::remove_file(&cfg).map_err(io(&cfg))?;
            }
            report.push(format!(
                "{} {}",
                verb("removed", "would remove"),
                cfg.display()
            ));
        }
        (Some(_), Ok(_)) => report.push(format!("kept {}: edited since install", cfg.display())),
        _ => {}
    }
    if o.dry_run {
        return Ok(report);
    }
    std::fs::remove_file(&mpath).map_err(io(&mpath))?;
    for d in m.created_dirs.iter().rev() {
        // Only when empty: whatever else is there stays.
        let _ = std::fs::remove_dir(o.here(d));
    }
    Ok(report)
}

#[cfg(test)]
mod tests;
