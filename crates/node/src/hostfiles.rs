//! The host files a plan asks for, in one place: `state-dir/<id>` per container, the quota and
//! the node-wide generated `ld.so.preload`, each written through [`crate::fsutil`]'s atomic writer
//! and only inside `state-dir`. Applier support: the runtime and the hook render a plan's host
//! files through it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use crate::config::Config;
use crate::fsutil::{Options, create_state_dir, write_atomic};
use crate::plan::Plan;

/// Why a host file could not be written. One line, naming the path.
#[derive(Debug, thiserror::Error)]
pub enum HostFilesError {
    /// The plan names a path outside `state-dir` (never written).
    #[error("container {id}: {what} {path} is outside state-dir {base}")]
    Outside {
        id: String,
        what: &'static str,
        path: PathBuf,
        base: PathBuf,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl HostFilesError {
    /// 1: the plan is at fault; 2: the host failed.
    pub fn code(&self) -> i32 {
        match self {
            HostFilesError::Outside { .. } => 1,
            HostFilesError::Io { .. } => 2,
        }
    }
}

/// True when `p` is `base/<one component>/…` with no `..` anywhere.
fn is_under(p: &Path, base: &Path) -> bool {
    p.is_absolute()
        && !p.components().any(|c| c == Component::ParentDir)
        && p.strip_prefix(base)
            .is_ok_and(|r| r.components().count() >= 1)
}

/// The container's state directory and the files the plan asks for (quota 0444, generated
/// ld.so.preload), each written atomically, and the empty shared accounting file (0666) when the
/// container has a quota. Only paths inside `state-dir` are accepted.
pub fn write_host_files(cfg: &Config, id: &str, plan: &Plan) -> Result<(), HostFilesError> {
    let base = &cfg.state_dir;
    let outside = |what: &'static str, p: &Path| HostFilesError::Outside {
        id: id.to_string(),
        what,
        path: p.to_path_buf(),
        base: base.clone(),
    };
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = &plan.state_dir {
        let d = PathBuf::from(d);
        if !is_under(&d, base) {
            return Err(outside("state directory", &d));
        }
        dirs.push(d);
    }
    for f in &plan.host_files {
        let p = PathBuf::from(&f.path);
        if !is_under(&p, base) {
            return Err(outside("host file", &p));
        }
        if let Some(parent) = p.parent() {
            dirs.push(parent.to_path_buf());
        }
    }
    for d in &dirs {
        create_dir_nofollow(base, d).map_err(|source| HostFilesError::Io {
            path: d.clone(),
            source,
        })?;
    }
    for f in &plan.host_files {
        let p = Path::new(&f.path);
        let opts = Options {
            mode: f.mode,
            owner: None,
            sync: false,
        };
        write_atomic(p, f.contents.as_bytes(), opts).map_err(|source| HostFilesError::Io {
            path: p.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

/// `mkdir -p` of `dir` (under `base`), refusing symlinks on the way below `base`.
fn create_dir_nofollow(base: &Path, dir: &Path) -> std::io::Result<()> {
    create_state_dir(base)?;
    let rel = dir
        .strip_prefix(base)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "outside state-dir"))?;
    let mut cur = base.to_path_buf();
    for c in rel.components() {
        cur.push(c);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a directory", cur.display()),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&cur)?;
                std::fs::set_permissions(&cur, std::fs::Permissions::from_mode(0o755))?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether container `id` left anything of gpufence's on the host: its state directory or a
/// record of driver memory limits.
pub fn has_container_state(cfg: &Config, id: &str) -> bool {
    crate::text::valid_container_id(id)
        && (std::fs::symlink_metadata(cfg.container_state_dir(id)).is_ok()
            || std::fs::symlink_metadata(crate::driverlimits::record_path(cfg, id)).is_ok())
}

/// Clean what creating container `id` left on the host, once the container is gone: its driver
/// memory limits (cleared through NVML where a record says they were set) and its state
/// directory (quota, status record). What `gpufence-runtime delete` and the NRI plugin's
/// RemoveContainer both do. Idempotent; an invalid id touches nothing.
pub fn remove_container_state(cfg: &Config, id: &str) -> Result<(), HostFilesError> {
    if !crate::text::valid_container_id(id) {
        return Ok(());
    }
    crate::driverlimits::clear_at_exit(cfg, id);
    let dir = cfg.container_state_dir(id);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(HostFilesError::Io { path: dir, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under() {
        let b = Path::new("/run/gpufence/c1");
        assert!(is_under(Path::new("/run/gpufence/c1/quota"), b));
        assert!(!is_under(Path::new("/run/gpufence/c1"), b));
        assert!(!is_under(Path::new("/run/gpufence/c1/../c2/quota"), b));
        assert!(!is_under(Path::new("/etc/passwd"), b));
        assert!(!is_under(Path::new("run/gpufence/c1/x"), b));
    }

    #[test]
    fn host_state_dir_holds_nothing_container_writable() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            state_dir: d.path().join("state"),
            ..Config::default()
        };
        let own = cfg.container_state_dir("c1");
        let quota = crate::quota::Quota {
            oversubscribe: false,
            devices: vec![],
            cores_burst: false,
            quiet_refusals: false,
        };
        let plan = Plan {
            state_dir: Some(own.display().to_string()),
            quota: Some(quota.clone()),
            host_files: vec![crate::plan::HostFile {
                path: own.join("quota").display().to_string(),
                contents: quota.render(),
                mode: 0o444,
            }],
            ..Plan::default()
        };
        write_host_files(&cfg, "c1", &plan).unwrap();
        // Only the read-only quota: the accounting region lives in the container's own tmpfs.
        let names: Vec<String> = std::fs::read_dir(&own)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["quota"]);
        assert_eq!(
            std::fs::metadata(&own).unwrap().permissions().mode() & 0o7777,
            0o755
        );
        for m in &crate::plan::state_tmpfs(false).options {
            assert!(!m.starts_with("bind"), "{m}");
        }
    }

    #[test]
    fn host_files_stay_in_state_dir() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            state_dir: d.path().join("state"),
            ..Config::default()
        };
        let own = cfg.container_state_dir("c1");
        let plan = Plan {
            state_dir: Some(own.display().to_string()),
            host_files: vec![crate::plan::HostFile {
                path: own.join("quota").display().to_string(),
                contents: "version=1\n".into(),
                mode: 0o444,
            }],
            ..Plan::default()
        };
        write_host_files(&cfg, "c1", &plan).unwrap();
        let q = own.join("quota");
        assert_eq!(std::fs::read_to_string(&q).unwrap(), "version=1\n");
        assert_eq!(
            std::fs::metadata(&q).unwrap().permissions().mode() & 0o777,
            0o444
        );
        // Rewriting a read-only file works (rename, not truncate).
        write_host_files(&cfg, "c1", &plan).unwrap();

        // A node-wide file directly under state-dir is fine.
        let node_wide = Plan {
            host_files: vec![crate::plan::HostFile {
                path: cfg.state_dir.join("ld.so.preload").display().to_string(),
                contents: "/usr/lib/gpufence/libgpufence.so\n".into(),
                mode: 0o444,
            }],
            ..Plan::default()
        };
        write_host_files(&cfg, "c1", &node_wide).unwrap();

        let evil = Plan {
            host_files: vec![crate::plan::HostFile {
                path: d.path().join("elsewhere").display().to_string(),
                contents: String::new(),
                mode: 0o444,
            }],
            ..Plan::default()
        };
        assert!(write_host_files(&cfg, "c1", &evil).is_err());
        assert!(!d.path().join("elsewhere").exists());

        // A symlink planted where the container directory goes is refused.
        std::os::unix::fs::symlink("/tmp", cfg.state_dir.join("c2")).unwrap();
        let plan2 = Plan {
            state_dir: Some(cfg.container_state_dir("c2").display().to_string()),
            ..Plan::default()
        };
        assert!(write_host_files(&cfg, "c2", &plan2).is_err());
    }
}
