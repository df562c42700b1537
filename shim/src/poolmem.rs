//! What a stream-ordered memory pool keeps. Memory freed into a pool (`cuMemFreeAsync`) is not
//! given back to the device: the pool keeps it for its next allocations and gives back only what
//! it keeps above its release threshold, at the next synchronization (stream, event or context),
//! or when trimmed (`cuMemPoolTrimTo`) or destroyed. PyTorch's `cudaMallocAsync` backend sets the
//! threshold to the maximum, so a pool keeps everything until `torch.cuda.empty_cache()` trims
//! it. Releasing the charge at the free would let the container allocate that memory a second
//! time through any other path (`cuMemAlloc`, another pool, VMM) while the pool still holds it.
//!
//! So the charge of a pool allocation stays with the pool after the free ("kept"); the pool's
//! next allocations use the kept bytes before charging anything; a synchronization releases what
//! a pool keeps above its threshold, a trim what it keeps above the bytes asked to stay, a
//! destruction everything.
//!
//! Pools live in a fixed array of slots (no lock; a slot is taken by a CAS on its handle): more
//! pools than slots are charged as before (released at the free), which can under-count only
//! for those pools.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::ffi::CUDA_SUCCESS;
use crate::{real, state};

const SLOTS: usize = 64;

struct Pool {
    /// pool handle (0: free slot)
    handle: AtomicU64,
    /// quota device the kept bytes are charged to
    idx: AtomicU64,
    /// bytes freed into the pool, still charged
    kept: AtomicU64,
    /// release threshold (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`)
    threshold: AtomicU64,
}

static POOLS: [Pool; SLOTS] = [const {
    Pool {
        handle: AtomicU64::new(0),
        idx: AtomicU64::new(0),
        kept: AtomicU64::new(0),
        threshold: AtomicU64::new(0),
    }
}; SLOTS];
/// Some pool keeps bytes above its threshold (a synchronization has work to do).
static PENDING: AtomicBool = AtomicBool::new(false);

fn find(pool: u64) -> Option<&'static Pool> {
    POOLS
        .iter()
        .find(|p| pool != 0 && p.handle.load(Ordering::Acquire) == pool)
}

fn find_or_take(pool: u64) -> Option<&'static Pool> {
    if let Some(p) = find(pool) {
        return Some(p);
    }
    POOLS.iter().find(|p| {
        p.handle
            .compare_exchange(0, pool, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    })
}

/// Take up to `bytes` of what `pool` keeps for a new allocation charged to quota device `idx`.
pub fn reuse(pool: u64, idx: usize, bytes: u64) -> u64 {
    let Some(p) = find(pool) else { return 0 };
    if p.idx.load(Ordering::Acquire) != idx as u64 {
        return 0;
    }
    let mut took = 0;
    let _ = p
        .kept
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |k| {
            took = k.min(bytes);
            Some(k - took)
        });
    took
}

/// `bytes` charged to quota device `idx` went (back) into `pool`. False: no slot for the pool
/// (the caller releases the charge itself).
pub fn keep(pool: u64, idx: usize, bytes: u64) -> bool {
    let Some(p) = find_or_take(pool) else {
        return false;
    };
    p.idx.store(idx as u64, Ordering::Release);
    let k = p.kept.fetch_add(bytes, Ordering::AcqRel) + bytes;
    if k > p.threshold.load(Ordering::Acquire) {
        PENDING.store(true, Ordering::Release);
    }
    true
}

/// Release what `p` keeps above `floor`.
fn release_above(p: &Pool, floor: u64) {
    let mut freed = 0;
    let _ = p
        .kept
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |k| {
            freed = k.saturating_sub(floor);
            Some(k.min(floor))
        });
    if freed != 0
        && let Some(cfg) = state::config()
    {
        cfg.region
            .uncharge(p.idx.load(Ordering::Acquire) as usize, freed);
    }
}

/// A synchronization succeeded: every pool gives back what it keeps above its threshold.
pub fn synchronized() {
    // a plain load first: a synchronization with nothing to release writes nothing
    if !PENDING.load(Ordering::Acquire) || !PENDING.swap(false, Ordering::AcqRel) {
        return;
    }
    for p in &POOLS {
        if p.handle.load(Ordering::Acquire) != 0 {
            release_above(p, p.threshold.load(Ordering::Acquire));
        }
    }
}

/// `cuMemPoolTrimTo(pool, keep)` succeeded.
pub fn trimmed(pool: u64, keep_bytes: u64) {
    if let Some(p) = find(pool) {
        release_above(p, keep_bytes);
    }
}

/// `pool`'s release threshold was set.
pub fn set_threshold(pool: u64, threshold: u64) {
    if let Some(p) = find_or_take(pool) {
        p.threshold.store(threshold, Ordering::Release);
        PENDING.store(true, Ordering::Release);
    }
}

/// `pool` was destroyed: what it kept goes back, its slot is free again.
pub fn destroyed(pool: u64) {
    if let Some(p) = find(pool) {
        release_above(p, 0);
        p.threshold.store(0, Ordering::Release);
        p.handle.store(0, Ordering::Release);
    }
}

// The current pool of each device (what `cuMemAllocAsync` takes from), as last seen: asked of
// the driver once, then followed through `cuDeviceSetMemPool`, `cuDeviceGetMemPool`,
// `cuMemPoolDestroy` (the default pool is current again) and a primary context reset (asked
// again). 0: not known.
const MAX_ORDINALS: usize = 64;
static CURRENT: [AtomicU64; MAX_ORDINALS] = [const { AtomicU64::new(0) }; MAX_ORDINALS];

fn current_slot(dev: c_int) -> Option<&'static AtomicU64> {
    usize::try_from(dev).ok().and_then(|d| CURRENT.get(d))
}

/// The current pool of CUDA ordinal `dev` (0: the driver cannot say).
pub fn current_pool(dev: c_int) -> u64 {
    let slot = current_slot(dev);
    if let Some(p) = slot.map(|s| s.load(Ordering::Acquire))
        && p != 0
    {
        return p;
    }
    let Some(get) = real::cuDeviceGetMemPool() else {
        return 0;
    };
    let mut p: usize = 0;
    // SAFETY: the driver's own cuDeviceGetMemPool with a valid out-pointer.
    if unsafe { get(&mut p, dev) } != CUDA_SUCCESS {
        return 0;
    }
    if let Some(s) = slot {
        s.store(p as u64, Ordering::Release);
    }
    p as u64
}

/// `pool` is (now) the current pool of CUDA ordinal `dev`; 0: ask the driver again.
pub fn set_current(dev: c_int, pool: u64) {
    if let Some(s) = current_slot(dev) {
        s.store(pool, Ordering::Release);
    }
}

/// `pool` is gone: a device it was current for has its default pool current again.
pub fn current_gone(pool: u64) {
    for s in &CURRENT {
        let _ = s.compare_exchange(pool, 0, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Fork child: the parent's pools are not ours.
pub fn forget_process() {
    for s in &CURRENT {
        s.store(0, Ordering::Relaxed);
    }
    for p in &POOLS {
        p.handle.store(0, Ordering::Relaxed);
        p.kept.store(0, Ordering::Relaxed);
        p.threshold.store(0, Ordering::Relaxed);
    }
    PENDING.store(false, Ordering::Relaxed);
}
