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
    /// Register gpufence even in front of a runc/crun release with known container escapes
    /// (printed as a warning instead of refused).
    #[arg(long)]
    pub allow_vulnerable_runtime: bool,
}

pub fn run(_gpufence_config: Option<&Path>, cmd: Cmd) -> Result<(), Exit> {
    let Cmd::Configure(a) = cmd;
    check_real_runtime(a.allow_vulnerable_runtime)?;
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

/// The real runtime gpufence-runtime will exec (`runtime.path` of the configuration it reads:
/// GPUFENCE_CONFIG, else /etc/gpufence/config.toml; else runc or crun on PATH), asked for its
/// version with an empty environment under `timeouts.worker`; a release with a known container
/// escape is refused unless `allow` (then a warning on stderr). (`--config` after `configure`
/// names the engine's file, so gpufence-runtime's own lookup is used here.)
fn check_real_runtime(allow: bool) -> Result<(), Exit> {
    use super::vulnerable::{Verdict, judge};
    let cfg = crate::config::Config::load(None).map_err(Exit::invalid)?;
    let rt = super::real_runtime(&cfg)?;
    let what = format!("{} --version", rt.display());
    let out = crate::child::output_with_deadline(
        &what,
        std::process::Command::new(&rt).arg("--version").env_clear(),
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
