//! Ground: the one atomic writer every file gpufence writes goes through (`config.json`, CDI
//! specs, the inventory cache, host files): a temporary beside the target created
//! `O_CREAT|O_EXCL|O_NOFOLLOW`, then `rename`, so a reader sees the old or the new file and a
//! planted symlink is replaced, never followed; and the state directory's creation (`state-dir`,
//! 0711).

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// How [`write_atomic`] leaves the file.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Permission bits.
    pub mode: u32,
    /// uid/gid to give it (`None`: the writer's).
    pub owner: Option<(u32, u32)>,
    /// `fsync` before the rename (files that must survive a crash: CDI specs, the cache).
    pub sync: bool,
}

/// Create `state-dir` if missing, mode 0711: host users may not list it.
pub fn create_state_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if path.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(path)
}

/// Write `path` atomically: a temporary beside it (`O_EXCL|O_NOFOLLOW`, so nothing planted there
/// is followed), the mode and owner set on it, then `rename` over the target.
pub fn write_atomic(path: &Path, bytes: &[u8], opts: Options) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.gpufence-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mode = opts.mode & 0o7777;
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if let Some((uid, gid)) = opts.owner {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
        }
        // umask may have masked the mode.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        if opts.sync {
            f.sync_all()?;
        }
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Replace an existing file (`config.json`) atomically, keeping its mode and owner.
pub fn replace_keeping_mode(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let meta = std::fs::metadata(path)?;
    write_atomic(
        path,
        bytes,
        Options {
            mode: meta.permissions().mode(),
            owner: Some((meta.uid(), meta.gid())),
            sync: false,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_keeps_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config.json");
        std::fs::write(&p, b"{}").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        replace_keeping_mode(&p, b"{\"a\":1}").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{\"a\":1}");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o640
        );
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn state_dir_is_not_listable_by_host_users() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a/state");
        create_state_dir(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o711
        );
        create_state_dir(&p).unwrap();
    }
}
