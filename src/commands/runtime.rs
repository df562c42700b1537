//! `gpufence runtime configure|unconfigure --runtime containerd|crio|docker [--config PATH]
//! [--dry-run] [--record-dir DIR]`.
use std::path::{Path, PathBuf};

use crate::exit::Exit;

use crate::engines::configure::{Engine, Mode};
use crate::engines::unconfigure::{self, Target};
use crate::engines::{apply_exit, check_real_runtime};

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
            report.push(crate::engines::configure::trust_mode_line(&cfg));
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
    match t.engine.config().cdi_dirs(&t.root, &t.config) {
        Ok(Some(dirs)) => crate::engines::cdi_dirs::disagreement(cfg, t.engine, &dirs),
        Ok(None) => None,
        Err(e) => Some(format!(
            "CDI directories: {}'s cdi_spec_dirs cannot be read ({e}); gpufence resolves CDI \
             devices from cdi.spec-dirs",
            t.engine.name()
        )),
    }
}

fn default_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("gpufence-runtime")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("/usr/bin/gpufence-runtime"))
}
