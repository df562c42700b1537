//! A detached tmpfs (new mount API: `fsopen`/`fsconfig`/`fsmount`), made host-side and attached
//! inside the container like the bind mounts: the container's `/run/gpufence` (see
//! `plan::state_tmpfs`), so hook mode gives the container the same bounded space as runc does.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

use super::mounts::{Detached, MountError};

const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOUNT_ATTR_NOSUID: libc::c_uint = 0x02;
const MOUNT_ATTR_NODEV: libc::c_uint = 0x04;
const MOUNT_ATTR_NOEXEC: libc::c_uint = 0x08;

/// Make a detached tmpfs from OCI-style options: `nosuid`, `nodev`, `noexec` and the tmpfs
/// parameters `mode=`, `size=`, `nr_inodes=`; anything else is refused. The mount is always
/// nosuid, nodev and noexec.
pub fn detach_tmpfs(path: &str, options: &[String]) -> Result<Detached, MountError> {
    let err = |op, errno| MountError::Source {
        path: "tmpfs".into(),
        op,
        errno,
    };
    let mut params: Vec<(CString, CString)> = Vec::new();
    for o in options {
        match o.split_once('=') {
            None if matches!(o.as_str(), "nosuid" | "nodev" | "noexec") => {}
            Some((k @ ("mode" | "size" | "nr_inodes"), v)) => {
                let (Ok(k), Ok(v)) = (CString::new(k), CString::new(v)) else {
                    return Err(err("fsconfig", Errno::EINVAL));
                };
                params.push((k, v));
            }
            _ => {
                return Err(MountError::Option {
                    path: path.to_string(),
                    option: o.chars().take(64).collect(),
                });
            }
        }
    }
    // SAFETY: "tmpfs" is a NUL-terminated string; the syscall returns a new fd or -1.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) };
    if fs < 0 {
        return Err(err("fsopen", Errno::last()));
    }
    // SAFETY: fs is a fresh fd owned by us.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
    for (k, v) in &params {
        // SAFETY: fs is valid; k and v are NUL-terminated strings that outlive the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                k.as_ptr(),
                v.as_ptr(),
                0,
            )
        };
        if r < 0 {
            return Err(err("fsconfig", Errno::last()));
        }
    }
    // SAFETY: fs is valid; CMD_CREATE takes no key or value.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if r < 0 {
        return Err(err("fsconfig create", Errno::last()));
    }
    let attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
    // SAFETY: fs is a configured filesystem context; returns a new mount fd or -1.
    let m = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) };
    if m < 0 {
        return Err(err("fsmount", Errno::last()));
    }
    // SAFETY: m is a fresh fd owned by us.
    let tree = unsafe { OwnedFd::from_raw_fd(m as i32) };
    Ok(Detached::from_tree("tmpfs".into(), true, tree))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_unknown_options() {
        let o = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for bad in ["exec", "uid=0", "huge=always", "size"] {
            let e = detach_tmpfs("/run/gpufence", &o(&[bad])).unwrap_err();
            assert!(matches!(e, MountError::Option { .. }), "{bad}: {e}");
        }
    }
}
