//! `gpufence install|uninstall --host-root DIR --runtime containerd|crio|docker [--mode
//! runtime|nri] [--dry-run]`.
use std::path::{Path, PathBuf};

use crate::engines::configure::{Engine, Mode};
use crate::engines::install::{Options, Restart, Sources};
use crate::exit::Exit;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The host's root directory as mounted here (`/host` in the DaemonSet, `/` on the node).
    #[arg(long)]
    pub host_root: PathBuf,
    /// The container engine to register gpufence-runtime with.
    #[arg(long, value_enum)]
    pub runtime: Engine,
    /// The engine's main configuration as the host sees it (default /etc/containerd/config.toml,
    /// /etc/crio/crio.conf, /etc/docker/daemon.json).
    #[arg(long)]
    pub runtime_config: Option<PathBuf>,
    /// Name of the runtime handler (the RuntimeClass `handler`), or with `--mode nri` of the
    /// NRI plugin (what the validator requires).
    #[arg(long, default_value = "gpufence")]
    pub handler: String,
    /// The applier: `runtime` (the runtime handler) or `nri` (containerd ≥ 2.2: the
    /// pre-registered NRI plugin `<plugin_path>/90-<handler>`, NRI enabled and its default
    /// validator requiring the plugin).
    #[arg(long, value_enum, default_value = "runtime")]
    pub mode: Mode,
    /// Directory holding the `gpufence` and `gpufence-runtime` to install (default: this
    /// binary's; the shim from `../lib/gpufence/` or beside them).
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// How to restart the engine when its configuration changed.
    #[arg(long, value_enum, default_value = "auto")]
    pub restart: Restart,
    /// Print what would be done; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// install: then keep running until SIGTERM or SIGINT (the DaemonSet's container, whose
    /// preStop hook runs `uninstall`).
    #[arg(long)]
    pub wait: bool,
    /// install: even in front of a runc/crun release with known container escapes (a warning
    /// instead of a refusal).
    #[arg(long)]
    pub allow_vulnerable_runtime: bool,
}

impl Args {
    fn options(self) -> Result<Options, Exit> {
        let bin_dir = match self.from {
            Some(d) => d,
            None => std::env::current_exe()
                .map_err(|e| Exit::env(format!("current_exe: {e}")))?
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("/usr/bin")),
        };
        Ok(Options {
            engine_config: self
                .runtime_config
                .unwrap_or_else(|| PathBuf::from(self.runtime.default_config())),
            host_root: self.host_root,
            engine: self.runtime,
            handler: self.handler,
            sources: Sources::beside(&bin_dir),
            restart: self.restart,
            dry_run: self.dry_run,
            allow_vulnerable_runtime: self.allow_vulnerable_runtime,
            mode: self.mode,
        })
    }
}

fn exit(e: crate::engines::install::InstallError) -> Exit {
    match e {
        crate::engines::install::InstallError::Engine(e) => crate::engines::apply_exit(e),
        crate::engines::install::InstallError::Runtime(e) => e,
        crate::engines::install::InstallError::Manifest { .. }
        | crate::engines::install::InstallError::HostRoot(_) => Exit::invalid(e),
        e => Exit::env(e),
    }
}

pub fn install(args: Args) -> Result<(), Exit> {
    use nix::sys::signal::{SigSet, Signal};
    let wait = args.wait;
    // Blocked before any work, so a SIGTERM arriving meanwhile is taken by the wait below.
    let mut stop = SigSet::empty();
    stop.add(Signal::SIGTERM);
    stop.add(Signal::SIGINT);
    if wait {
        stop.thread_block()
            .map_err(|e| Exit::env(format!("sigprocmask: {e}")))?;
    }
    let o = args.options()?;
    let report = crate::engines::install::install(&o, &mut crate::engines::install::host::RealHost)
        .map_err(exit)?;
    print(&report);
    if wait {
        use std::io::Write;
        println!("installed; waiting for SIGTERM");
        let _ = std::io::stdout().flush();
        let sig = stop
            .wait()
            .map_err(|e| Exit::env(format!("sigwait: {e}")))?;
        println!("{sig}: exiting");
    }
    Ok(())
}

pub fn uninstall(args: Args) -> Result<(), Exit> {
    if args.wait {
        return Err(Exit::invalid("--wait: only for install"));
    }
    let o = args.options()?;
    let report =
        crate::engines::install::uninstall(&o, &mut crate::engines::install::host::RealHost)
            .map_err(exit)?;
    print(&report);
    Ok(())
}

fn print(report: &[String]) {
    for l in report {
        println!("{l}");
    }
}
