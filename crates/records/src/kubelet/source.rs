//! Opening kubelet's checkpoint: a host file read by a root process on the container-create
//! path, so it is opened inside its directory without following any symlink
//! (`openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`), must be a regular file that only root (or
//! this user) can write, and is read up to [`super::checkpoint::MAX_BYTES`].

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};

use super::checkpoint::MAX_BYTES;

/// The clause [`read_checkpoint`] answers when the file does not exist (a caller may treat a
/// missing file apart from an unreadable one).
pub const MISSING: &str = "does not exist";

/// The checkpoint's bytes, or why they cannot be read (one clause, for the refusal line).
/// Also kubelet's DRA state ([`super::dra::load`]), under the same bound.
pub fn read_checkpoint(path: &Path) -> Result<Vec<u8>, String> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err("not a file path".into());
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let dfd = nix::fcntl::open(
        dir,
        OFlag::O_DIRECTORY | OFlag::O_PATH | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| format!("directory {}: {}", dir.display(), e.desc()))?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    let fd = nix::fcntl::openat2(dfd.as_fd(), name, how).map_err(|e| match e {
        nix::errno::Errno::ENOENT => MISSING.to_string(),
        nix::errno::Errno::ELOOP => "is a symlink (not followed)".to_string(),
        e => e.desc().to_string(),
    })?;
    let mut f = std::fs::File::from(fd);
    let md = f.metadata().map_err(|e| e.to_string())?;
    if !md.is_file() {
        return Err("not a regular file".into());
    }
    let euid = nix::unistd::geteuid().as_raw();
    if md.uid() != 0 && md.uid() != euid {
        return Err(format!("owned by uid {}, not root", md.uid()));
    }
    if md.mode() & 0o002 != 0 {
        return Err(format!(
            "writable by everyone (mode {:o})",
            md.mode() & 0o7777
        ));
    }
    if md.len() > MAX_BYTES {
        return Err(format!(
            "{} bytes, more than the {MAX_BYTES} accepted",
            md.len()
        ));
    }
    let mut bytes = Vec::with_capacity(md.len() as usize);
    (&mut f)
        .take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(format!("grew past the {MAX_BYTES} bytes accepted"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn symlinks_fifos_world_writable_and_huge_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let good = d.path().join("cp");
        std::fs::write(&good, b"{}").unwrap();
        assert_eq!(read_checkpoint(&good).unwrap(), b"{}");

        let outside = tempfile::NamedTempFile::new().unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        assert!(read_checkpoint(&link).unwrap_err().contains("symlink"));
        let inner = d.path().join("inner");
        std::os::unix::fs::symlink("cp", &inner).unwrap();
        assert!(read_checkpoint(&inner).unwrap_err().contains("symlink"));

        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(read_checkpoint(&fifo).unwrap_err().contains("regular"));

        let ww = d.path().join("ww");
        std::fs::write(&ww, b"{}").unwrap();
        std::fs::set_permissions(&ww, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(read_checkpoint(&ww).unwrap_err().contains("everyone"));

        let big = d.path().join("big");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(100 << 20).unwrap();
        assert!(read_checkpoint(&big).unwrap_err().contains("more than"));

        assert!(
            read_checkpoint(&d.path().join("missing"))
                .unwrap_err()
                .contains("does not exist")
        );
    }
}
