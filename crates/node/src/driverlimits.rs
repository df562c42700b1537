//! Setting the driver limits on the container's cgroup (createRuntime: runc has created and
//! joined the cgroup, the container's process has not run yet) and clearing them (delete,
//! poststop).
//!
//! What was set is recorded in `state-dir/.memory-limits/<id>` — host-only (0700, outside the
//! container's state directory, which is mounted into the container) — before the first NVML
//! call, so `gpufence-runtime delete` and the poststop hook clear exactly that, whatever the
//! container did. Any failure clears what was already set and refuses the container: runc then
//! fails `create` and removes the container and its cgroup.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::backend::DriverLimit;
use crate::config::Config;
use crate::inventory::limits::nvml::{MemoryLimits, NvmlCallError};

/// Host-only directory (under `state-dir`) of the records of applied limits.
pub const RECORD_DIR: &str = ".memory-limits";

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("the container has no cgroup v2 directory: the driver backend needs cgroup v2")]
    NoV2,
    #[error("container cgroup {actual:?} is not the one its cgroupsPath names ({expected:?})")]
    Mismatch { actual: String, expected: String },
    #[error(transparent)]
    PathForm(#[from] crate::inventory::limits::cgroup::PathFormError),
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::CgroupError),
    #[error(transparent)]
    Nvml(#[from] NvmlCallError),
}

/// What was applied to one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// NVML `nameSpace`: the container's cgroup v2 directory.
    pub namespace: String,
    pub uuids: Vec<String>,
}

pub fn record_path(cfg: &Config, id: &str) -> PathBuf {
    cfg.state_dir.join(RECORD_DIR).join(id)
}

fn read_file(p: &Path) -> Result<String, BackendError> {
    std::fs::read_to_string(p).map_err(|source| BackendError::Read {
        path: p.display().to_string(),
        source,
    })
}

/// The container's cgroup v2 directory (NVML `nameSpace`), from `/proc/<pid>/cgroup` under the
/// host's cgroup2 mount, checked against the spec's `linux.cgroupsPath`.
pub fn container_namespace(
    pid: i64,
    spec: &serde_json::Value,
    id: &str,
) -> Result<PathBuf, BackendError> {
    let proc_cgroup = read_file(Path::new(&format!("/proc/{pid}/cgroup")))?;
    let own = read_file(Path::new("/proc/self/cgroup"))?;
    let mountinfo = read_file(Path::new("/proc/self/mountinfo"))?;
    let located = crate::cgroup::locate(&proc_cgroup, &mountinfo)?;
    let dir = located.v2.ok_or(BackendError::NoV2)?;
    let actual = crate::inventory::limits::cgroup::v2_member(&proc_cgroup).unwrap_or_default();
    let cgroups_path = spec
        .get("linux")
        .and_then(|l| l.get("cgroupsPath"))
        .and_then(|p| p.as_str());
    // A relative (or empty) cgroupsPath is below the runtime's cgroup — runc's cgroup v2 manager
    // takes the parent of its own cgroup (a process may only sit in a leaf), the v1 one its own.
    let own = crate::inventory::limits::cgroup::v2_member(&own).unwrap_or("/");
    let parent = Path::new(own)
        .parent()
        .map_or("/".to_string(), |p| p.display().to_string());
    let expected = crate::inventory::limits::cgroup::expected_path(cgroups_path, own, id, false)?;
    let from_parent =
        crate::inventory::limits::cgroup::expected_path(cgroups_path, &parent, id, false)?;
    if actual != expected && actual != from_parent {
        return Err(BackendError::Mismatch {
            actual: actual.to_string(),
            expected,
        });
    }
    Ok(dir)
}

/// Record, then set every limit; on failure clear what was set and drop the record.
pub fn apply(
    cfg: &Config,
    id: &str,
    namespace: &str,
    limits: &[DriverLimit],
    lib: &mut impl MemoryLimits,
) -> Result<(), BackendError> {
    let record = Record {
        namespace: namespace.to_string(),
        uuids: limits.iter().map(|l| l.uuid.clone()).collect(),
    };
    write_record(cfg, id, &record)?;
    let mut done: Vec<&str> = Vec::new();
    for l in limits {
        if let Err(e) = lib.set(&l.uuid, namespace, 0, l.hard) {
            for u in &done {
                if let Err(c) = lib.clear(u, namespace) {
                    warn!(container = id, gpu = u, error = %c, "clearing a limit after a failure failed");
                }
            }
            let _ = std::fs::remove_file(record_path(cfg, id));
            return Err(e.into());
        }
        done.push(&l.uuid);
        info!(container = id, gpu = %l.uuid, backend = "driver", cgroup = namespace, hard = l.hard, "driver memory limit set");
    }
    Ok(())
}

fn write_record(cfg: &Config, id: &str, r: &Record) -> Result<(), BackendError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = cfg.state_dir.join(RECORD_DIR);
    let werr = |p: &Path| {
        let path = p.display().to_string();
        move |source| BackendError::Write { path, source }
    };
    crate::fsutil::create_state_dir(&cfg.state_dir).map_err(werr(&cfg.state_dir))?;
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(werr(&dir)(e)),
    }
    let md = std::fs::symlink_metadata(&dir).map_err(werr(&dir))?;
    if !md.is_dir() {
        return Err(werr(&dir)(std::io::Error::other("not a directory")));
    }
    let mut tmp = tempfile::NamedTempFile::new_in(&dir).map_err(werr(&dir))?;
    serde_json::to_writer(&mut tmp, r).map_err(|e| werr(&dir)(e.into()))?;
    let p = record_path(cfg, id);
    tmp.persist(&p).map_err(|e| werr(&p)(e.error))?;
    Ok(())
}

/// Clear what the record of container `id` names and remove the record. `Ok(false)`: there was
/// none. `open` gives the NVML to use (only called when there is a record).
pub fn clear_recorded<L: MemoryLimits>(
    cfg: &Config,
    id: &str,
    open: impl FnOnce() -> Result<L, NvmlCallError>,
) -> Result<bool, BackendError> {
    let p = record_path(cfg, id);
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(BackendError::Read {
                path: p.display().to_string(),
                source,
            });
        }
    };
    let r: Record = serde_json::from_str(&text).map_err(|e| BackendError::Read {
        path: p.display().to_string(),
        source: e.into(),
    })?;
    let mut lib = open()?;
    let mut first_err = None;
    for u in &r.uuids {
        match lib.clear(u, &r.namespace) {
            Ok(()) => {
                info!(container = id, gpu = %u, cgroup = %r.namespace, "driver memory limit cleared")
            }
            Err(_) if !Path::new(&r.namespace).exists() => {
                // runc removed the cgroup, and the driver dropped its limits with it.
                info!(container = id, gpu = %u, cgroup = %r.namespace, "cgroup removed: its driver memory limit went with it");
            }
            Err(e) => {
                warn!(container = id, gpu = %u, error = %e, "clearing the driver memory limit failed");
                first_err.get_or_insert(e);
            }
        }
    }
    let _ = std::fs::remove_file(&p);
    match first_err {
        Some(e) => Err(e.into()),
        None => Ok(true),
    }
}

/// Clear at delete/poststop, logging rather than failing (the container is gone either way).
pub fn clear_at_exit(cfg: &Config, id: &str) {
    let r = clear_recorded(cfg, id, || {
        crate::inventory::limits::nvml::Nvml::open(&cfg.nvml_library)
    });
    if let Err(e) = r {
        warn!(container = id, error = %e, "driver memory limits not cleared");
        eprintln!("gpufence: container {id}: driver memory limits not cleared: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::limits::nvml::{LIMIT_MAX, Recording};

    fn cfg(dir: &Path) -> Config {
        Config {
            state_dir: dir.to_path_buf(),
            ..Config::default()
        }
    }

    fn lim(u: &str, hard: u64) -> DriverLimit {
        DriverLimit {
            uuid: u.into(),
            hard,
        }
    }

    #[test]
    fn apply_records_and_clear_undoes() {
        let d = tempfile::tempdir().unwrap();
        let c = cfg(d.path());
        let mut lib = Recording::default();
        apply(
            &c,
            "c1",
            "/sys/fs/cgroup/c1",
            &[lim("GPU-a", 10), lim("GPU-b", 20)],
            &mut lib,
        )
        .unwrap();
        assert_eq!(lib.calls.len(), 2);
        assert_eq!(
            lib.calls[1],
            ("GPU-b".into(), "/sys/fs/cgroup/c1".into(), 0, 20)
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.path().join(RECORD_DIR))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(clear_recorded(&c, "c1", || Ok(Recording::default())).unwrap());
        assert!(!record_path(&c, "c1").exists());
        assert!(!clear_recorded(&c, "c1", || Ok(Recording::default())).unwrap());
    }

    #[test]
    fn failure_clears_what_was_set_and_leaves_no_record() {
        let d = tempfile::tempdir().unwrap();
        let c = cfg(d.path());
        let mut lib = Recording {
            fail_on: Some("GPU-b".into()),
            ..Recording::default()
        };
        let e = apply(
            &c,
            "c2",
            "/ns",
            &[lim("GPU-a", 10), lim("GPU-b", 20)],
            &mut lib,
        )
        .unwrap_err();
        assert!(e.to_string().contains("GPU-b"), "{e}");
        assert_eq!(
            lib.calls,
            vec![
                ("GPU-a".to_string(), "/ns".to_string(), 0, 10),
                ("GPU-a".to_string(), "/ns".to_string(), 0, LIMIT_MAX)
            ]
        );
        assert!(!record_path(&c, "c2").exists());
    }
}
