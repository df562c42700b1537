//! Bind mounts across mount namespaces with the new mount API.
//!
//! Host sources are cloned into detached mount trees (`open_tree(OPEN_TREE_CLONE)`) while the
//! hook is still in the host's mount namespace, their attributes (read-only, nosuid, nodev) are
//! set on the detached tree (`mount_setattr`), and after `setns` into the container's mount
//! namespace each tree is attached onto an `O_PATH` fd of a target resolved inside the rootfs
//! (`move_mount`). No host path is looked up after `setns` and no container path is looked up
//! by name at mount time.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;

const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x04;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
const MOUNT_ATTR_RDONLY: u64 = 0x01;
const MOUNT_ATTR_NOSUID: u64 = 0x02;
const MOUNT_ATTR_NODEV: u64 = 0x04;
const MOUNT_ATTR_NOEXEC: u64 = 0x08;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mount source {path}: {op}: {errno}")]
    Source {
        path: String,
        op: &'static str,
        errno: Errno,
    },
    #[error("mount onto {path}: {errno}")]
    Attach { path: String, errno: Errno },
    #[error("mount {path}: unsupported option {option:?} (the hook only makes bind mounts)")]
    Option { path: String, option: String },
}

/// Attributes of a bind mount, parsed from CDI/OCI mount options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attrs {
    pub readonly: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
    pub recursive: bool,
}

impl Attrs {
    /// Parse mount options. Propagation options are accepted and ignored (the hook's mounts are
    /// private to the container); anything that is not a bind mount is refused.
    pub fn parse(path: &str, kind: Option<&str>, options: &[String]) -> Result<Attrs, MountError> {
        if let Some(k) = kind
            && !k.is_empty()
            && k != "bind"
            && k != "none"
        {
            return Err(MountError::Option {
                path: path.to_string(),
                option: format!("type={k}"),
            });
        }
        let mut a = Attrs::default();
        for o in options {
            match o.as_str() {
                "ro" => a.readonly = true,
                "rw" => a.readonly = false,
                "nosuid" => a.nosuid = true,
                "suid" => a.nosuid = false,
                "nodev" => a.nodev = true,
                "dev" => a.nodev = false,
                "noexec" => a.noexec = true,
                "exec" => a.noexec = false,
                "bind" => {}
                "rbind" => a.recursive = true,
                "private" | "rprivate" | "slave" | "rslave" | "shared" | "rshared"
                | "unbindable" | "runbindable" | "relatime" | "norelatime" | "strictatime"
                | "noatime" => {}
                other => {
                    return Err(MountError::Option {
                        path: path.to_string(),
                        option: other.chars().take(64).collect(),
                    });
                }
            }
        }
        Ok(a)
    }

    fn set_bits(&self) -> u64 {
        let mut b = 0;
        if self.readonly {
            b |= MOUNT_ATTR_RDONLY;
        }
        if self.nosuid {
            b |= MOUNT_ATTR_NOSUID;
        }
        if self.nodev {
            b |= MOUNT_ATTR_NODEV;
        }
        if self.noexec {
            b |= MOUNT_ATTR_NOEXEC;
        }
        b
    }
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A host file or directory cloned into a detached mount, ready to attach.
#[derive(Debug)]
pub struct Detached {
    pub host_path: String,
    pub is_dir: bool,
    tree: OwnedFd,
}

impl Detached {
    /// A stand-in for tests of the order of operations ([`super::sys::RecordingNs`]): no
    /// mount behind it.
    pub fn stand_in(host_path: &str, is_dir: bool) -> std::io::Result<Detached> {
        Ok(Detached {
            host_path: host_path.to_string(),
            is_dir,
            tree: std::fs::File::open("/dev/null")?.into(),
        })
    }
}

/// Clone `host` (in the caller's mount namespace) into a detached bind mount with `attrs`.
pub fn detach(host: &Path, attrs: Attrs) -> Result<Detached, MountError> {
    let shown = host.display().to_string();
    let err = |op, errno| MountError::Source {
        path: shown.clone(),
        op,
        errno,
    };
    let meta = std::fs::metadata(host).map_err(|e| {
        err(
            "stat",
            Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        )
    })?;
    let c = std::ffi::CString::new(host.as_os_str().as_encoded_bytes())
        .map_err(|_| err("path", Errno::EINVAL))?;
    let mut flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC;
    if attrs.recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: c is a valid NUL-terminated path; the syscall returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(err("open_tree", Errno::last()));
    }
    // SAFETY: fd is a fresh fd owned by us.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let attr = MountAttr {
        attr_set: attrs.set_bits(),
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: 0,
    };
    let mut at = libc::AT_EMPTY_PATH as libc::c_uint;
    if attrs.recursive {
        at |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: tree is a valid fd, "" with AT_EMPTY_PATH names it; attr is a live repr(C) struct.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            at,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(err("mount_setattr", Errno::last()));
    }
    Ok(Detached {
        host_path: shown,
        is_dir: meta.is_dir(),
        tree,
    })
}

impl Detached {
    /// A detached mount made another way (a tmpfs from `fsmount`).
    pub(super) fn from_tree(host_path: String, is_dir: bool, tree: OwnedFd) -> Detached {
        Detached {
            host_path,
            is_dir,
            tree,
        }
    }

    /// Attach onto `target` (an fd of the target in the caller's mount namespace).
    pub fn attach(self, target: &OwnedFd, shown: &str) -> Result<(), MountError> {
        // SAFETY: both fds are valid; empty paths with the *_EMPTY_PATH flags name the fds.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                self.tree.as_raw_fd(),
                c"".as_ptr(),
                target.as_raw_fd(),
                c"".as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
            )
        };
        if r < 0 {
            return Err(MountError::Attach {
                path: shown.to_string(),
                errno: Errno::last(),
            });
        }
        Ok(())
    }
}

/// Mount points (with their optional fields) of the caller's mount namespace at or under
/// `prefix` that are shared: a mount made below them would propagate to other namespaces,
/// possibly the host's.
pub fn shared_mounts_under(mountinfo: &str, prefix: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 7 {
            continue;
        }
        let mp = unescape(f[4]);
        let opt_end = f.iter().position(|x| *x == "-").unwrap_or(f.len());
        let shared = f[6..opt_end].iter().any(|o| o.starts_with("shared:"));
        if shared && Path::new(&mp).starts_with(prefix) {
            out.push(mp);
        }
    }
    out
}

fn unescape(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) =
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("x"), 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let o = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = Attrs::parse("/x", None, &o(&["ro", "nosuid", "nodev", "bind"])).unwrap();
        assert!(a.readonly && a.nosuid && a.nodev && !a.noexec && !a.recursive);
        assert!(Attrs::parse("/x", Some("tmpfs"), &o(&[])).is_err());
        let e = Attrs::parse("/x", None, &o(&["remount"])).unwrap_err();
        assert!(e.to_string().contains("remount"));
        assert!(
            Attrs::parse("/x", Some("bind"), &o(&["rbind", "rprivate"]))
                .unwrap()
                .recursive
        );
    }

    #[test]
    fn finds_shared_mounts_under_rootfs() {
        let mi = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 8:1 /r /var/lib/c/rootfs rw master:1 - ext4 /dev/vda rw
41 40 0:5 / /var/lib/c/rootfs/dev rw,nosuid - tmpfs tmpfs rw
42 40 0:6 / /var/lib/c/rootfs/mnt\\040x rw shared:7 - tmpfs tmpfs rw
43 22 0:7 / /var/lib/c/rootfs2 rw shared:8 - tmpfs tmpfs rw
";
        assert_eq!(
            shared_mounts_under(mi, Path::new("/var/lib/c/rootfs")),
            vec!["/var/lib/c/rootfs/mnt x".to_string()]
        );
    }
}
