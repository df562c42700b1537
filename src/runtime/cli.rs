//! `gpufence runtime configure|unconfigure --runtime containerd|crio|docker [--config PATH]
//! [--dry-run] [--record-dir DIR]`.
use std::path::{Path, PathBuf};

use crate::exit::Exit;

use super::configure::{Engine, Mode};
use super::unconfigure::{self, Target};

#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// Register gpufence-runtime as the `gpufence` runtime handler of containerd, CRI-O or
    /// docker, keeping the operator's files and comments.
    Configure(ConfigureArgs),
    /// Remove what `configure` added: the engine's files return byte-for-byte (files edited
    /// since keep the operator's edits and lose only gpufence's entries).
    Unconfigure(EngineArgs),
}

#[derive(clap::Args, Debug)]
pub struct EngineArgs {
    /// The container engine.
    #[arg(long, value_enum)]
    pub runtime: Engine,
    /// The engine's main configuration file (default /etc/containerd/config.toml,
    /// /etc/crio/crio.conf, /etc/docker/daemon.json). Here `--config` names the engine's file,
    /// not gpufence's.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print what would be written instead of writing it.
    #[arg(long)]
    pub dry_run: bool,
    /// Name of the runtime handler (the RuntimeClass `handler`).
    #[arg(long, default_value = "gpufence")]
    pub handler: String,
    /// Where `configure` records what it changed, for `unconfigure`.
    #[arg(long, default_value = unconfigure::DEFAULT_RECORD_DIR)]
    pub record_dir: PathBuf,
    /// The applier to set up: `runtime` (the runtime handler) or `nri` (containerd ≥ 2.2: NRI
    /// enabled, its default validator requiring the plugin named by `--handler`).
    #[arg(long, value_enum, default_value = "runtime")]
    pub mode: Mode,
}

#[derive(clap::Args, Debug)]
pub struct ConfigureArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The gpufence-runtime binary to register (default: next to this binary, else
    /// /usr/bin/gpufence-runtime).
    #[arg(long)]
    pub runtime_binary: Option<PathBuf>,
    /// Register gpufence even in front of a runc/crun release with known container escapes
    /// (printed as a warning instead of refused).
    #[arg(long)]
    pub allow_vulnerable_runtime: bool,
}

impl EngineArgs {
    fn target(&self, binary: PathBuf) -> Target {
        Target {
            root: PathBuf::from("/"),
            engine: self.runtime,
            config: self
                .config
                .clone()
                .unwrap_or_else(|| PathBuf::from(self.runtime.default_config())),
            binary,
            handler: self.handler.clone(),
            record_dir: self.record_dir.clone(),
            mode: self.mode,
        }
    }
}

pub fn run(_gpufence_config: Option<&Path>, cmd: Cmd) -> Result<(), Exit> {
    let (report, engine, dry_run) = match cmd {
        Cmd::Configure(a) => {
            check_real_runtime(Path::new("/"), a.allow_vulnerable_runtime)?;
            let binary = a.runtime_binary.clone().unwrap_or_else(default_binary);
            let t = a.engine.target(binary);
            let mut report =
                unconfigure::apply_configure(&t, a.engine.dry_run).map_err(apply_exit)?;
            // The allow-list passes pod annotations in: say what they are worth on this node
            // (gpufence-runtime's own configuration, as check_real_runtime reads it: `--config`
            // here names the engine's file).
            let cfg = crate::config::Config::load(None).map_err(Exit::invalid)?;
            report.push(super::configure::trust_mode_line(&cfg));
            report.extend(cdi_dirs_line(&cfg, &t));
            (report, a.engine.runtime, a.engine.dry_run)
        }
        Cmd::Unconfigure(a) => {
            let t = a.target(default_binary());
            (
                unconfigure::apply_unconfigure(&t, a.dry_run).map_err(apply_exit)?,
                a.runtime,
                a.dry_run,
            )
        }
    };
    for line in report {
        println!("{line}");
    }
    if !dry_run {
        println!("{}", engine.restart_hint());
    }
    Ok(())
}

/// The engine's CDI directories against `cdi.spec-dirs`: one plain line when they disagree, or
/// when the engine's cannot be read.
pub fn cdi_dirs_line(cfg: &crate::config::Config, t: &Target) -> Option<String> {
    match super::cdi_dirs::of_engine(&t.root, t.engine, &t.config) {
        Ok(Some(dirs)) => super::cdi_dirs::disagreement(cfg, t.engine, &dirs),
        Ok(None) => None,
        Err(e) => Some(format!(
            "CDI directories: {}'s cdi_spec_dirs cannot be read ({e}); gpufence resolves CDI              devices from cdi.spec-dirs",
            t.engine.name()
        )),
    }
}

/// Invalid files are exit 1, failing writes exit 2.
pub fn apply_exit(e: unconfigure::ApplyError) -> Exit {
    match e {
        unconfigure::ApplyError::Io { .. } => Exit::env(e),
        e => Exit::invalid(e),
    }
}

fn default_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("gpufence-runtime")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("/usr/bin/gpufence-runtime"))
}

/// The real runtime gpufence-runtime will exec (`runtime.path` of the configuration it reads:
/// GPUFENCE_CONFIG, else /etc/gpufence/config.toml; else runc or crun on PATH), asked for its
/// version with an empty environment under `timeouts.worker`; a release with a known container
/// escape is refused unless `allow` (then a warning on stderr). (`--config` after `configure`
/// names the engine's file, so gpufence-runtime's own lookup is used here.) For a host whose
/// root is mounted at `root` (not `/`: `gpufence install`), the host's configuration and runtime,
/// run chrooted there.
pub fn check_real_runtime(root: &Path, allow: bool) -> Result<(), Exit> {
    use super::vulnerable::{Verdict, judge};
    let here = root == Path::new("/");
    let cfg = if here {
        crate::config::Config::load(None).map_err(Exit::invalid)?
    } else {
        let p = super::configure::in_root(root, Path::new(crate::config::DEFAULT_CONFIG_PATH));
        match std::fs::read_to_string(&p) {
            Ok(t) => crate::config::Config::from_toml(&t, &p).map_err(Exit::invalid)?,
            Err(_) => crate::config::Config::default(),
        }
    };
    let rt = if here {
        super::real_runtime(&cfg)?
    } else {
        match host_runtime(root, &cfg) {
            Ok(rt) => rt,
            Err(e) if allow => {
                eprintln!("warning: {} (--allow-vulnerable-runtime)", e.message);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    };
    let what = format!("{} --version", rt.display());
    let mut cmd = std::process::Command::new(&rt);
    cmd.arg("--version").env_clear();
    if !here {
        chroot_into(&mut cmd, root)?;
    }
    let out = crate::child::output_with_deadline(
        &what,
        &mut cmd,
        cfg.timeouts.worker(),
        crate::child::MAX_OUTPUT,
    );
    let problem = match out {
        Err(e) => format!("cannot check the real runtime: {e}"),
        Ok(f) if !f.success() => format!("cannot check the real runtime: {what}: {}", f.describe()),
        Ok(f) => match judge(&String::from_utf8_lossy(&f.out)) {
            Verdict::Fixed { .. } => return Ok(()),
            Verdict::Unknown(why) => {
                eprintln!("warning: {}: {why}", rt.display());
                return Ok(());
            }
            Verdict::Vulnerable(line) => format!("{}: {line}", rt.display()),
        },
    };
    if allow {
        eprintln!("warning: {problem} (--allow-vulnerable-runtime)");
        Ok(())
    } else {
        Err(Exit::env(format!(
            "{problem}; upgrade it (or set runtime.path to a fixed one), or pass \
             --allow-vulnerable-runtime"
        )))
    }
}

/// The host's runc or crun (as the host sees it): `runtime.path`, else the first under `root` in
/// the usual directories.
fn host_runtime(root: &Path, cfg: &crate::config::Config) -> Result<PathBuf, Exit> {
    if let Some(p) = &cfg.runtime.path {
        return Ok(p.clone());
    }
    let dirs = [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ];
    ["runc", "crun"]
        .iter()
        .flat_map(|n| dirs.iter().map(move |d| Path::new(d).join(n)))
        .find(|p| super::configure::in_root(root, p).is_file())
        .ok_or_else(|| Exit::env(format!("{}: no runc or crun in the host", root.display())))
}

/// Make `cmd` run with `root` as its root directory (chroot in the child before exec).
pub fn chroot_into(cmd: &mut std::process::Command, root: &Path) -> Result<(), Exit> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let root = std::ffi::CString::new(root.as_os_str().as_bytes())
        .map_err(|_| Exit::invalid(format!("{}: NUL in path", root.display())))?;
    // SAFETY: the closure runs in the forked child before exec and only calls chroot(2) and
    // chdir(2) (async-signal-safe) on C strings prepared before the fork; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::chroot(root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}
