//! `gpufence runtime configure --runtime containerd|crio|docker [--config PATH] [--dry-run]`.
use std::path::{Path, PathBuf};

use crate::exit::Exit;

use super::configure::{self, Engine};

#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// Register gpufence-runtime as the `gpufence` runtime handler of containerd, CRI-O or
    /// docker, keeping the operator's files and comments.
    Configure(ConfigureArgs),
}

#[derive(clap::Args, Debug)]
pub struct ConfigureArgs {
    /// The container engine to configure.
    #[arg(long, value_enum)]
    pub runtime: Engine,
    /// The engine's main configuration file (default /etc/containerd/config.toml,
    /// /etc/crio/crio.conf, /etc/docker/daemon.json). Here `--config` names the engine's file,
    /// not gpufence's.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the files that would be written instead of writing them.
    #[arg(long)]
    pub dry_run: bool,
    /// The gpufence-runtime binary to register (default: next to this binary, else
    /// /usr/bin/gpufence-runtime).
    #[arg(long)]
    pub runtime_binary: Option<PathBuf>,
    /// Name of the runtime handler (the RuntimeClass `handler`).
    #[arg(long, default_value = "gpufence")]
    pub handler: String,
}

pub fn run(_gpufence_config: Option<&Path>, cmd: Cmd) -> Result<(), Exit> {
    let Cmd::Configure(a) = cmd;
    let binary = a.runtime_binary.clone().unwrap_or_else(default_binary);
    let engine_config = a
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from(a.runtime.default_config()));
    let writes = configure::plan_writes(a.runtime, &engine_config, &binary, &a.handler)
        .map_err(Exit::invalid)?;
    for w in &writes {
        if a.dry_run {
            println!("# {} (dry run: not written)", w.path.display());
            print!("{}", w.contents);
            if !w.contents.ends_with('\n') {
                println!();
            }
        } else if w.unchanged {
            println!("{}: already up to date", w.path.display());
        } else {
            configure::write(w).map_err(|e| Exit::env(format!("{}: {e}", w.path.display())))?;
            println!("wrote {}", w.path.display());
        }
    }
    if !a.dry_run {
        println!("{}", a.runtime.restart_hint());
    }
    Ok(())
}

fn default_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("gpufence-runtime")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("/usr/bin/gpufence-runtime"))
}
