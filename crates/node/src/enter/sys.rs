//! The privileged calls made inside a container's mount namespace, behind one small trait so the
//! order of `setns`, capability drops, device nodes and mounts is unit-tested without root:
//! [`LinuxNs`] makes the calls, [`RecordingNs`] records them (and can fail one), as youki's
//! `libcontainer/src/syscall/` does. The policy — what to create, in which order, what to refuse —
//! stays with the caller (the hook applier (`gpufence hook`)).

use std::cell::RefCell;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use caps::Capability;
use nix::errno::Errno;

use super::caps::CapsError;
use super::ldcache::{LdcacheError, Libraries, Outcome};
use super::mounts::{Detached, MountError};
use super::safepath::{Node, PathError, Root};

/// The kernel operations of applying a plan in a container's mount namespace.
pub trait NsSys {
    /// Join the mount namespace `ns` (a `/proc/<pid>/ns/mnt` fd).
    fn setns_mnt(&self, ns: &OwnedFd) -> Result<(), Errno>;
    /// Keep only `keep` of this process's capabilities.
    fn restrict_caps(&self, keep: &'static [Capability]) -> Result<(), CapsError>;
    /// `/proc/self/mountinfo` of the namespace the process is in.
    fn mountinfo(&self) -> std::io::Result<String>;
    /// Take `uid`/`gid` as the filesystem ids; returns the ids now in force.
    fn set_fs_ids(&self, uid: u32, gid: u32) -> (u32, u32);
    /// No umask for what follows (modes are exact).
    fn clear_umask(&self);
    /// The rootfs, opened for in-root resolution.
    fn open_root(&self, rootfs: &Path) -> Result<Root, PathError>;
    /// Create (or open) `path` inside `root` as `node`.
    fn ensure(&self, root: &Root, path: &str, node: Node) -> Result<OwnedFd, PathError>;
    /// Give the node at `fd` its owner.
    fn chown(&self, fd: &OwnedFd, uid: Option<u32>, gid: Option<u32>) -> Result<(), Errno>;
    /// Attach a detached mount on `target` (`shown` names it in errors).
    fn attach(&self, m: Detached, target: &OwnedFd, shown: &str) -> Result<(), MountError>;
    /// Refresh the ld cache of `rootfs` for `folders`.
    fn refresh_ldcache(&self, rootfs: &Path, folders: &[String]) -> Result<Outcome, LdcacheError>;
    /// Symlinks `(path, target)` in `rootfs` ([`super::ldcache::link_in_root`]); how many made.
    fn link_binaries(
        &self,
        rootfs: &Path,
        links: &[(String, String)],
    ) -> Result<usize, LdcacheError>;
}

/// The real calls.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxNs;

impl NsSys for LinuxNs {
    fn setns_mnt(&self, ns: &OwnedFd) -> Result<(), Errno> {
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNS)
    }

    fn restrict_caps(&self, keep: &'static [Capability]) -> Result<(), CapsError> {
        super::caps::restrict(keep)
    }

    fn mountinfo(&self) -> std::io::Result<String> {
        std::fs::read_to_string("/proc/self/mountinfo")
    }

    fn set_fs_ids(&self, uid: u32, gid: u32) -> (u32, u32) {
        // SAFETY: plain syscalls on this (single-threaded) process's credentials. They report no
        // error: a second call returns the id now in force.
        unsafe {
            libc::setfsgid(gid);
            libc::setfsuid(uid);
            (libc::setfsuid(uid) as u32, libc::setfsgid(gid) as u32)
        }
    }

    fn clear_umask(&self) {
        nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    }

    fn open_root(&self, rootfs: &Path) -> Result<Root, PathError> {
        Root::open(rootfs)
    }

    fn ensure(&self, root: &Root, path: &str, node: Node) -> Result<OwnedFd, PathError> {
        root.ensure(path, node)
    }

    fn chown(&self, fd: &OwnedFd, uid: Option<u32>, gid: Option<u32>) -> Result<(), Errno> {
        nix::unistd::fchownat(
            fd,
            "",
            uid.map(nix::unistd::Uid::from_raw),
            gid.map(nix::unistd::Gid::from_raw),
            nix::fcntl::AtFlags::AT_EMPTY_PATH,
        )
    }

    fn attach(&self, m: Detached, target: &OwnedFd, shown: &str) -> Result<(), MountError> {
        m.attach(target, shown)
    }

    fn refresh_ldcache(&self, rootfs: &Path, folders: &[String]) -> Result<Outcome, LdcacheError> {
        super::ldcache::update(rootfs, folders, &Libraries::Scan)
    }

    fn link_binaries(
        &self,
        rootfs: &Path,
        links: &[(String, String)],
    ) -> Result<usize, LdcacheError> {
        super::ldcache::link_in_root(rootfs, links)
    }
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NsCall {
    SetnsMnt,
    RestrictCaps(Vec<Capability>),
    Mountinfo,
    SetFsIds(u32, u32),
    ClearUmask,
    OpenRoot(PathBuf),
    /// `kind` is `dir`, `file` or `dev major:minor mode`.
    Ensure {
        path: String,
        kind: String,
    },
    Chown(Option<u32>, Option<u32>),
    Attach {
        source: String,
        target: String,
    },
    RefreshLdcache(Vec<String>),
    LinkBinaries(Vec<(String, String)>),
}

/// A fake that records every call. Handles are `/dev/null` fds; `open_root` opens the given
/// directory for real (unprivileged) so a [`Root`] exists, but nothing is created in it.
#[derive(Debug, Default)]
pub struct RecordingNs {
    calls: RefCell<Vec<NsCall>>,
    mountinfo: String,
    fail: Option<NsCall>,
}

impl RecordingNs {
    /// `mountinfo` is what the namespace's `/proc/self/mountinfo` reads.
    pub fn new(mountinfo: &str) -> RecordingNs {
        RecordingNs {
            mountinfo: mountinfo.to_string(),
            ..RecordingNs::default()
        }
    }

    /// Make the first call equal to `call` fail (EPERM).
    pub fn failing(mut self, call: NsCall) -> RecordingNs {
        self.fail = Some(call);
        self
    }

    /// The calls so far, in order.
    pub fn calls(&self) -> Vec<NsCall> {
        self.calls.borrow().clone()
    }

    fn record(&self, c: NsCall) -> Result<(), Errno> {
        let fails = self.fail.as_ref() == Some(&c);
        self.calls.borrow_mut().push(c);
        if fails { Err(Errno::EPERM) } else { Ok(()) }
    }

    fn handle() -> OwnedFd {
        std::fs::File::open("/dev/null")
            .map(OwnedFd::from)
            .expect("/dev/null opens")
    }
}

fn node_kind(node: &Node) -> String {
    match node {
        Node::Dir => "dir".into(),
        Node::File => "file".into(),
        Node::Device(_, major, minor, mode) => format!("dev {major}:{minor} {mode:o}"),
    }
}

impl NsSys for RecordingNs {
    fn setns_mnt(&self, _ns: &OwnedFd) -> Result<(), Errno> {
        self.record(NsCall::SetnsMnt)
    }

    fn restrict_caps(&self, keep: &'static [Capability]) -> Result<(), CapsError> {
        self.record(NsCall::RestrictCaps(keep.to_vec()))
            .map_err(|e| CapsError(e.to_string()))
    }

    fn mountinfo(&self) -> std::io::Result<String> {
        self.record(NsCall::Mountinfo)?;
        Ok(self.mountinfo.clone())
    }

    fn set_fs_ids(&self, uid: u32, gid: u32) -> (u32, u32) {
        match self.record(NsCall::SetFsIds(uid, gid)) {
            Ok(()) => (uid, gid),
            Err(_) => (0, 0),
        }
    }

    fn clear_umask(&self) {
        let _ = self.record(NsCall::ClearUmask);
    }

    fn open_root(&self, rootfs: &Path) -> Result<Root, PathError> {
        self.record(NsCall::OpenRoot(rootfs.to_path_buf()))
            .map_err(|errno| PathError::Sys {
                path: rootfs.display().to_string(),
                op: "open rootfs",
                errno,
            })?;
        Root::open(rootfs)
    }

    fn ensure(&self, _root: &Root, path: &str, node: Node) -> Result<OwnedFd, PathError> {
        self.record(NsCall::Ensure {
            path: path.to_string(),
            kind: node_kind(&node),
        })
        .map_err(|errno| PathError::Sys {
            path: path.to_string(),
            op: "create",
            errno,
        })?;
        Ok(Self::handle())
    }

    fn chown(&self, _fd: &OwnedFd, uid: Option<u32>, gid: Option<u32>) -> Result<(), Errno> {
        self.record(NsCall::Chown(uid, gid))
    }

    fn attach(&self, m: Detached, _target: &OwnedFd, shown: &str) -> Result<(), MountError> {
        self.record(NsCall::Attach {
            source: m.host_path.clone(),
            target: shown.to_string(),
        })
        .map_err(|errno| MountError::Attach {
            path: shown.to_string(),
            errno,
        })
    }

    fn refresh_ldcache(&self, rootfs: &Path, folders: &[String]) -> Result<Outcome, LdcacheError> {
        self.record(NsCall::RefreshLdcache(folders.to_vec()))
            .map_err(|errno| LdcacheError::Rootfs {
                rootfs: rootfs.to_path_buf(),
                what: "refresh".into(),
                errno,
            })?;
        Ok(Outcome::Written {
            added: 0,
            image_cache: "recorded".into(),
        })
    }

    fn link_binaries(
        &self,
        rootfs: &Path,
        links: &[(String, String)],
    ) -> Result<usize, LdcacheError> {
        self.record(NsCall::LinkBinaries(links.to_vec()))
            .map_err(|errno| LdcacheError::Rootfs {
                rootfs: rootfs.to_path_buf(),
                what: "links".into(),
                errno,
            })?;
        Ok(links.len())
    }
}
