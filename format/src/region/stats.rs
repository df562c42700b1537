//! The observability block of the accounting region (`gpufence ps`, `gpufence exporter`):
//! container-wide figures per quota device that the enforcement itself does not need. It sits
//! after the slots, with a version word of its own, so readers and the enforcing part evolve
//! separately: a reader that does not know the version shows usage without these figures.
//!
//! Written with plain atomic stores/RMWs in the paths that already touch the region: the peak
//! after a successful charge (one load in the common case — the RMW only when a new peak is
//! reached), the refusal figures only when a charge is refused. No syscall, no lock.
//!
//! Like the whole region, the block is writable by every process of the container: its figures
//! are for display only and are never trusted by the host for anything else.

use std::sync::atomic::{AtomicU64, Ordering};

use super::layout::MAX_DEVICES;

/// `"obs\0"` + version 1. A different value (an older or newer shim, or garbage) means the
/// reader ignores the block.
pub const VERSION: u64 = 0x6f62_7300_0000_0001;

#[repr(C)]
pub struct Stats {
    /// [`VERSION`], stamped by the first process that maps the region.
    pub(crate) version: AtomicU64,
    /// Highest container-wide bytes in use seen by a successful charge.
    pub(crate) peak: [AtomicU64; MAX_DEVICES],
    /// Allocations refused (count).
    pub(crate) refusals: [AtomicU64; MAX_DEVICES],
    /// Bytes asked by the most recent refused allocation.
    pub(crate) last_refused: [AtomicU64; MAX_DEVICES],
    /// Compute used: cumulative device time in nanoseconds the compute-share limiter charged to
    /// the container's launches on this device (devices with a `cores` share; readers show it
    /// only when non-zero).
    pub(crate) compute_ns: [AtomicU64; MAX_DEVICES],
}

impl Stats {
    /// Stamp the version on a fresh (all-zero) block; leave any other value alone.
    pub fn stamp(&self) {
        let _ = self
            .version
            .compare_exchange(0, VERSION, Ordering::AcqRel, Ordering::Acquire);
    }

    /// A charge succeeded and `now` bytes are in use on device `d`.
    #[inline(always)]
    pub fn note_in_use(&self, d: usize, now: u64) {
        if let Some(p) = self.peak.get(d)
            && now > p.load(Ordering::Relaxed)
        {
            p.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// A launch costing `ns` of device time was admitted on device `d` (compute share).
    #[inline(always)]
    pub fn note_compute(&self, d: usize, ns: u64) {
        if let Some(c) = self.compute_ns.get(d) {
            c.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// A charge of `bytes` on device `d` was refused.
    #[cold]
    pub fn note_refusal(&self, d: usize, bytes: u64) {
        if let (Some(c), Some(l)) = (self.refusals.get(d), self.last_refused.get(d)) {
            c.fetch_add(1, Ordering::Relaxed);
            l.store(bytes, Ordering::Relaxed);
        }
    }
}
