//! The real OCI runtime gpufence hands over to: `runtime.path`, else the first `runc` or `crun`
//! on PATH — never gpufence-runtime itself, nor the `gpufence-runtime-wrapper` beside it that
//! runs its `create`/`run`/`delete` (an exec loop either way).

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::exit::Exit;

/// The PATH searched when the runtime's environment has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Device and inode of a file, following links as exec does.
fn file_id(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// The binaries that together are gpufence-runtime: the running one, `gpufence-runtime` (the
/// static entry) and `gpufence-runtime-wrapper` beside it, by device and inode.
fn own_binaries() -> Vec<(u64, u64)> {
    let me = Path::new("/proc/self/exe");
    let mut ids: Vec<(u64, u64)> = file_id(me).into_iter().collect();
    if let Some(dir) = std::fs::read_link(me)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        ids.extend(
            ["gpufence-runtime", "gpufence-runtime-wrapper"]
                .iter()
                .filter_map(|n| file_id(&dir.join(n))),
        );
    }
    ids
}

/// Whether `p` is this very binary or its pair beside it (the same file, by any path or hard
/// link).
pub fn is_this_binary(p: &Path) -> bool {
    file_id(p).is_some_and(|id| own_binaries().contains(&id))
}

/// Whether `p` exists and is another file than this binary and its pair.
pub fn exists_apart_from_this_binary(p: &Path) -> bool {
    file_id(p).is_some_and(|id| !own_binaries().contains(&id))
}

/// The first executable `runc`, then `crun`, on `path` (the runtime's own PATH, else
/// [`DEFAULT_PATH`]) that is not this binary.
pub fn search_path(path: Option<&OsStr>) -> Option<PathBuf> {
    let path = path.unwrap_or(OsStr::new(DEFAULT_PATH));
    let own = own_binaries();
    ["runc", "crun"].iter().find_map(|name| {
        std::env::split_paths(path).find_map(|dir| {
            let cand = dir.join(name);
            let executable = std::fs::metadata(&cand)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
            let own_binary = || file_id(&cand).is_some_and(|id| own.contains(&id));
            (executable && !own_binary()).then_some(cand)
        })
    })
}

/// The real runtime: `runtime.path`, else the first of runc, crun on PATH — never this binary.
pub fn real_runtime(cfg: &Config) -> Result<PathBuf, Exit> {
    if let Some(p) = &cfg.runtime.path {
        if is_this_binary(p) {
            return Err(Exit::invalid(format!(
                "runtime.path {} is gpufence-runtime itself",
                p.display()
            )));
        }
        return Ok(p.clone());
    }
    search_path(std::env::var_os("PATH").as_deref())
        .ok_or_else(|| Exit::env("no OCI runtime: set runtime.path or put runc or crun on PATH"))
}
