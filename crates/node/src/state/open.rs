//! Bounded reads of the state directory's files: opened with `openat2` beneath a directory
//! handle, never through a symlink or magic link, regular files only, at most a known size. The
//! state writer's own readers ([`super::refusals`]) and `gpufence ps` read through these.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};

fn io(e: nix::errno::Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}

pub fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// `O_PATH` handle and identity of a regular file `rel` beneath `dir`.
pub fn regular(
    dir: impl AsFd,
    rel: &str,
    resolve: ResolveFlag,
) -> std::io::Result<(OwnedFd, u64, u64, u64)> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(resolve);
    let fd = openat2(dir, rel, how).map_err(io)?;
    let st = nix::sys::stat::fstat(&fd).map_err(io)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(invalid("not a regular file"));
    }
    Ok((fd, st.st_dev, st.st_ino, st.st_size.max(0) as u64))
}

/// Contents of the regular file `rel` beneath `dir`, at most `max` bytes (else an error).
pub fn read_bounded(
    dir: impl AsFd,
    rel: &str,
    resolve: ResolveFlag,
    max: usize,
) -> std::io::Result<Vec<u8>> {
    read_regular(dir, rel, resolve, max, false)
}

/// The first `max` bytes (or fewer) of the regular file `rel` beneath `dir`: the accounting
/// file may hold further sections after the region (the compute limiter's).
pub fn read_prefix(
    dir: impl AsFd,
    rel: &str,
    resolve: ResolveFlag,
    max: usize,
) -> std::io::Result<Vec<u8>> {
    read_regular(dir, rel, resolve, max, true)
}

fn read_regular(
    dir: impl AsFd,
    rel: &str,
    resolve: ResolveFlag,
    max: usize,
    prefix: bool,
) -> std::io::Result<Vec<u8>> {
    let (path_fd, dev, ino, size) = regular(dir, rel, resolve)?;
    if size > max as u64 && !prefix {
        return Err(invalid("larger than expected"));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", path_fd.as_raw_fd()))?;
    let st = nix::sys::stat::fstat(&f).map_err(io)?;
    if (st.st_dev, st.st_ino) != (dev, ino) {
        return Err(invalid("replaced while opening"));
    }
    let mut out = Vec::with_capacity(size.min(max as u64) as usize);
    f.take(max as u64 + u64::from(!prefix))
        .read_to_end(&mut out)?;
    if out.len() > max {
        return Err(invalid("larger than expected"));
    }
    Ok(out)
}
