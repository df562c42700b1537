//! Refused container creations by reason: `state-dir/.refusals`, a host-only file of `u64`
//! counters (one per [`Reason`]), mapped shared and bumped atomically by every refusing
//! `gpufence-runtime` or hook process; `gpufence exporter` serves it as
//! `gpufence_create_refusals_total{reason}`.
//!
//! Why a counter file and not the decision log (which carries the same `reason` field on its
//! `refused` line): the log may be rotated or truncated, so counting its lines would go back
//! and forth with rotation and force the exporter to follow files across renames, and
//! re-reading a growing log at every scrape costs more the longer the node runs. The counters
//! cost one small `mmap` on the (rare) refusal path and one 144-byte read per scrape, survive log
//! rotation, and reset only with the state directory (a reboot; Prometheus handles counter
//! resets). The name starts with a dot: no container id can take it.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// File name inside `state-dir`.
pub const FILE_NAME: &str = ".refusals";
const MAGIC: u64 = 0x6766_7265_6675_7301; // "gfrefus" + version 1
const SLOTS: usize = 16;
const SIZE: usize = 8 * (1 + SLOTS);

pub use crate::exit::{REASONS, Reason};

fn slot(reason: Reason) -> usize {
    REASONS.iter().position(|r| *r == reason).unwrap_or(0)
}

/// Count one refusal (best effort: a failure is logged, the refusal itself stands).
pub fn count(state_dir: &Path, reason: Reason) {
    if let Err(e) = bump(state_dir, reason) {
        tracing::warn!(error = %e, reason = reason.as_str(), "refusal not counted");
    }
}

fn bump(state_dir: &Path, reason: Reason) -> std::io::Result<()> {
    crate::fsutil::create_state_dir(state_dir)?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(state_dir.join(FILE_NAME))?;
    let m = f.metadata()?;
    if !m.is_file() || m.len() > SIZE as u64 {
        return Err(std::io::Error::other("not a gpufence refusal counter file"));
    }
    if m.len() < SIZE as u64 {
        f.set_len(SIZE as u64)?;
    }
    // SAFETY: a shared mapping of SIZE bytes of a regular file at least that long (checked
    // above; a concurrent grower only extends it to the same size).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: page-aligned mapping of SIZE bytes, viewed as 1 + SLOTS u64 atomics (any bit
    // pattern is a valid u64); unmapped below, nothing keeps the reference.
    let words = unsafe { std::slice::from_raw_parts(p as *const AtomicU64, 1 + SLOTS) };
    let _ = words[0].compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire);
    let ok = words[0].load(Ordering::Acquire) == MAGIC;
    if ok {
        words[1 + slot(reason)].fetch_add(1, Ordering::AcqRel);
    }
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(p, SIZE) };
    if ok {
        Ok(())
    } else {
        Err(std::io::Error::other(
            "refusal counter file has a foreign header",
        ))
    }
}

/// The counters read from the file's bytes (all reasons, zero when absent or malformed).
pub fn decode(b: &[u8]) -> Vec<(Reason, u64)> {
    let word = |i: usize| {
        b.get(8 * i..8 * i + 8)
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map_or(0, u64::from_ne_bytes)
    };
    let valid = b.len() == SIZE && word(0) == MAGIC;
    REASONS
        .iter()
        .map(|r| (*r, if valid { word(1 + slot(*r)) } else { 0 }))
        .collect()
}

/// The counters of `state_dir` (bounded read of a regular file, no symlink followed).
pub fn read(state_dir: &Path) -> Vec<(Reason, u64)> {
    let bytes = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(state_dir)
        .ok()
        .and_then(|d| {
            let flags = nix::fcntl::ResolveFlag::RESOLVE_BENEATH
                | nix::fcntl::ResolveFlag::RESOLVE_NO_SYMLINKS;
            super::open::read_bounded(&d, FILE_NAME, flags, SIZE).ok()
        })
        .unwrap_or_default();
    decode(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_survive_processes_and_tolerate_garbage() {
        let d = tempfile::tempdir().unwrap();
        let s = d.path().join("state");
        assert!(read(&s).iter().all(|(_, n)| *n == 0));
        count(&s, Reason::Allocation);
        count(&s, Reason::Allocation);
        count(&s, Reason::Host);
        let got = read(&s);
        assert_eq!(got[0], (Reason::Allocation, 2));
        assert_eq!(got[4], (Reason::Host, 1));
        assert_eq!(got.len(), REASONS.len());
        // garbage: zeros, never a panic, and bumping refuses a foreign file
        std::fs::write(s.join(FILE_NAME), vec![7u8; SIZE]).unwrap();
        assert!(read(&s).iter().all(|(_, n)| *n == 0));
        assert!(bump(&s, Reason::Spec).is_err());
        std::fs::write(s.join(FILE_NAME), b"short").unwrap();
        assert!(read(&s).iter().all(|(_, n)| *n == 0));
        // a symlink is not followed
        std::fs::remove_file(s.join(FILE_NAME)).unwrap();
        std::os::unix::fs::symlink(d.path().join("elsewhere"), s.join(FILE_NAME)).unwrap();
        assert!(bump(&s, Reason::Spec).is_err());
        assert!(!d.path().join("elsewhere").exists());
    }
}
