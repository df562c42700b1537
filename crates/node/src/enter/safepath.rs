//! Path operations inside a container rootfs that never leave it.
//!
//! Every lookup goes through `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` from an fd of the
//! rootfs, so an absolute symlink (`/usr/lib64 -> /`) or `..` in the image resolves against the
//! rootfs, as it will once the container has pivoted into it. Creation happens with `*at` calls
//! on an fd of an already-resolved parent and a single final name, and the final component is
//! never followed: a symlink the image put where gpufence must create something is replaced
//! (it is the container's own entry), so the result lands exactly at the requested path.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat, openat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, makedev, mkdirat, mknodat};
use nix::unistd::{UnlinkatFlags, unlinkat};

#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("container path {path:?}: {why}")]
    Invalid { path: String, why: &'static str },
    #[error("container path {path:?}: {op}: {errno}")]
    Sys {
        path: String,
        op: &'static str,
        errno: Errno,
    },
    #[error("container path {path:?}: exists as {found}, expected {want}")]
    WrongType {
        path: String,
        found: &'static str,
        want: &'static str,
    },
}

/// The components of an absolute container path. Refused: relative paths, `..`, `.`, empty
/// components other than a trailing slash, NUL, and paths longer than `PATH_MAX`.
pub fn components(path: &str) -> Result<Vec<&str>, PathError> {
    let bad = |why| PathError::Invalid {
        path: path.chars().take(256).collect(),
        why,
    };
    if path.len() >= libc::PATH_MAX as usize {
        return Err(bad("too long"));
    }
    if path.contains('\0') {
        return Err(bad("contains NUL"));
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(bad("not absolute"));
    };
    let mut out = Vec::new();
    for c in rest.split('/') {
        match c {
            "" => continue,
            "." | ".." => return Err(bad("contains a '.' or '..' component")),
            c => out.push(c),
        }
    }
    Ok(out)
}

fn kind_name(st: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFREG => "a regular file",
        SFlag::S_IFLNK => "a symlink",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        SFlag::S_IFIFO => "a fifo",
        SFlag::S_IFSOCK => "a socket",
        _ => "unknown",
    }
}

fn file_type(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// What to create at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    Dir,
    File,
    /// Character or block device (`S_IFCHR`/`S_IFBLK`), major, minor, mode bits.
    Device(SFlag, u64, u64, u32),
}

/// An open container rootfs.
pub struct Root {
    fd: OwnedFd,
}

impl Root {
    /// Wrap an fd of the rootfs directory.
    pub fn new(fd: OwnedFd) -> Root {
        Root { fd }
    }

    /// Open a rootfs directory by host path (the caller's mount namespace).
    pub fn open(path: &std::path::Path) -> Result<Root, PathError> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| PathError::Sys {
            path: path.display().to_string(),
            op: "open rootfs",
            errno,
        })?;
        Ok(Root { fd })
    }

    fn how(flags: OFlag) -> OpenHow {
        OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS)
    }

    /// Resolve `comps` inside the root, following symlinks only within it.
    fn resolve_dir(&self, comps: &[&str], shown: &str) -> Result<OwnedFd, Errno> {
        let rel = if comps.is_empty() {
            ".".to_string()
        } else {
            comps.join("/")
        };
        let _ = shown;
        openat2(
            &self.fd,
            rel.as_str(),
            Self::how(OFlag::O_PATH | OFlag::O_DIRECTORY),
        )
    }

    /// Resolve an existing path (following in-root symlinks) to an `O_PATH` fd.
    pub fn resolve(&self, path: &str) -> Result<OwnedFd, PathError> {
        let comps = components(path)?;
        let rel = if comps.is_empty() {
            ".".to_string()
        } else {
            comps.join("/")
        };
        openat2(&self.fd, rel.as_str(), Self::how(OFlag::O_PATH)).map_err(|errno| PathError::Sys {
            path: path.to_string(),
            op: "resolve",
            errno,
        })
    }

    /// `mkdir -p` inside the root; returns an fd of the (resolved) directory.
    pub fn mkdir_all(&self, path: &str) -> Result<OwnedFd, PathError> {
        let comps = components(path)?;
        self.mkdir_comps(&comps, path)
    }

    fn mkdir_comps(&self, comps: &[&str], path: &str) -> Result<OwnedFd, PathError> {
        let sys = |op, errno| PathError::Sys {
            path: path.to_string(),
            op,
            errno,
        };
        let mut cur = self
            .resolve_dir(&[], path)
            .map_err(|e| sys("open root", e))?;
        for i in 0..comps.len() {
            match self.resolve_dir(&comps[..=i], path) {
                Ok(fd) => cur = fd,
                Err(Errno::ENOENT) => {
                    // `cur` is the resolved parent; create the single missing name there.
                    match mkdirat(&cur, comps[i], Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(sys("mkdir", e)),
                    }
                    // A dangling symlink gives EEXIST above and ENOENT again here: refused.
                    cur = self
                        .resolve_dir(&comps[..=i], path)
                        .map_err(|e| sys("resolve after mkdir", e))?;
                }
                Err(e) => return Err(sys("resolve", e)),
            }
        }
        Ok(cur)
    }

    /// Make sure `path` exists as `node` and return an `O_PATH` fd of it (not following a
    /// final symlink). Parents are created; an image symlink at the final name is replaced;
    /// an existing entry of another type is an error (an existing device node with other
    /// numbers is replaced).
    pub fn ensure(&self, path: &str, node: Node) -> Result<OwnedFd, PathError> {
        let comps = components(path)?;
        let Some((name, parent)) = comps.split_last() else {
            return Err(PathError::Invalid {
                path: path.to_string(),
                why: "is the root",
            });
        };
        let sys = |op, errno| PathError::Sys {
            path: path.to_string(),
            op,
            errno,
        };
        let pfd = self.mkdir_comps(parent, path)?;
        let name = OsStr::new(name);
        for _ in 0..3 {
            match fstatat(&pfd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
                Err(Errno::ENOENT) => create(&pfd, name, node).map_err(|e| sys("create", e))?,
                Err(e) => return Err(sys("stat", e)),
                Ok(st) => {
                    let t = file_type(&st);
                    let fits = match node {
                        Node::Dir => t == SFlag::S_IFDIR,
                        Node::File => t == SFlag::S_IFREG,
                        Node::Device(k, ma, mi, _) => t == k && st.st_rdev == makedev(ma, mi),
                    };
                    if fits {
                        let fd = openat(
                            &pfd,
                            name,
                            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                            Mode::empty(),
                        )
                        .map_err(|e| sys("open", e))?;
                        let st2 = fstat(&fd).map_err(|e| sys("fstat", e))?;
                        if st2.st_ino != st.st_ino || st2.st_dev != st.st_dev {
                            continue; // replaced under us: look again
                        }
                        if let Node::Device(_, _, _, mode) = node {
                            set_mode(&pfd, name, mode).map_err(|e| sys("chmod", e))?;
                        }
                        return Ok(fd);
                    }
                    let replaceable = t == SFlag::S_IFLNK
                        || (matches!(node, Node::Device(..))
                            && matches!(t, SFlag::S_IFCHR | SFlag::S_IFBLK | SFlag::S_IFREG));
                    if !replaceable {
                        return Err(PathError::WrongType {
                            path: path.to_string(),
                            found: kind_name(&st),
                            want: match node {
                                Node::Dir => "a directory",
                                Node::File => "a regular file",
                                Node::Device(..) => "a device node",
                            },
                        });
                    }
                    unlinkat(&pfd, name, UnlinkatFlags::NoRemoveDir)
                        .map_err(|e| sys("unlink", e))?;
                }
            }
        }
        Err(sys("create", Errno::EAGAIN))
    }
}

fn set_mode(pfd: &OwnedFd, name: &OsStr, mode: u32) -> Result<(), Errno> {
    // The entry was just checked to be a device node (fchmodat cannot refuse symlinks).
    nix::sys::stat::fchmodat(
        pfd,
        name,
        Mode::from_bits_truncate(mode),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
}

fn create(pfd: &OwnedFd, name: &OsStr, node: Node) -> Result<(), Errno> {
    debug_assert!(!name.as_bytes().contains(&b'/'));
    match node {
        Node::Dir => match mkdirat(pfd, name, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => Ok(()),
            Err(e) => Err(e),
        },
        Node::File => {
            match openat(
                pfd,
                name,
                OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_WRONLY
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            ) {
                Ok(_) | Err(Errno::EEXIST) => Ok(()),
                Err(e) => Err(e),
            }
        }
        Node::Device(kind, major, minor, mode) => {
            match mknodat(
                pfd,
                name,
                kind,
                Mode::from_bits_truncate(mode),
                makedev(major, minor),
            ) {
                Ok(()) | Err(Errno::EEXIST) => set_mode(pfd, name, mode),
                Err(e) => Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn components_refuse_traversal() {
        assert_eq!(components("/dev/nvidia0").unwrap(), vec!["dev", "nvidia0"]);
        assert_eq!(components("//dev//x/").unwrap(), vec!["dev", "x"]);
        assert!(components("dev/x").is_err());
        assert!(components("/dev/../etc/shadow").is_err());
        assert!(components("/dev/./x").is_err());
        assert!(components("/dev/x\0y").is_err());
        assert!(components(&format!("/{}", "a".repeat(5000))).is_err());
    }

    fn tree() -> (tempfile::TempDir, tempfile::TempDir) {
        let host = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(host.path().join("lib")).unwrap();
        std::fs::write(host.path().join("secret"), "host").unwrap();
        (host, root)
    }

    #[test]
    fn absolute_symlink_dir_stays_in_root() {
        let (host, root) = tree();
        // usr/lib64 -> <host>/lib (absolute host path) and usr/lib -> / ; both confined.
        std::fs::create_dir_all(root.path().join("usr")).unwrap();
        symlink(host.path().join("lib"), root.path().join("usr/lib64")).unwrap();
        symlink("/", root.path().join("usr/lib")).unwrap();
        let r = Root::open(root.path()).unwrap();
        // Dangling inside the root: refused, never created on the host.
        assert!(r.ensure("/usr/lib64/libcuda.so.1", Node::File).is_err());
        let inner = root
            .path()
            .join(host.path().strip_prefix("/").unwrap())
            .join("lib");
        std::fs::create_dir_all(&inner).unwrap();
        r.ensure("/usr/lib64/libcuda.so.1", Node::File).unwrap();
        r.ensure("/usr/lib/x86_64-linux-gnu/libcuda.so.1", Node::File)
            .unwrap();
        assert!(
            std::fs::read_dir(host.path().join("lib"))
                .unwrap()
                .next()
                .is_none()
        );
        assert!(inner.join("libcuda.so.1").exists());
        assert!(root.path().join("x86_64-linux-gnu/libcuda.so.1").exists());
    }

    #[test]
    fn final_symlink_is_replaced_not_followed() {
        let (host, root) = tree();
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        symlink(
            host.path().join("secret"),
            root.path().join("etc/ld.so.preload"),
        )
        .unwrap();
        let r = Root::open(root.path()).unwrap();
        r.ensure("/etc/ld.so.preload", Node::File).unwrap();
        assert_eq!(
            std::fs::read_to_string(host.path().join("secret")).unwrap(),
            "host"
        );
        let p = root.path().join("etc/ld.so.preload");
        assert!(
            !std::fs::symlink_metadata(&p)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn dev_symlink_to_host_dir_is_confined() {
        let (host, root) = tree();
        symlink(host.path(), root.path().join("dev")).unwrap();
        let r = Root::open(root.path()).unwrap();
        // No CAP_MKNOD needed to see confinement: a plain file target.
        assert!(r.ensure("/dev/nvidia-test", Node::File).is_err());
        assert!(!host.path().join("nvidia-test").exists());
        // Once the runtime made the target exist inside the root (as runc does when it mounts
        // /dev through the symlink), the node lands there.
        let inner = root.path().join(host.path().strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inner).unwrap();
        r.ensure("/dev/nvidia-test", Node::File).unwrap();
        assert!(inner.join("nvidia-test").exists());
        assert!(!host.path().join("nvidia-test").exists());
    }

    #[test]
    fn wrong_type_refused_and_dangling_symlink_refused() {
        let (_host, root) = tree();
        std::fs::create_dir_all(root.path().join("etc/ld.so.preload")).unwrap();
        let r = Root::open(root.path()).unwrap();
        assert!(matches!(
            r.ensure("/etc/ld.so.preload", Node::File),
            Err(PathError::WrongType { .. })
        ));
        symlink("/nonexistent/dir", root.path().join("opt")).unwrap();
        let e = r.mkdir_all("/opt/x").unwrap_err();
        assert!(e.to_string().contains("/opt/x"), "{e}");
    }
}
