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
    let p = path(cfg);
    let bytes = read_trusted(&p)?;
    match serde_json::from_slice::<CacheFile>(&bytes) {
        Ok(c) if c.format == FORMAT && &c.key == key => Some(c.inventory),
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

fn read_trusted(p: &std::path::Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(p)
        .ok()?;
    let md = f.metadata().ok()?;
    if !md.is_file() || md.uid() != nix::unistd::geteuid().as_raw() || md.mode() & 0o022 != 0 {
        tracing::warn!(cache = %p.display(), uid = md.uid(), mode = format!("{:o}", md.mode() & 0o7777), "inventory cache ignored: not a file only this user can write");
        return None;
    }
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).ok()?;
    Some(bytes)
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
}
