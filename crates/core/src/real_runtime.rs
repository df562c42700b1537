//! The real OCI runtime gpufence hands over to: `runtime.path`, else the first `runc` or `crun`
//! on PATH — never gpufence-runtime itself.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::exit::Exit;

/// The real runtime: `runtime.path`, else the first of runc, crun on PATH — never this binary.
pub fn real_runtime(cfg: &Config) -> Result<PathBuf, Exit> {
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
