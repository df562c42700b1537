//! The host files gpufence writes, in one place: the state directory (`state-dir`, 0711, and
//! `state-dir/<id>` per container), the quota, the node-wide generated `ld.so.preload`, and the
//! one atomic writer every other file goes through (`config.json`, CDI specs, the inventory
//! cache): a temporary beside the target created `O_CREAT|O_EXCL|O_NOFOLLOW`, then `rename`, so a
//! reader sees the old or the new file and a planted symlink is replaced, never followed.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::config::Config;
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

/// How [`write_atomic`] leaves the file.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Permission bits.
    pub mode: u32,
    /// uid/gid to give it (`None`: the writer's).
    pub owner: Option<(u32, u32)>,
    /// `fsync` before the rename (files that must survive a crash: CDI specs, the cache).
    pub sync: bool,
}

/// Create `state-dir` if missing, mode 0711: host users may not list it.
pub fn create_state_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if path.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(path)
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

/// Write `path` atomically: a temporary beside it (`O_EXCL|O_NOFOLLOW`, so nothing planted there
/// is followed), the mode and owner set on it, then `rename` over the target.
pub fn write_atomic(path: &Path, bytes: &[u8], opts: Options) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.gpufence-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mode = opts.mode & 0o7777;
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if let Some((uid, gid)) = opts.owner {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
        }
        // umask may have masked the mode.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        if opts.sync {
            f.sync_all()?;
        }
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Replace an existing file (`config.json`) atomically, keeping its mode and owner.
pub fn replace_keeping_mode(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let meta = std::fs::metadata(path)?;
    write_atomic(
        path,
        bytes,
        Options {
            mode: meta.permissions().mode(),
            owner: Some((meta.uid(), meta.gid())),
            sync: false,
        },
    )
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
    fn atomic_write_keeps_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config.json");
        std::fs::write(&p, b"{}").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        replace_keeping_mode(&p, b"{\"a\":1}").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{\"a\":1}");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o640
        );
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
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
