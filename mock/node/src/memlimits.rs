//! Per-cgroup device-memory limits of the simulated driver (NVML R615 memory limits), node-wide:
//! the mock NVML sets them from the host (`nvmlDeviceSetMemoryLimits_v1`), the mock CUDA of every
//! process in the cgroup charges its allocations against them — so a process that escaped the
//! shim is still refused, as with the real driver. The state is a directory (the node file's
//! `memory_limits_dir`), standing in for the kernel's accounting; a container sees it through a
//! bind mount at the same path.
//!
//! Layout, per cgroup (`key` = hex FNV-1a of the cgroup's path inside the v2 hierarchy):
//! * `<dir>/<key>/path` — that path, for people reading the directory;
//! * `<dir>/<key>/limit.<uuid>` — `<soft> <hard>`;
//! * `<dir>/<key>/lock` — locked exclusively around every check-and-charge;
//! * `<dir>/<key>/used.<uuid>.<nonce>` — one per process: its charged bytes, locked shared for
//!   the process's life. A file whose lock can be taken exclusively belongs to a process that
//!   is gone (whatever its pid namespace) and is removed when usage is summed.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// No hard limit (`NVML_DEVICE_MEMORY_LIMIT_MAX`).
pub const NO_LIMIT: u64 = u64::MAX;

pub fn cgroup_key(path: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.trim_end_matches('/').bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}")
}

fn key_dir(dir: &Path, cgroup: &str) -> PathBuf {
    dir.join(cgroup_key(cgroup))
}

fn flock(f: &File, op: libc::c_int) -> bool {
    // SAFETY: f is an open file descriptor.
    unsafe { libc::flock(f.as_raw_fd(), op) == 0 }
}

/// Set (or, with soft 0 and hard [`NO_LIMIT`], clear) the limits of `cgroup` on GPU `uuid`.
pub fn set_limit(
    dir: &Path,
    cgroup: &str,
    uuid: &str,
    soft: u64,
    hard: u64,
) -> std::io::Result<()> {
    let k = key_dir(dir, cgroup);
    std::fs::create_dir_all(&k)?;
    std::fs::write(k.join("path"), cgroup)?;
    let p = k.join(format!("limit.{uuid}"));
    if soft == 0 && hard == NO_LIMIT {
        return match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let tmp = k.join(format!(".limit.{uuid}.{}", std::process::id()));
    std::fs::write(&tmp, format!("{soft} {hard}\n"))?;
    std::fs::rename(tmp, p)
}

/// `(soft, hard)` of `cgroup` on `uuid`; `None`: no limit.
pub fn get_limit(dir: &Path, cgroup: &str, uuid: &str) -> Option<(u64, u64)> {
    let t = std::fs::read_to_string(key_dir(dir, cgroup).join(format!("limit.{uuid}"))).ok()?;
    let mut it = t.split_whitespace().map(|v| v.parse::<u64>().ok());
    Some((it.next()??, it.next()??))
}

/// Bytes charged by live processes of `cgroup` on `uuid` (dead processes' files removed).
pub fn used(dir: &Path, cgroup: &str, uuid: &str) -> u64 {
    sum_live(&key_dir(dir, cgroup), uuid, None)
}

fn sum_live(k: &Path, uuid: &str, own: Option<&Path>) -> u64 {
    let prefix = format!("used.{uuid}.");
    let Ok(rd) = std::fs::read_dir(k) else {
        return 0;
    };
    let mut total = 0u64;
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(&prefix) {
            continue;
        }
        let p = e.path();
        if Some(p.as_path()) == own {
            continue;
        }
        let Ok(mut f) = OpenOptions::new().read(true).open(&p) else {
            continue;
        };
        if flock(&f, libc::LOCK_EX | libc::LOCK_NB) {
            // Nobody holds it: its process is gone.
            let _ = std::fs::remove_file(&p);
            continue;
        }
        let mut s = String::new();
        if f.read_to_string(&mut s).is_ok() {
            total = total.saturating_add(s.trim().parse().unwrap_or(0));
        }
    }
    total
}

/// One process's account against one cgroup's limit on one GPU.
pub struct Charger {
    key: PathBuf,
    uuid: String,
    hard: u64,
    file: File,
    path: PathBuf,
    mine: u64,
}

impl Charger {
    /// The account of this process, when `cgroup` has a hard limit on `uuid`.
    pub fn open(dir: &Path, cgroup: &str, uuid: &str) -> Option<Charger> {
        let (_, hard) = get_limit(dir, cgroup, uuid)?;
        let key = key_dir(dir, cgroup);
        let mut nonce = [0u8; 8];
        // SAFETY: nonce is a valid 8-byte buffer.
        unsafe { libc::getrandom(nonce.as_mut_ptr().cast(), nonce.len(), 0) };
        let path = key.join(format!(
            "used.{uuid}.{}.{:016x}",
            std::process::id(),
            u64::from_ne_bytes(nonce)
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .ok()?;
        if !flock(&file, libc::LOCK_SH) {
            return None;
        }
        Some(Charger {
            key,
            uuid: uuid.to_string(),
            hard,
            file,
            path,
            mine: 0,
        })
    }

    fn with_lock<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.key.join("lock"));
        if let Ok(l) = &lock {
            flock(l, libc::LOCK_EX);
        }
        f(self)
    }

    fn store(&mut self) {
        let _ = self.file.set_len(0);
        let _ = self.file.seek(SeekFrom::Start(0));
        let _ = write!(self.file, "{}", self.mine);
    }

    /// Charge `bytes`; `false` when the cgroup's hard limit would be exceeded.
    pub fn charge(&mut self, bytes: u64) -> bool {
        self.with_lock(|c| {
            let others = sum_live(&c.key, &c.uuid, Some(&c.path));
            let after = others.saturating_add(c.mine).saturating_add(bytes);
            if after > c.hard {
                return false;
            }
            c.mine += bytes;
            c.store();
            true
        })
    }

    pub fn release(&mut self, bytes: u64) {
        self.with_lock(|c| {
            c.mine = c.mine.saturating_sub(bytes);
            c.store();
        })
    }
}

impl Drop for Charger {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// This process's cgroup path in the v2 hierarchy (`0::` line of `/proc/self/cgroup`).
pub fn own_cgroup() -> Option<String> {
    let t = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    t.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_shared_by_every_account_of_the_cgroup() {
        let d = std::env::temp_dir().join(format!("mock-memlimits-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        assert!(Charger::open(&d, "/c1", "GPU-a").is_none());
        set_limit(&d, "/c1", "GPU-a", 0, 100).unwrap();
        assert_eq!(get_limit(&d, "/c1/", "GPU-a"), Some((0, 100)));
        let mut a = Charger::open(&d, "/c1", "GPU-a").unwrap();
        let mut b = Charger::open(&d, "/c1", "GPU-a").unwrap();
        assert!(a.charge(60));
        assert!(!b.charge(41));
        assert!(b.charge(40));
        assert_eq!(used(&d, "/c1", "GPU-a"), 100);
        a.release(60);
        assert!(b.charge(60));
        drop(b);
        assert_eq!(used(&d, "/c1", "GPU-a"), 0);
        set_limit(&d, "/c1", "GPU-a", 0, NO_LIMIT).unwrap();
        assert_eq!(get_limit(&d, "/c1", "GPU-a"), None);
        let _ = std::fs::remove_dir_all(&d);
    }
}
