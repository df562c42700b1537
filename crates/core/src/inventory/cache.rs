//! The inventory cache: `state-dir/inventory.json`, valid while its key matches the node.
//!
//! The key is computed without NVML: the configured roots and library, the driver's version line
//! (`proc-root/proc/driver/nvidia/version`), and every `nvidia*` node under `dev-root/dev` (and
//! `dev-root/dev/nvidia-caps`) with its device number. A driver upgrade, a GPU added or removed,
//! MIG reconfiguration (capability nodes come and go) or a reloaded module (new dynamic majors)
//! all change the key.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Inventory, InventoryError};
use crate::config::Config;

pub const CACHE_FILE: &str = "inventory.json";
const FORMAT: u32 = 2;

/// What the cached inventory was taken from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheKey {
    pub driver_root: String,
    pub dev_root: String,
    pub proc_root: String,
    pub nvml_library: String,
    /// First line of `/proc/driver/nvidia/version` ("" when absent).
    pub driver_version_line: String,
    /// `name major:minor` of each `nvidia*` node, sorted.
    pub device_nodes: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CacheFile {
    format: u32,
    key: CacheKey,
    inventory: Inventory,
}

pub fn path(cfg: &Config) -> PathBuf {
    cfg.state_dir.join(CACHE_FILE)
}

/// The key of the node as it is now (no NVML).
pub fn cache_key(cfg: &Config) -> Result<CacheKey, InventoryError> {
    let vpath = cfg.proc_path("/proc/driver/nvidia/version");
    let driver_version_line = match std::fs::read_to_string(&vpath) {
        Ok(t) => t.lines().next().unwrap_or_default().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(InventoryError::Io {
                path: vpath,
                source,
            });
        }
    };
    let mut device_nodes = Vec::new();
    for (dir, prefix) in [("/dev", ""), ("/dev/nvidia-caps", "nvidia-caps/")] {
        let d = cfg.dev_path(dir);
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(InventoryError::Io { path: d, source }),
        };
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if !name.starts_with("nvidia") {
                continue;
            }
            // Follow symlinks, as `restat` does.
            let Ok(md) = std::fs::metadata(e.path()) else {
                continue;
            };
            if md.file_type().is_char_device() || md.file_type().is_block_device() {
                let r = md.rdev();
                device_nodes.push(format!(
                    "{prefix}{name} {}:{}",
                    nix::sys::stat::major(r),
                    nix::sys::stat::minor(r)
                ));
            }
        }
    }
    device_nodes.sort();
    Ok(CacheKey {
        driver_root: cfg.driver_root.display().to_string(),
        dev_root: cfg.dev_root.display().to_string(),
        proc_root: cfg.proc_root.display().to_string(),
        nvml_library: cfg.nvml_library.clone(),
        driver_version_line,
        device_nodes,
    })
}

/// The cached inventory when the cache exists, parses and has this key. Its driver files and
/// device nodes become mount sources and device nodes: only a regular file (not a symlink)
/// owned by this user and writable by no one else is used.
pub fn read(cfg: &Config, key: &CacheKey) -> Option<Inventory> {
    read_versioned(cfg, key).map(|(inv, _)| inv)
}

/// [`read`], with the identity of the file version it parsed.
fn read_versioned(cfg: &Config, key: &CacheKey) -> Option<(Inventory, Version)> {
    let p = path(cfg);
    let (bytes, version) = read_trusted(&p)?;
    match serde_json::from_slice::<CacheFile>(&bytes) {
        Ok(c) if c.format == FORMAT && &c.key == key => Some((c.inventory, version)),
        Ok(_) => {
            tracing::info!(cache = %p.display(), "inventory cache stale: node changed");
            None
        }
        Err(e) => {
            tracing::warn!(cache = %p.display(), error = %e, "inventory cache unreadable");
            None
        }
    }
}

/// Whether `md` is a cache file to believe: a regular file (not a symlink) of this user that
/// no one else may write.
fn trusted(md: &std::fs::Metadata) -> bool {
    md.is_file() && md.uid() == nix::unistd::geteuid().as_raw() && md.mode() & 0o022 == 0
}

fn read_trusted(p: &std::path::Path) -> Option<(Vec<u8>, Version)> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(p)
        .ok()?;
    let md = f.metadata().ok()?;
    if !trusted(&md) {
        tracing::warn!(cache = %p.display(), uid = md.uid(), mode = format!("{:o}", md.mode() & 0o7777), "inventory cache ignored: not a file only this user can write");
        return None;
    }
    let mut bytes = Vec::with_capacity(usize::try_from(md.len()).unwrap_or(0).saturating_add(1));
    f.read_to_end(&mut bytes).ok()?;
    // The version read is the one `fstat` saw only if the file did not change under the read.
    let after = f.metadata().ok()?;
    let version = Version::of(&md);
    (Version::of(&after) == version && bytes.len() as u64 == md.len()).then_some((bytes, version))
}

/// One version of the cache file, as `fstat`/`lstat` tell it: gpufence replaces the file by
/// rename (a new inode); anything written in place changes its size, mtime or ctime — within the
/// clock tick only the timestamps may stay, hence [`Memo`]'s settling time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Version {
    dev: u64,
    ino: u64,
    size: u64,
    mode: u32,
    uid: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Version {
    fn of(md: &std::fs::Metadata) -> Version {
        Version {
            dev: md.dev(),
            ino: md.ino(),
            size: md.size(),
            mode: md.mode(),
            uid: md.uid(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
        }
    }

    /// Whether the file was last changed at least `settle` before `now`: a later write within
    /// the same clock tick could leave every field but the contents as they are.
    fn settled(&self, now: std::time::SystemTime, settle: std::time::Duration) -> bool {
        let at = |(s, ns): (i64, i64)| {
            let (Ok(s), Ok(ns)) = (u64::try_from(s), u32::try_from(ns)) else {
                return None;
            };
            std::time::UNIX_EPOCH.checked_add(std::time::Duration::new(s, ns))
        };
        [self.mtime, self.ctime]
            .into_iter()
            .all(|t| at(t).is_some_and(|t| now.duration_since(t).is_ok_and(|age| age >= settle)))
    }
}

/// How long a cache file must have been left alone before [`Memo`] keeps its parse.
pub const MEMO_SETTLE: std::time::Duration = std::time::Duration::from_millis(100);

/// The parsed cache, kept by a long-running process (`gpufence nri` loads the inventory for
/// every container's decision and check): `Memo::load` is `inventory::load` without the file's
/// read and JSON parse while the node's key (computed afresh on every call, exactly as `load`
/// does: driver version line, `nvidia*` device nodes, roots) and the cache file's version
/// (`lstat`: device, inode, size, mode, owner, mtime, ctime) are the ones it parsed. A file is
/// kept only once settled ([`MEMO_SETTLE`]); a missing, replaced, re-permissioned or untrusted
/// file, or another key, goes the whole way as `load` does.
#[derive(Debug)]
pub struct Memo {
    kept: std::sync::Mutex<Option<Kept>>,
    settle: std::time::Duration,
    parses: std::sync::atomic::AtomicU64,
}

#[derive(Debug)]
struct Kept {
    path: PathBuf,
    key: CacheKey,
    version: Version,
    inventory: Inventory,
}

impl Default for Memo {
    fn default() -> Memo {
        Memo::settling(MEMO_SETTLE)
    }
}

impl Memo {
    /// A memo that keeps a file left alone for `settle`.
    pub fn settling(settle: std::time::Duration) -> Memo {
        Memo {
            kept: std::sync::Mutex::new(None),
            settle,
            parses: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many times the cache file was read and parsed.
    pub fn parses(&self) -> u64 {
        self.parses.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The cached inventory (kept, or read and parsed), or the node's key to scan it under
    /// when the cache is missing, stale or untrusted (`Memo::load` in the parent module).
    pub fn cached(&self, cfg: &Config) -> Result<Result<Inventory, CacheKey>, InventoryError> {
        let key = cache_key(cfg)?;
        let p = path(cfg);
        if let Ok(md) = std::fs::symlink_metadata(&p)
            && trusted(&md)
        {
            let version = Version::of(&md);
            let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(k) = kept.as_ref()
                && k.path == p
                && k.key == key
                && k.version == version
            {
                return Ok(Ok(k.inventory.clone()));
            }
        }
        self.parses
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some((inventory, version)) = read_versioned(cfg, &key) else {
            *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = None;
            return Ok(Err(key));
        };
        let settled = version.settled(std::time::SystemTime::now(), self.settle);
        *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = settled.then(|| Kept {
            path: p,
            key,
            version,
            inventory: inventory.clone(),
        });
        Ok(Ok(inventory))
    }
}

/// Write the cache atomically (temp file in `state-dir`, then rename).
pub fn write(cfg: &Config, key: &CacheKey, inv: &Inventory) -> Result<(), InventoryError> {
    let io = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| InventoryError::Io { path, source }
    };
    crate::fsutil::create_state_dir(&cfg.state_dir).map_err(io(&cfg.state_dir))?;
    let body = serde_json::to_vec(&CacheFile {
        format: FORMAT,
        key: key.clone(),
        inventory: inv.clone(),
    })
    .expect("inventory serialises");
    let dst = path(cfg);
    let opts = crate::fsutil::Options {
        mode: 0o600,
        owner: None,
        sync: true,
    };
    crate::fsutil::write_atomic(&dst, &body, opts).map_err(io(&dst))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn key() -> CacheKey {
        CacheKey {
            driver_root: "/".into(),
            dev_root: "/".into(),
            proc_root: "/".into(),
            nvml_library: "libnvidia-ml.so.1".into(),
            driver_version_line: String::new(),
            device_nodes: Vec::new(),
        }
    }

    fn inv() -> Inventory {
        Inventory {
            driver_version: "1.2.3".into(),
            cuda_driver_version: 12080,
            gpus: Vec::new(),
            control_nodes: Vec::new(),
            driver_files: Vec::new(),
            memory_limits: Default::default(),
        }
    }

    /// The cache names mount sources and device nodes: a file someone else could have written
    /// (writable by group or others, another owner, a symlink) is never used.
    #[test]
    fn cache_others_could_write_is_ignored() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            state_dir: d.path().join("state"),
            ..Config::default()
        };
        write(&cfg, &key(), &inv()).unwrap();
        let p = path(&cfg);
        assert_eq!(read(&cfg, &key()), Some(inv()));

        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(read(&cfg, &key()), None, "world-writable cache used");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o620)).unwrap();
        assert_eq!(read(&cfg, &key()), None, "group-writable cache used");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&cfg, &key()), Some(inv()));

        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
            assert_eq!(read(&cfg, &key()), None, "cache of another owner used");
            std::os::unix::fs::chown(&p, Some(0), None).unwrap();
        }

        let real = d.path().join("elsewhere.json");
        std::fs::rename(&p, &real).unwrap();
        std::os::unix::fs::symlink(&real, &p).unwrap();
        assert_eq!(read(&cfg, &key()), None, "symlinked cache used");
    }

    /// A memo on an empty simulated node (no `nvidia*` nodes, no driver) under `d`.
    fn memo_cfg(d: &std::path::Path) -> Config {
        std::fs::create_dir_all(d.join("dev")).unwrap();
        Config {
            state_dir: d.join("state"),
            dev_root: d.to_path_buf(),
            proc_root: d.to_path_buf(),
            driver_root: d.to_path_buf(),
            nvml_library: d.join("no-nvml.so").display().to_string(),
            ..Config::default()
        }
    }

    fn inv_named(v: &str) -> Inventory {
        Inventory {
            driver_version: v.into(),
            ..inv()
        }
    }

    #[test]
    fn memo_parses_a_settled_cache_once_and_misses_a_replaced_one() {
        let d = tempfile::tempdir().unwrap();
        let cfg = memo_cfg(d.path());
        let memo = Memo::settling(std::time::Duration::ZERO);
        write(&cfg, &cache_key(&cfg).unwrap(), &inv_named("a")).unwrap();
        assert_eq!(memo.load(&cfg).unwrap(), inv_named("a"));
        assert_eq!(memo.load(&cfg).unwrap(), inv_named("a"));
        assert_eq!(
            memo.parses(),
            1,
            "a settled, unchanged cache is parsed once"
        );

        // Rewritten (gpufence's rename: a new inode): read again.
        write(&cfg, &cache_key(&cfg).unwrap(), &inv_named("b")).unwrap();
        assert_eq!(memo.load(&cfg).unwrap(), inv_named("b"));
        assert_eq!(memo.parses(), 2);

        // Made writable by others: never used, from the memo or the file.
        let p = path(&cfg);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(
            memo.load(&cfg).is_err(),
            "untrusted cache used (or NVML found)"
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(memo.load(&cfg).unwrap(), inv_named("b"));
    }

    #[test]
    fn memo_misses_when_the_node_changes() {
        let d = tempfile::tempdir().unwrap();
        let cfg = memo_cfg(d.path());
        let memo = Memo::settling(std::time::Duration::ZERO);
        write(&cfg, &cache_key(&cfg).unwrap(), &inv_named("a")).unwrap();
        assert_eq!(memo.load(&cfg).unwrap(), inv_named("a"));
        // A driver version line appears: another key, the cache is stale, NVML is asked (and is
        // not there): the kept parse is not served.
        std::fs::create_dir_all(d.path().join("proc/driver/nvidia")).unwrap();
        std::fs::write(d.path().join("proc/driver/nvidia/version"), "NVRM 580.1\n").unwrap();
        assert!(memo.load(&cfg).is_err(), "stale key served from the memo");
        std::fs::remove_file(d.path().join("proc/driver/nvidia/version")).unwrap();
        assert_eq!(memo.load(&cfg).unwrap(), inv_named("a"));
    }

    #[test]
    fn memo_keeps_no_file_changed_within_the_settling_time() {
        let d = tempfile::tempdir().unwrap();
        let cfg = memo_cfg(d.path());
        let memo = Memo::default();
        write(&cfg, &cache_key(&cfg).unwrap(), &inv_named("a")).unwrap();
        assert_eq!(memo.load(&cfg).unwrap(), inv_named("a"));
        // Rewritten in place, same length, same inode, likely the same clock tick: only the
        // settling time tells the versions apart.
        let p = path(&cfg);
        let body = std::fs::read(&p).unwrap();
        let changed = String::from_utf8(body).unwrap().replace("\"a\"", "\"z\"");
        std::fs::write(&p, changed).unwrap();
        assert_eq!(memo.load(&cfg).unwrap(), inv_named("z"));
        assert_eq!(memo.parses(), 2);
    }
}
