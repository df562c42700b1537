//! Stream-ordered memory pools beyond allocation (`lib.rs` allocates and frees): the pool each
//! device allocates from (`cuDeviceSetMemPool`, CUDA 13's `cuMemSetMemPool`), pool attributes,
//! access and trimming, and what a pool keeps, as the driver does:
//!
//! - memory freed into a pool (`cuMemFreeAsync`) stays reserved by the pool, still taken from
//!   the device, and the pool's next allocations reuse it;
//! - at a synchronization (`cuStreamSynchronize`, `cuEventSynchronize`, `cuCtxSynchronize`) the
//!   pool gives back to the device what it keeps above its release threshold (0 by default:
//!   everything; PyTorch's `cudaMallocAsync` backend sets it to the maximum);
//! - `cuMemPoolTrimTo` gives back all but the bytes asked to keep, `cuMemPoolDestroy` all.
//!
//! `RESERVED_MEM_CURRENT` is the pool's live allocations plus what it keeps.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use crate::driver::{CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_UNKNOWN, Kind, State};
use crate::driver::{CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, CUresult, guard, put, state, tri};
use crate::vram;

/// Default memory pools are `POOL_BASE + device`.
pub(crate) const POOL_BASE: u64 = 0x9001_0000;

pub(crate) fn pool_device(s: &State, pool: u64) -> Result<usize, CUresult> {
    if pool >= POOL_BASE && pool - POOL_BASE < s.devices.len() as u64 {
        return Ok((pool - POOL_BASE) as usize);
    }
    let m = s.allocs.lock().map_err(|_| CUDA_ERROR_UNKNOWN)?;
    m.get(&(Kind::Pool as u8, pool))
        .map(|e| e.0)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// pool → (device, bytes it keeps: freed, still taken from the device)
static KEPT: Mutex<Option<HashMap<u64, (usize, u64)>>> = Mutex::new(None);

fn kept<R>(f: impl FnOnce(&mut HashMap<u64, (usize, u64)>) -> R) -> R {
    let mut m = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    f(m.get_or_insert_with(HashMap::new))
}

/// Up to `bytes` of what `pool` keeps, taken for a new allocation (no device charge for it).
pub(crate) fn reuse(pool: u64, bytes: u64) -> u64 {
    kept(|m| match m.get_mut(&pool) {
        Some(e) => {
            let r = e.1.min(bytes);
            e.1 -= r;
            r
        }
        None => 0,
    })
}

/// `bytes` of an allocation of `pool` on `dev` were freed into the pool.
pub(crate) fn returned(pool: u64, dev: usize, bytes: u64) {
    kept(|m| m.entry(pool).or_insert((dev, 0)).1 += bytes);
}

/// Give back to the device what `pool` keeps above `keep` (all pools above their release
/// threshold when `pool` is None).
fn give_back(pool: Option<u64>, keep: Option<u64>) {
    let Ok(s) = state() else { return };
    let back: Vec<(usize, u64)> = kept(|m| {
        m.iter_mut()
            .filter(|(p, _)| pool.is_none_or(|q| q == **p))
            .filter_map(|(p, e)| {
                let k = keep.unwrap_or_else(|| threshold(*p));
                (e.1 > k).then(|| {
                    let r = e.1 - k;
                    e.1 = k;
                    (e.0, r)
                })
            })
            .collect()
    });
    for (dev, bytes) in back {
        crate::driver::uncharge(s, dev, bytes);
    }
}

/// A synchronization: every pool gives back what it keeps above its release threshold.
pub(crate) fn synchronized() {
    give_back(None, None);
}

fn threshold(pool: u64) -> u64 {
    ATTRS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&(pool, RELEASE_THRESHOLD)).copied())
        .unwrap_or(0)
}

/// The pool is gone: all it keeps goes back.
pub(crate) fn destroyed(pool: u64) {
    give_back(Some(pool), Some(0));
    kept(|m| m.remove(&pool));
    // a device it was current for has its default pool current again
    let mut m = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = m.as_mut() {
        m.retain(|_, p| *p != pool);
    }
}

/// device → the pool `cuMemAllocAsync` uses (absent: the default pool)
static CURRENT: Mutex<Option<HashMap<usize, u64>>> = Mutex::new(None);
/// (pool, attribute) → value set by `cuMemPoolSetAttribute`
static ATTRS: Mutex<Option<HashMap<(u64, c_int), u64>>> = Mutex::new(None);

pub(crate) fn current(dev: usize) -> u64 {
    let m = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    m.as_ref()
        .and_then(|m| m.get(&dev).copied())
        .unwrap_or(POOL_BASE + dev as u64)
}

fn set_current(dev: usize, pool: u64) {
    let mut m = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    m.get_or_insert_with(HashMap::new).insert(dev, pool);
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceSetMemPool(dev: c_int, pool: u64) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let d = tri!(
            usize::try_from(dev)
                .ok()
                .filter(|d| *d < s.devices.len())
                .ok_or(CUDA_ERROR_INVALID_DEVICE)
        );
        if tri!(pool_device(s, pool)) != d {
            return CUDA_ERROR_INVALID_VALUE;
        }
        set_current(d, pool);
        CUDA_SUCCESS
    })
}

/// `CUmemLocation`
#[repr(C)]
pub struct Location {
    pub kind: c_int,
    pub id: c_int,
}

fn location_device(loc: *const Location) -> Result<usize, CUresult> {
    // SAFETY: the caller's CUmemLocation, checked non-null.
    let l = unsafe { loc.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let s = state()?;
    if l.kind != 1 {
        return Err(crate::driver::CUDA_ERROR_NOT_SUPPORTED);
    }
    usize::try_from(l.id)
        .ok()
        .filter(|d| *d < s.devices.len())
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

/// CUDA 13: the default pool of a location (devices only here: host pools are not simulated).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetDefaultMemPool(
    pool: *mut u64,
    loc: *const Location,
    _kind: c_int,
) -> CUresult {
    guard(|| {
        let d = tri!(location_device(loc));
        // SAFETY: put refuses a null `pool`; otherwise the caller's out-slot.
        unsafe { put(pool, POOL_BASE + d as u64) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetMemPool(
    pool: *mut u64,
    loc: *const Location,
    _kind: c_int,
) -> CUresult {
    guard(|| {
        let d = tri!(location_device(loc));
        // SAFETY: put refuses a null `pool`; otherwise the caller's out-slot.
        unsafe { put(pool, current(d)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetMemPool(
    loc: *const Location,
    _kind: c_int,
    pool: u64,
) -> CUresult {
    guard(|| {
        let d = tri!(location_device(loc));
        cuDeviceSetMemPool(d as c_int, pool)
    })
}

const REUSE_FOLLOW_EVENT: c_int = 1;
const REUSE_ALLOW_INTERNAL: c_int = 3;
const RELEASE_THRESHOLD: c_int = 4;
const RESERVED_MEM_CURRENT: c_int = 5;
const RESERVED_MEM_HIGH: c_int = 6;
const USED_MEM_HIGH: c_int = 8;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: u64,
    attr: c_int,
    value: *const c_void,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        tri!(pool_device(s, pool));
        if value.is_null() || !(REUSE_FOLLOW_EVENT..=USED_MEM_HIGH).contains(&attr) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let v = if attr <= REUSE_ALLOW_INTERNAL {
            // SAFETY: reuse attributes are ints (non-null, checked).
            u64::from(unsafe { *value.cast::<c_int>() } as u32)
        } else {
            // SAFETY: the other attributes are cuuint64_t (non-null, checked).
            unsafe { *value.cast::<u64>() }
        };
        let mut m = ATTRS.lock().unwrap_or_else(|e| e.into_inner());
        m.get_or_insert_with(HashMap::new).insert((pool, attr), v);
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: u64,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        tri!(pool_device(s, pool));
        if value.is_null() || !(REUSE_FOLLOW_EVENT..=USED_MEM_HIGH).contains(&attr) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let set = ATTRS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|m| m.get(&(pool, attr)).copied());
        if attr <= REUSE_ALLOW_INTERNAL {
            // SAFETY: reuse attributes are ints; `value` checked non-null.
            unsafe { *value.cast::<c_int>() = set.unwrap_or(1) as c_int };
        } else {
            let used = vram::pool_bytes(pool);
            let v = match attr {
                RELEASE_THRESHOLD => set.unwrap_or(0),
                // reserved: live allocations and what the pool keeps
                RESERVED_MEM_CURRENT | RESERVED_MEM_HIGH => {
                    used + kept(|m| m.get(&pool).map_or(0, |e| e.1))
                }
                _ => used,
            };
            // SAFETY: the other attributes are cuuint64_t; `value` checked non-null.
            unsafe { *value.cast::<u64>() = v };
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolTrimTo(pool: u64, keep: usize) -> CUresult {
    guard(|| {
        let s = tri!(state());
        tri!(pool_device(s, pool));
        give_back(Some(pool), Some(keep as u64));
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolSetAccess(pool: u64, desc: *const c_void, count: usize) -> CUresult {
    guard(|| {
        let s = tri!(state());
        tri!(pool_device(s, pool));
        if desc.is_null() && count != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        CUDA_SUCCESS
    })
}

/// Read-write access from the pool's own device (`CU_MEM_ACCESS_FLAGS_PROT_READWRITE`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAccess(
    flags: *mut c_int,
    pool: u64,
    _loc: *const Location,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        tri!(pool_device(s, pool));
        // SAFETY: put refuses a null `flags`; otherwise the caller's out-slot.
        unsafe { put(flags, 3) }
    })
}

pub(crate) fn exports() -> Vec<(&'static str, usize)> {
    crate::driver::table!(
        cuDeviceSetMemPool,
        cuMemGetDefaultMemPool,
        cuMemGetMemPool,
        cuMemSetMemPool,
        cuMemPoolSetAttribute,
        cuMemPoolGetAttribute,
        cuMemPoolTrimTo,
        cuMemPoolSetAccess,
        cuMemPoolGetAccess,
    )
}
