//! Applying a plan to a container that is being created, from an OCI hook.
//!
//! Order, and why:
//! 1. host side, in the host's mount namespace: write the host files (quota, ld.so.preload),
//!    clone every mount source into a detached mount tree, open the container's mount
//!    namespace, write the cgroup rules (v1 `devices.allow`, v2 gate program);
//! 2. a forked, single-threaded child joins the container's mount namespace (`setns` would fail
//!    in a process with a second thread), refuses if a mount under the rootfs propagates
//!    (shared), creates the device nodes and attaches the mounts through fds resolved inside the
//!    rootfs, then refreshes the ld cache;
//! 3. on any failure the parent removes what it created on the host (the container state
//!    directory) and the hook exits non-zero, which aborts the container's creation.

use std::os::fd::OwnedFd;
use std::path::Path;

use nix::sys::stat::SFlag;
use tracing::{info, warn};

use crate::enter::mounts::{Attrs, Detached};
use crate::enter::safepath::{Node, Root};
use crate::enter::sys::{LinuxNs, NsSys};
use crate::error::HookError;
use crate::plan::Plan;

/// A validated device node to create in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    pub path: String,
    pub kind: SFlag,
    pub major: u64,
    pub minor: u64,
    pub mode: u32,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// Everything prepared on the host side for the in-namespace step.
#[derive(Debug)]
pub struct Prepared {
    /// Device nodes to `mknod` (empty for a user-namespaced container: its nodes are bind
    /// mounts of the host nodes, in `mounts`, as runc does).
    pub nodes: Vec<NodeSpec>,
    /// (container path, detached host source), parents before children.
    pub mounts: Vec<(String, Detached)>,
    /// The ld cache refresh to run after mounting (createContainer hook of the plan).
    pub ldcache: Option<LdcacheRun>,
    /// Host uid/gid of the container's root when it runs in its own user namespace: mount
    /// targets are created with that owner (files owned by an unmapped id cannot be created
    /// on the container's own tmpfs).
    pub userns_root: Option<(u32, u32)>,
}

/// For a user-namespaced container: the device nodes as read-write bind mounts of the host
/// nodes (a node created inside the container's user namespace would not open).
pub fn nodes_as_mounts(plan: &Plan) -> Result<Vec<(String, Detached)>, HookError> {
    let mut out = Vec::new();
    for e in &plan.edits.device_nodes {
        crate::enter::safepath::components(&e.path)?;
        let Some(h) = &e.host_path else {
            return Err(HookError::Plan(format!(
                "device node {}: no host path to bind-mount into a user-namespaced container",
                e.path
            )));
        };
        crate::enter::safepath::components(h)?;
        let attrs = Attrs {
            nosuid: true,
            noexec: true,
            ..Attrs::default()
        };
        out.push((
            e.path.clone(),
            crate::enter::mounts::detach(Path::new(h), attrs)?,
        ));
    }
    Ok(out)
}

/// The plan's ld cache refresh (its createContainer `update-ldcache` hook), done by the hook
/// itself after its mounts ([`crate::enter::ldcache::update`], in-process, libraries found in the
/// folders).
#[derive(Debug)]
pub struct LdcacheRun {
    pub folders: Vec<String>,
    /// The driver folders' binaries linked at their host paths (a convenience: hook mode cannot
    /// extend `PATH`), `(path in the container, link target)`.
    pub links: Vec<(String, String)>,
}

fn dev_kind(
    edit: &crate::cdi::DeviceNodeEdit,
    host: Option<&nix::sys::stat::FileStat>,
) -> Result<SFlag, HookError> {
    let bad = |why: &str| HookError::Plan(format!("device node {}: {why}", edit.path));
    match edit.kind.as_deref() {
        Some("c") | Some("u") => Ok(SFlag::S_IFCHR),
        Some("b") => Ok(SFlag::S_IFBLK),
        Some(other) if !other.is_empty() => Err(bad("type must be c or b")),
        _ => match host {
            Some(st) if st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFCHR.bits() => {
                Ok(SFlag::S_IFCHR)
            }
            Some(st) if st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFBLK.bits() => {
                Ok(SFlag::S_IFBLK)
            }
            _ => Err(bad("no type and the host path is not a device")),
        },
    }
}

/// Validate the plan's device nodes (paths under `/dev`, no `..`, c/b with numbers; numbers
/// missing from a CDI edit are taken from the host node).
pub fn node_specs(plan: &Plan) -> Result<Vec<NodeSpec>, HookError> {
    let mut out = Vec::new();
    for e in &plan.edits.device_nodes {
        let comps = crate::enter::safepath::components(&e.path)?;
        if comps.first() != Some(&"dev") || comps.len() < 2 {
            return Err(HookError::Plan(format!(
                "device node {:?}: must be under /dev",
                e.path.chars().take(128).collect::<String>()
            )));
        }
        let host = match &e.host_path {
            Some(h) => {
                crate::enter::safepath::components(h)?;
                Some(
                    nix::sys::stat::stat(h.as_str()).map_err(|errno| HookError::Host {
                        path: h.clone(),
                        op: "stat device",
                        errno,
                    })?,
                )
            }
            None => None,
        };
        let kind = dev_kind(e, host.as_ref())?;
        let (major, minor) = match (e.major, e.minor, &host) {
            (Some(ma), Some(mi), _) if ma >= 0 && mi >= 0 => (ma as u64, mi as u64),
            (None, None, Some(st)) => (
                nix::sys::stat::major(st.st_rdev),
                nix::sys::stat::minor(st.st_rdev),
            ),
            _ => {
                return Err(HookError::Plan(format!(
                    "device node {}: invalid or missing major/minor",
                    e.path
                )));
            }
        };
        let mode = e.file_mode.unwrap_or(0o666) & 0o777;
        out.push(NodeSpec {
            path: e.path.clone(),
            kind,
            major,
            minor,
            mode,
            uid: e.uid,
            gid: e.gid,
        });
    }
    Ok(out)
}

/// Validate and clone the plan's mount sources (host side). Mounts are attached in the plan's
/// order ([`crate::plan::mount_order`]): parent-first, so `/run/gpufence` before
/// `/run/gpufence/quota`, and gpufence's enforcement mounts last, as runc makes them in runtime
/// mode (defence in depth here: a symlink at a target is replaced, not followed, but its parent
/// directories resolve inside the rootfs through the image's symlinks).
pub fn detach_mounts(plan: &Plan) -> Result<Vec<(String, Detached)>, HookError> {
    let mut edits: Vec<&crate::cdi::MountEdit> = plan.layout_mounts().iter().collect();
    edits.sort_by_cached_key(|m| crate::plan::mount_order(&m.container_path));
    let mut out = Vec::new();
    for m in edits {
        let comps = crate::enter::safepath::components(&m.container_path)?;
        if comps.is_empty() {
            return Err(HookError::Plan("a mount onto / is not allowed".into()));
        }
        if m.kind.as_deref() == Some("tmpfs") {
            let d = crate::enter::tmpfs::detach_tmpfs(&m.container_path, &m.options)?;
            out.push((m.container_path.clone(), d));
            continue;
        }
        crate::enter::safepath::components(&m.host_path)?;
        let attrs = Attrs::parse(&m.container_path, m.kind.as_deref(), &m.options)?;
        let d = crate::enter::mounts::detach(Path::new(&m.host_path), attrs)?;
        out.push((m.container_path.clone(), d));
    }
    Ok(out)
}

/// The in-namespace step: device nodes and mounts inside `root`.
pub fn apply_in_root(sys: &dyn NsSys, root: &Root, p: Prepared, id: &str) -> Result<(), HookError> {
    // Modes are exact, not masked.
    sys.clear_umask();
    for n in &p.nodes {
        let fd = sys.ensure(
            root,
            &n.path,
            Node::Device(n.kind, n.major, n.minor, n.mode),
        )?;
        if n.uid.is_some() || n.gid.is_some() {
            sys.chown(&fd, n.uid, n.gid)
                .map_err(|errno| HookError::Host {
                    path: n.path.clone(),
                    op: "chown device node",
                    errno,
                })?;
        }
        info!(container = id, path = %n.path, major = n.major, minor = n.minor, "device node created");
    }
    for (target, d) in p.mounts {
        let node = if d.is_dir { Node::Dir } else { Node::File };
        let fd = sys.ensure(root, &target, node)?;
        let src = d.host_path.clone();
        sys.attach(d, &fd, &target)?;
        info!(container = id, source = %src, target = %target, "bind mount attached");
    }
    Ok(())
}

/// Refresh the container's ld cache (in its mount namespace, before pivot_root).
fn run_ldcache(sys: &dyn NsSys, l: &LdcacheRun, rootfs: &Path, id: &str) -> Result<(), HookError> {
    let o = sys
        .refresh_ldcache(rootfs, &l.folders)
        .map_err(|e| HookError::Ldcache(e.to_string()))?;
    crate::enter::ldcache::log_outcome(id, rootfs, &l.folders, &o);
    if !l.links.is_empty() {
        match sys.link_binaries(rootfs, &l.links) {
            Ok(linked) => {
                info!(
                    container = id,
                    linked,
                    of = l.links.len(),
                    "driver binaries linked at their host paths"
                )
            }
            Err(e) => {
                warn!(container = id, error = %e, "driver binaries not linked at their host paths")
            }
        }
    }
    Ok(())
}

/// The mount namespace the worker applies a plan in.
#[derive(Debug)]
pub enum Namespace {
    /// The container's (`setns` into this fd of `/proc/<pid>/ns/mnt`): hook mode.
    Join(OwnedFd),
}

/// Fork a single-threaded child that enters `ns`, refuses shared mounts under `rootfs`,
/// applies `p` and refreshes the ld cache. Returns the child's error line. The child runs under
/// `deadline` ([`crate::child::fork_with_deadline`]: own process group killed when it passes,
/// no inherited stdio, dies with this process).
pub fn apply_in_namespace(
    ns: Namespace,
    rootfs: &Path,
    p: Prepared,
    id: &str,
    deadline: std::time::Duration,
) -> Result<(), HookError> {
    let worker = crate::child::fork_with_deadline("namespace worker", deadline, |out| {
        // The exit status carries the error's exit code (1 input, 2 host), the pipe its line.
        match child_body(&LinuxNs, ns, rootfs, p, id) {
            Ok(()) => 0,
            Err(e) => {
                let _ = std::io::Write::write_all(out, e.to_string().as_bytes());
                e.code()
            }
        }
    })
    .map_err(|e| HookError::Namespace {
        code: 2,
        message: e.to_string(),
    })?;
    worker
        .verdict("namespace worker")
        .map_err(|(code, message)| HookError::Namespace {
            code: if code == 1 { 1 } else { 2 },
            message,
        })
}

fn enter(sys: &dyn NsSys, ns: Namespace) -> Result<(), HookError> {
    match ns {
        Namespace::Join(fd) => sys.setns_mnt(&fd).map_err(|errno| HookError::Host {
            path: "container mount namespace".into(),
            op: "setns",
            errno,
        }),
    }
}

/// In the worker: join the container's mount namespace, keep only the in-namespace
/// capabilities, refuse a rootfs whose mounts propagate elsewhere, take the container root's fs
/// ids (user namespaces), then device nodes, mounts (parents first, as prepared) and the ld
/// cache (with the ld cache capabilities only).
fn child_body(
    sys: &dyn NsSys,
    ns: Namespace,
    rootfs: &Path,
    p: Prepared,
    id: &str,
) -> Result<(), HookError> {
    enter(sys, ns)?;
    sys.restrict_caps(crate::enter::caps::IN_NAMESPACE)?;
    let mi = sys.mountinfo().map_err(|e| HookError::Host {
        path: "/proc/self/mountinfo".into(),
        op: "read",
        errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    })?;
    let shared = crate::enter::mounts::shared_mounts_under(&mi, rootfs);
    if !shared.is_empty() {
        return Err(HookError::Plan(format!(
            "mounts under the rootfs propagate to other namespaces (shared: {}); refusing to mount",
            shared.join(", ")
        )));
    }
    if let Some((uid, gid)) = p.userns_root {
        // New inodes (mount targets, directories) belong to the container's root. The fs
        // capabilities leave the effective set with the change; none is needed from here.
        if sys.set_fs_ids(uid, gid) != (uid, gid) {
            return Err(HookError::Namespace {
                code: 2,
                message: format!("cannot take the container root's ids {uid}:{gid}"),
            });
        }
    }
    let root = sys.open_root(rootfs)?;
    let ldcache = p.ldcache;
    apply_in_root(
        sys,
        &root,
        Prepared {
            nodes: p.nodes,
            mounts: p.mounts,
            ldcache: None,
            userns_root: p.userns_root,
        },
        id,
    )?;
    if let Some(l) = ldcache {
        sys.restrict_caps(crate::enter::caps::LDCACHE)?;
        run_ldcache(sys, &l, rootfs, id)?;
    }
    Ok(())
}

/// Log what cannot be applied at this stage.
pub fn log_unapplied(plan: &Plan, id: &str) {
    for e in &plan.edits.env {
        info!(container = id, env = %e, "env edit not applied in hook mode (the shim reads the quota file)");
    }
    for e in &plan.env_overrides {
        warn!(container = id, env = %e, "env override cannot be applied in hook mode");
    }
    for h in &plan.edits.hooks {
        if !(h.hook_name == "createContainer" && h.args.iter().any(|a| a == "update-ldcache")) {
            warn!(container = id, hook = %h.path, stage = %h.hook_name, "CDI hook not run in hook mode");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enter::sys::{NsCall, RecordingNs};

    fn ns() -> Namespace {
        Namespace::Join(std::fs::File::open("/dev/null").unwrap().into())
    }

    fn prepared(userns: Option<(u32, u32)>) -> Prepared {
        Prepared {
            nodes: vec![NodeSpec {
                path: "/dev/nvidia1".into(),
                kind: SFlag::S_IFCHR,
                major: 195,
                minor: 1,
                mode: 0o666,
                uid: Some(7),
                gid: None,
            }],
            mounts: vec![
                (
                    "/usr/lib/gpufence".into(),
                    Detached::stand_in("/host/lib/gpufence", true).unwrap(),
                ),
                (
                    "/usr/lib/gpufence/libgpufence.so".into(),
                    Detached::stand_in("/host/libgpufence.so", false).unwrap(),
                ),
            ],
            ldcache: Some(LdcacheRun {
                folders: vec!["/usr/lib64".into()],
                links: vec![(
                    "/usr/bin/nvidia-smi".into(),
                    "/usr/local/nvidia/bin/nvidia-smi".into(),
                )],
            }),
            userns_root: userns,
        }
    }

    #[test]
    fn namespace_then_caps_then_nodes_then_mounts_then_ldcache() {
        let root = tempfile::tempdir().unwrap();
        let sys = RecordingNs::new("");
        child_body(&sys, ns(), root.path(), prepared(None), "c1").unwrap();
        assert_eq!(
            sys.calls(),
            vec![
                NsCall::SetnsMnt,
                NsCall::RestrictCaps(crate::enter::caps::IN_NAMESPACE.to_vec()),
                NsCall::Mountinfo,
                NsCall::OpenRoot(root.path().to_path_buf()),
                NsCall::ClearUmask,
                NsCall::Ensure {
                    path: "/dev/nvidia1".into(),
                    kind: "dev 195:1 666".into()
                },
                NsCall::Chown(Some(7), None),
                NsCall::Ensure {
                    path: "/usr/lib/gpufence".into(),
                    kind: "dir".into()
                },
                NsCall::Attach {
                    source: "/host/lib/gpufence".into(),
                    target: "/usr/lib/gpufence".into()
                },
                NsCall::Ensure {
                    path: "/usr/lib/gpufence/libgpufence.so".into(),
                    kind: "file".into()
                },
                NsCall::Attach {
                    source: "/host/libgpufence.so".into(),
                    target: "/usr/lib/gpufence/libgpufence.so".into()
                },
                NsCall::RestrictCaps(crate::enter::caps::LDCACHE.to_vec()),
                NsCall::RefreshLdcache(vec!["/usr/lib64".into()]),
                NsCall::LinkBinaries(vec![(
                    "/usr/bin/nvidia-smi".into(),
                    "/usr/local/nvidia/bin/nvidia-smi".into()
                )]),
            ]
        );
    }

    #[test]
    fn user_namespaced_container_takes_its_roots_ids_before_creating_anything() {
        let root = tempfile::tempdir().unwrap();
        let sys = RecordingNs::new("");
        child_body(
            &sys,
            ns(),
            root.path(),
            prepared(Some((100000, 100000))),
            "c1",
        )
        .unwrap();
        let calls = sys.calls();
        let ids = calls
            .iter()
            .position(|c| *c == NsCall::SetFsIds(100000, 100000))
            .unwrap();
        let first_create = calls
            .iter()
            .position(|c| matches!(c, NsCall::Ensure { .. }))
            .unwrap();
        assert!(ids < first_create, "{calls:?}");
    }

    #[test]
    fn shared_mounts_under_the_rootfs_stop_before_anything_is_created() {
        let root = tempfile::tempdir().unwrap();
        let mi = format!(
            "30 25 0:27 / {}/proc rw shared:5 - proc proc rw\n",
            root.path().display()
        );
        let sys = RecordingNs::new(&mi);
        let e = child_body(&sys, ns(), root.path(), prepared(None), "c1").unwrap_err();
        assert!(e.to_string().contains("propagate"), "{e}");
        assert!(
            !sys.calls()
                .iter()
                .any(|c| matches!(c, NsCall::Ensure { .. } | NsCall::Attach { .. }))
        );
    }

    #[test]
    fn a_failed_setns_does_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let sys = RecordingNs::new("").failing(NsCall::SetnsMnt);
        let e = child_body(&sys, ns(), root.path(), prepared(None), "c1").unwrap_err();
        assert!(e.to_string().contains("setns"), "{e}");
        assert_eq!(sys.calls(), vec![NsCall::SetnsMnt]);
    }

    #[test]
    fn a_refused_mount_stops_the_ones_below_it() {
        let root = tempfile::tempdir().unwrap();
        let refused = NsCall::Attach {
            source: "/host/lib/gpufence".into(),
            target: "/usr/lib/gpufence".into(),
        };
        let sys = RecordingNs::new("").failing(refused.clone());
        assert!(child_body(&sys, ns(), root.path(), prepared(None), "c1").is_err());
        assert_eq!(sys.calls().last(), Some(&refused));
    }
}
