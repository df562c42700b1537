//! `gpufence hook prestart|create-runtime|poststop|install|update-ldcache|memory-limits`.
use std::path::{Path, PathBuf};

use crate::exit::Exit;

#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// OCI prestart hook (state JSON on stdin): enforce the allocation in the container.
    Prestart,
    /// OCI createRuntime hook (state JSON on stdin): same as prestart.
    CreateRuntime,
    /// OCI poststop hook (state JSON on stdin): remove the container's state directory.
    Poststop,
    /// Write the hooks.d drop-ins naming this binary.
    Install {
        /// hooks.d directory (e.g. /usr/share/containers/oci/hooks.d, /etc/containers/oci/hooks.d).
        #[arg(long)]
        dir: PathBuf,
        /// Binary named in the drop-ins (default: this executable).
        #[arg(long)]
        binary: Option<PathBuf>,
        /// Stage to run at.
        #[arg(long, value_parser = ["prestart", "createRuntime"], default_value = "prestart")]
        stage: String,
    },
    /// createRuntime hook (state JSON on stdin): set NVML memory limits on the container's
    /// cgroup (quota.backend driver/both); refuses the container when they cannot be set.
    MemoryLimits {
        /// `GPU-<uuid>=<bytes>`; repeatable.
        #[arg(long = "limit")]
        limit: Vec<String>,
    },
    /// createContainer hook: refresh the container's ld cache.
    UpdateLdcache {
        /// Directory (inside the container) holding mounted driver libraries; repeatable.
        #[arg(long = "folder")]
        folder: Vec<String>,
    },
}

pub fn run(config: Option<&Path>, cmd: Cmd) -> Result<(), Exit> {
    match cmd {
        Cmd::Prestart => crate::hook::enforce(
            config,
            crate::hook::Stage::Prestart,
            &mut std::io::stdin().lock(),
        ),
        Cmd::CreateRuntime => crate::hook::enforce(
            config,
            crate::hook::Stage::CreateRuntime,
            &mut std::io::stdin().lock(),
        ),
        Cmd::Poststop => crate::hook::poststop(config, &mut std::io::stdin().lock()),
        Cmd::Install { dir, binary, stage } => install(config, &dir, binary, &stage),
        Cmd::UpdateLdcache { folder } => {
            let raw = crate::hook::state::read_oci_state(&mut std::io::stdin().lock())
                .map_err(Exit::invalid)?;
            let st = crate::hook::state::parse_ldcache_state(&raw).map_err(Exit::invalid)?;
            let (_, rootfs) = crate::hook::state::read_config(&st.bundle).map_err(Exit::invalid)?;
            crate::enter::ldcache::run(config, &st.id, &rootfs, &folder)
        }
        Cmd::MemoryLimits { limit } => {
            crate::hook::limits::hook_main(config, &limit, &mut std::io::stdin().lock())
        }
    }
}

fn install(
    config: Option<&Path>,
    dir: &Path,
    binary: Option<PathBuf>,
    stage: &str,
) -> Result<(), Exit> {
    let cfg = crate::config::Config::load(config)?;
    let binary = match binary {
        Some(b) => b,
        None => std::env::current_exe()
            .and_then(|p| p.canonicalize())
            .map_err(|e| Exit::env(format!("hook install: locating this binary: {e}")))?,
    };
    if !binary.is_absolute() {
        return Err(Exit::invalid(format!(
            "hook install: --binary {}: must be an absolute path",
            binary.display()
        )));
    }
    let stage = if stage == "createRuntime" {
        crate::hook::Stage::CreateRuntime
    } else {
        crate::hook::Stage::Prestart
    };
    // Name the config file only when one was chosen explicitly (else the default applies).
    let cfg_path = config.map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()));
    let written = crate::hook::install::install(&cfg, dir, &binary, cfg_path.as_deref(), stage)
        .map_err(|e| Exit::env(format!("hook install: {}: {e}", dir.display())))?;
    if written.is_empty() {
        eprintln!("gpufence: no allocation dialect enabled: no hook installed");
    }
    for p in written {
        println!("{}", p.display());
    }
    Ok(())
}
