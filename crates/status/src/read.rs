//! Host-side reading of the state directory: one [`ContainerStatus`] per running GPU container.
//!
//! Everything is opened with `openat2` beneath a directory fd (no symlink, no magic link, no
//! `..` out), as `O_PATH` first: only a regular file of bounded size is then opened for
//! reading (through `/proc/self/fd`), so a FIFO or device node planted by a container is never
//! opened. The accounting region is found in `state-dir/<id>/accounting` where the host keeps
//! it, else inside the container through its init process (`/proc/<pid>/root`, resolved in that
//! root), after checking that this process's `/run/gpufence/quota` is the very file the host
//! wrote for the container (device and inode) — so a reused pid never shows another container's
//! figures. Containers that vanish while being read are left out.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::fcntl::ResolveFlag;
use serde::Serialize;

use super::meta::{self, Meta};
use super::region;
use crate::state::open::{read_bounded, read_prefix, regular};

/// One GPU container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerStatus {
    pub id: String,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
    /// Unix seconds.
    pub created: u64,
    pub devices: Vec<DeviceStatus>,
    /// Processes registered in the accounting region (pids in the container).
    pub pids: Vec<u32>,
    /// Why the usage figures are missing (a damaged region, say); the rest still shows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceStatus {
    /// Container CUDA ordinal.
    pub ordinal: u32,
    /// Node index (`1`, `1:2` for MIG).
    pub index: String,
    pub uuid: String,
    /// Quota in bytes (`None`: the whole device).
    pub limit: Option<u64>,
    pub cores: Option<u8>,
    /// Time-slicing replicas held (`held` of `of`), where kubelet records them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<meta::Replicas>,
    #[serde(flatten)]
    pub usage: region::DeviceUsage,
}

#[derive(Debug, thiserror::Error)]
#[error("state directory {path}: {source}")]
pub struct ReadError {
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

const BENEATH: ResolveFlag = ResolveFlag::RESOLVE_BENEATH
    .union(ResolveFlag::RESOLVE_NO_SYMLINKS)
    .union(ResolveFlag::RESOLVE_NO_MAGICLINKS);
const IN_ROOT: ResolveFlag = ResolveFlag::RESOLVE_IN_ROOT
    .union(ResolveFlag::RESOLVE_NO_SYMLINKS)
    .union(ResolveFlag::RESOLVE_NO_MAGICLINKS);

fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)?;
    Ok(OwnedFd::from(f))
}

/// All running GPU containers under `state_dir`, sorted by namespace, pod, container, id. A
/// missing state directory is an empty node.
pub fn snapshot(state_dir: &Path) -> Result<Vec<ContainerStatus>, ReadError> {
    let err = |source| ReadError {
        path: state_dir.display().to_string(),
        source,
    };
    let dir = match open_dir(state_dir) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(err(e)),
    };
    let entries = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())).map_err(err)?;
    let mut out: Vec<ContainerStatus> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|id| crate::text::valid_container_id(id) && !id.starts_with('.'))
        .filter_map(|id| container(&dir, &id))
        .collect();
    out.sort_by(|a, b| {
        (&a.namespace, &a.pod, &a.container, &a.id).cmp(&(
            &b.namespace,
            &b.pod,
            &b.container,
            &b.id,
        ))
    });
    Ok(out)
}

/// One container, or `None` when it is not a running GPU container (or vanished meanwhile).
fn container(dir: &OwnedFd, id: &str) -> Option<ContainerStatus> {
    let bytes = read_bounded(
        dir,
        &format!("{id}/{}", meta::FILE_NAME),
        BENEATH,
        meta::MAX_BYTES,
    )
    .ok()?;
    let m = Meta::parse(&bytes).ok().filter(|m| m.id == id)?;
    let (_, qdev, qino, _) = regular(dir, &format!("{id}/quota"), BENEATH).ok()?;
    let region = match read_prefix(
        dir,
        &format!("{id}/{}", region::FILE_NAME),
        BENEATH,
        region::SIZE,
    ) {
        Ok(b) => {
            // The host keeps the region: running unless the runtime says the init is gone.
            if locate_init(&m, id).is_some_and(|pid| !same_container(pid, qdev, qino)) {
                return None;
            }
            Ok(b)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let pid = locate_init(&m, id)?;
            if !same_container(pid, qdev, qino) {
                return None;
            }
            in_container(pid)
        }
        Err(e) => Err(format!("accounting region: {e}")),
    };
    Some(status(m, region))
}

/// Decode the region (or carry the error) into the container's status; figures are clamped to
/// the quota (a container can write anything into its own region).
fn status(m: Meta, region: Result<Vec<u8>, String>) -> ContainerStatus {
    let (usage, error) =
        match region.and_then(|b| region::decode(&b, m.devices.len()).map_err(|e| e.to_string())) {
            Ok(u) => (u, None),
            Err(e) => (region::Usage::default(), Some(e)),
        };
    let devices = m
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut u = usage.devices.get(i).copied().unwrap_or_default();
            if let Some(l) = d.memory {
                u.used = u.used.min(l);
                u.peak = u.peak.map(|p| p.min(l));
            }
            DeviceStatus {
                ordinal: i as u32,
                index: d.index.clone(),
                uuid: d.uuid.clone(),
                limit: d.memory,
                cores: d.cores,
                replicas: d.replicas,
                usage: u,
            }
        })
        .collect();
    ContainerStatus {
        id: m.id,
        namespace: m.namespace,
        pod: m.pod,
        container: m.container,
        created: m.created,
        devices,
        pids: usage.pids,
        error,
    }
}

/// The container's init pid from what the host recorded: the hook's pid, the runtime's pid
/// file, or the runtime's own state (`init_process_pid`).
fn locate_init(m: &Meta, id: &str) -> Option<u32> {
    let l = &m.locator;
    if let Some(p) = l.pid {
        return Some(p);
    }
    let pid_of = |text: &[u8]| {
        std::str::from_utf8(text)
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|p| *p > 1)
    };
    if let Some(f) = &l.pid_file
        && let Some(pid) = read_host(Path::new(f), 64).and_then(|b| pid_of(&b))
    {
        return Some(pid);
    }
    let root = l.runtime_root.as_ref()?;
    let state = read_host(&Path::new(root).join(id).join("state.json"), 16 << 20)?;
    let v: serde_json::Value = serde_json::from_slice(&state).ok()?;
    v.get("init_process_pid")?
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 1)
}

/// A small host file written by the real runtime (never through a final symlink).
fn read_host(path: &Path, max: usize) -> Option<Vec<u8>> {
    let dir = open_dir(path.parent()?).ok()?;
    read_bounded(&dir, path.file_name()?.to_str()?, BENEATH, max).ok()
}

/// Whether `pid` sees the host's quota file of this container at `/run/gpufence/quota`.
fn same_container(pid: u32, qdev: u64, qino: u64) -> bool {
    let Ok(root) = open_dir(Path::new(&format!("/proc/{pid}/root"))) else {
        return false;
    };
    regular(&root, "run/gpufence/quota", IN_ROOT).is_ok_and(|(_, d, i, _)| (d, i) == (qdev, qino))
}

/// The region inside the container (`/run/gpufence/accounting` in its mount namespace); absent
/// means no GPU process has run yet.
fn in_container(pid: u32) -> Result<Vec<u8>, String> {
    let root = open_dir(Path::new(&format!("/proc/{pid}/root")))
        .map_err(|e| format!("container root: {e}"))?;
    match read_prefix(
        &root,
        &format!("run/gpufence/{}", region::FILE_NAME),
        IN_ROOT,
        region::SIZE,
    ) {
        Ok(b) => Ok(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("accounting region: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_beneath_and_bounded() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::write(p.join("f"), b"0123456789").unwrap();
        std::os::unix::fs::symlink(p.join("f"), p.join("link")).unwrap();
        nix::unistd::mkfifo(
            &p.join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        std::fs::create_dir(p.join("sub")).unwrap();
        let dir = open_dir(p).unwrap();
        assert_eq!(read_bounded(&dir, "f", BENEATH, 10).unwrap(), b"0123456789");
        assert!(read_bounded(&dir, "f", BENEATH, 9).is_err());
        assert_eq!(read_prefix(&dir, "f", BENEATH, 4).unwrap(), b"0123");
        for bad in ["link", "fifo", "sub", "../f", "/etc/passwd", "sub/../../x"] {
            assert!(read_bounded(&dir, bad, BENEATH, 100).is_err(), "{bad}");
        }
        // a damaged or foreign state directory entry is skipped, never fatal
        std::fs::create_dir(p.join("c1")).unwrap();
        std::fs::write(p.join("c1").join(meta::FILE_NAME), b"{not json").unwrap();
        assert!(snapshot(p).unwrap().is_empty());
        assert!(snapshot(&p.join("missing")).unwrap().is_empty());
    }
}
