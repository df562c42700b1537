//! `gpufence runtime configure|unconfigure --runtime containerd|crio|docker [--config PATH]
//! [--dry-run] [--record-dir DIR]`.
use std::path::{Path, PathBuf};

use crate::exit::Exit;

use super::configure::Engine;
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
}

#[derive(clap::Args, Debug)]
pub struct ConfigureArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The gpufence-runtime binary to register (default: next to this binary, else
    /// /usr/bin/gpufence-runtime).
    #[arg(long)]
    pub runtime_binary: Option<PathBuf>,
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
        }
    }
}

pub fn run(_gpufence_config: Option<&Path>, cmd: Cmd) -> Result<(), Exit> {
    let (report, engine, dry_run) = match cmd {
        Cmd::Configure(a) => {
            let binary = a.runtime_binary.clone().unwrap_or_else(default_binary);
            let t = a.engine.target(binary);
            (
                unconfigure::apply_configure(&t, a.engine.dry_run).map_err(apply_exit)?,
                a.engine.runtime,
                a.engine.dry_run,
            )
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
