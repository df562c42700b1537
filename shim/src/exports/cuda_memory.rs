//! The CUDA driver's memory calls: every way to allocate device memory (linear, pitched, managed,
//! stream-ordered and from pools, VMM handles, arrays) is charged to the container's quota
//! before the driver runs and released when the driver freed it; `cuMemGetInfo` and
//! `cuDeviceTotalMem` report the container's slice of the device. Stream-ordered allocations
//! made while a stream captures belong to the graph (`graphmem`).

use std::ffi::{c_int, c_uint, c_void};

use super::{guard, real_or};
use crate::enforce::{
    charge, charged, current_ordinal, enforce_current, enforce_dev, enforce_pool, read_ptr,
    released, slice,
};
use crate::ffi::{
    ATTACH_GLOBAL, AllocationProp, Array3dDesc, ArrayDesc, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
    CUresult, LOCATION_DEVICE, PropHead,
};
use crate::state::{Acct, Config};
use crate::table::{self, Kind};
use crate::{cores, graphmem, poolmem, real, state, vmmmem};

// Linear memory

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, bytes: usize) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemAlloc_v2);
        let e = enforce_current();
        if let Some((cfg, a)) = e
            && cfg.oversubscribe
            && cfg.region.used(a.idx).saturating_add(bytes as u64) > a.limit
        {
            // spill: host-backed managed memory, not charged to the device quota
            let m = real_or!(cuMemAllocManaged);
            // SAFETY: `m` is the driver's own cuMemAllocManaged (dlsym'd, non-null, transmuted to
            // its exact C signature); `dptr` is the application's out-pointer passed through, the
            // flag a valid CU_MEM_ATTACH_GLOBAL.
            return unsafe { m(dptr, bytes, ATTACH_GLOBAL) };
        }
        charged(
            e,
            "cuMemAlloc",
            Kind::Linear,
            bytes as u64,
            // SAFETY: `f` is the driver's own cuMemAlloc_v2 (dlsym'd, non-null, transmuted to its
            // exact C signature); the application's arguments go through unchanged under the CUDA
            // caller contract.
            || unsafe { f(dptr, bytes) },
            // SAFETY: charged() runs this only after the driver returned CUDA_SUCCESS, i.e. wrote
            // the out-slot; read_ptr rejects null.
            || unsafe { read_ptr(dptr) },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut u64,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemAllocManaged);
        charged(
            enforce_current(),
            "cuMemAllocManaged",
            Kind::Linear,
            bytes as u64,
            // SAFETY: `f` is the driver's own cuMemAllocManaged (dlsym'd, non-null, transmuted to
            // its exact C signature); the application's arguments go through unchanged under the
            // CUDA caller contract.
            || unsafe { f(dptr, bytes, flags) },
            // SAFETY: charged() runs this only after the driver returned CUDA_SUCCESS, i.e. wrote
            // the out-slot; read_ptr rejects null.
            || unsafe { read_ptr(dptr) },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemAllocPitch_v2);
        let Some((cfg, a)) = enforce_current() else {
            // SAFETY: `f` is the driver's own cuMemAllocPitch_v2 (dlsym'd, non-null, transmuted to
            // its exact C signature); the application's arguments go through unchanged under the
            // CUDA caller contract.
            return unsafe { f(dptr, pitch, width, height, elem) };
        };
        // charge the widest pitch the driver may choose, then settle on the real one
        let estimate = (width.div_ceil(512) as u64)
            .saturating_mul(512)
            .saturating_mul(height as u64);
        if !charge(cfg, a, "cuMemAllocPitch", estimate) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        // SAFETY: `f` is the driver's own cuMemAllocPitch_v2 (dlsym'd, non-null, transmuted to its
        // exact C signature); the application's arguments go through unchanged under the CUDA
        // caller contract.
        let r = unsafe { f(dptr, pitch, width, height, elem) };
        if r != CUDA_SUCCESS || pitch.is_null() || dptr.is_null() {
            cfg.region.uncharge(a.idx, estimate);
            return r;
        }
        // SAFETY: `pitch` and `dptr` were checked non-null above and the driver just returned
        // CUDA_SUCCESS, so both hold the values it wrote.
        let (p, ptr) = unsafe { (pitch.read() as u64, dptr.read()) };
        let actual = p.saturating_mul(height as u64);
        if actual > estimate && !charge(cfg, a, "cuMemAllocPitch", actual - estimate) {
            if let Some(free) = real::cuMemFree_v2() {
                // SAFETY: `free` is the driver's cuMemFree_v2 (dlsym'd, non-null, exact signature);
                // `ptr` is the allocation it just returned, freed exactly once.
                unsafe { free(ptr) };
            }
            cfg.region.uncharge(a.idx, estimate);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if actual < estimate {
            cfg.region.uncharge(a.idx, estimate - actual);
        }
        table::insert(Kind::Linear, ptr, table::pack(a.idx, actual));
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: u64) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemFree_v2);
        // SAFETY: `f` is the driver's own cuMemFree_v2 (dlsym'd, non-null, transmuted to its exact
        // C signature); the application's arguments go through unchanged under the CUDA caller
        // contract.
        released(Kind::Linear, dptr, || unsafe { f(dptr) })
    })
}

// Stream-ordered allocator

/// A stream-ordered allocation from `pool`: on a capturing stream a memory node of the graph
/// being captured, charged when the graph runs (`graphmem`); otherwise what the pool keeps is
/// used first and the rest charged, and the allocation is recorded with its pool so that its
/// free goes back to the pool (`poolmem`).
#[inline]
fn stream_ordered(
    e: Option<(&'static Config, Acct)>,
    what: &str,
    bytes: u64,
    (stream, ptsz, pool): (usize, bool, u64),
    call: impl FnOnce() -> CUresult,
    handle: impl FnOnce() -> u64,
) -> CUresult {
    let Some((cfg, a)) = e else {
        return call();
    };
    if cores::capturing(stream, ptsz) {
        let r = call();
        if r == CUDA_SUCCESS {
            graphmem::captured_alloc(stream, ptsz, bytes);
        }
        return r;
    }
    let reused = poolmem::reuse(pool, a.idx, bytes);
    let fresh = bytes - reused;
    if fresh > 0 && !charge(cfg, a, what, fresh) {
        poolmem::keep(pool, a.idx, reused);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let r = call();
    if r != CUDA_SUCCESS {
        cfg.region.uncharge(a.idx, fresh);
        poolmem::keep(pool, a.idx, reused);
        return r;
    }
    let h = handle();
    // a full table keeps the charge until the process exits (fail closed)
    table::insert(Kind::Linear, h, table::pack(a.idx, bytes));
    if pool != 0 {
        table::insert(Kind::AllocPool, h, pool);
    }
    r
}

/// Enforcement for the current context's device, and the pool `cuMemAllocAsync` takes from
/// there: the device's current pool (0: unknown; asked of the driver only when enforcing).
fn enforce_current_pool() -> (Option<(&'static Config, Acct)>, u64) {
    let Some(d) = state::config().and_then(|_| current_ordinal()) else {
        return (None, 0);
    };
    match enforce_dev(d) {
        Some(e) => (Some(e), poolmem::current_pool(d)),
        None => (None, 0),
    }
}

/// A stream-ordered free: an allocation of a pool goes back to the pool, still charged
/// (`poolmem`); any other is released.
fn stream_ordered_free(dptr: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let (Some(_), Some(pool)) = (state::config(), table::take(Kind::AllocPool, dptr)) else {
        return released(Kind::Linear, dptr, call);
    };
    let taken = table::take(Kind::Linear, dptr);
    let r = call();
    if let Some(v) = taken {
        if r == CUDA_SUCCESS {
            let (d, b) = table::unpack(v);
            if !poolmem::keep(pool, d, b)
                && let Some(cfg) = state::config()
            {
                cfg.region.uncharge(d, b);
            }
        } else {
            table::insert(Kind::Linear, dptr, v);
            table::insert(Kind::AllocPool, dptr, pool);
        }
    }
    r
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut u64, bytes: usize, stream: usize) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemAllocAsync);
        let (e, pool) = enforce_current_pool();
        stream_ordered(
            e,
            "cuMemAllocAsync",
            bytes as u64,
            (stream, false, pool),
            // SAFETY: `f` is the driver's own cuMemAllocAsync (dlsym'd, non-null, transmuted to its
            // exact C signature); the application's arguments go through unchanged under the CUDA
            // caller contract.
            || unsafe { f(dptr, bytes, stream) },
            // SAFETY: charged() runs this only after the driver returned CUDA_SUCCESS, i.e. wrote
            // the out-slot; read_ptr rejects null.
            || unsafe { read_ptr(dptr) },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut u64,
    bytes: usize,
    stream: usize,
) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemAllocAsync_ptsz);
        let (e, pool) = enforce_current_pool();
        stream_ordered(
            e,
            "cuMemAllocAsync",
            bytes as u64,
            (stream, true, pool),
            // SAFETY: `f` is the driver's own cuMemAllocAsync_ptsz (dlsym'd, non-null, transmuted
            // to its exact C signature); the application's arguments go through unchanged under the
            // CUDA caller contract.
            || unsafe { f(dptr, bytes, stream) },
            // SAFETY: charged() runs this only after the driver returned CUDA_SUCCESS, i.e. wrote
            // the out-slot; read_ptr rejects null.
            || unsafe { read_ptr(dptr) },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut u64,
    bytes: usize,
    pool: usize,
    stream: usize,
) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemAllocFromPoolAsync);
        stream_ordered(
            enforce_pool(pool),
            "cuMemAllocFromPoolAsync",
            bytes as u64,
            (stream, false, pool as u64),
            // SAFETY: `f` is the driver's own cuMemAllocFromPoolAsync (dlsym'd, non-null,
            // transmuted to its exact C signature); the application's arguments go through
            // unchanged under the CUDA caller contract.
            || unsafe { f(dptr, bytes, pool, stream) },
            // SAFETY: charged() runs this only after the driver returned CUDA_SUCCESS, i.e. wrote
            // the out-slot; read_ptr rejects null.
            || unsafe { read_ptr(dptr) },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut u64,
    bytes: usize,
    pool: usize,
    stream: usize,
) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemAllocFromPoolAsync_ptsz);
        stream_ordered(
            enforce_pool(pool),
            "cuMemAllocFromPoolAsync",
            bytes as u64,
            (stream, true, pool as u64),
            // SAFETY: `f` is the driver's own cuMemAllocFromPoolAsync_ptsz (dlsym'd, non-null,
            // transmuted to its exact C signature); the application's arguments go through
            // unchanged under the CUDA caller contract.
            || unsafe { f(dptr, bytes, pool, stream) },
            // SAFETY: charged() runs this only after the driver returned CUDA_SUCCESS, i.e. wrote
            // the out-slot; read_ptr rejects null.
            || unsafe { read_ptr(dptr) },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: u64, stream: usize) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemFreeAsync);
        // SAFETY: `f` is the driver's own cuMemFreeAsync (dlsym'd, non-null, transmuted to its
        // exact C signature); the application's arguments go through unchanged under the CUDA
        // caller contract.
        stream_ordered_free(dptr, || unsafe { f(dptr, stream) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: u64, stream: usize) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemFreeAsync_ptsz);
        // SAFETY: `f` is the driver's own cuMemFreeAsync_ptsz (dlsym'd, non-null, transmuted to its
        // exact C signature); the application's arguments go through unchanged under the CUDA
        // caller contract.
        stream_ordered_free(dptr, || unsafe { f(dptr, stream) })
    })
}

fn note_pool(pool: *mut usize, dev: c_int) {
    if !pool.is_null() && dev >= 0 && state::config().is_some() {
        // SAFETY: the driver just wrote it.
        let p = unsafe { pool.read() } as u64;
        let _ = table::take(Kind::Pool, p);
        table::insert(Kind::Pool, p, dev as u64);
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut usize, props: *const PropHead) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemPoolCreate);
        // SAFETY: `f` is the driver's own cuMemPoolCreate (dlsym'd, non-null, transmuted to its
        // exact C signature); the application's arguments go through unchanged under the CUDA
        // caller contract.
        let r = unsafe { f(pool, props) };
        if r == CUDA_SUCCESS && !props.is_null() {
            // SAFETY: `props` was checked non-null; the CUDA contract makes it a valid
            // CUmemPoolProps, whose leading fields PropHead mirrors (repr(C)).
            let p = unsafe { &*props };
            if p.location_type == LOCATION_DEVICE {
                note_pool(pool, p.location_id);
            }
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: usize) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemPoolDestroy);
        // SAFETY: `f` is the driver's own cuMemPoolDestroy (dlsym'd, non-null, transmuted to its
        // exact C signature); the application's arguments go through unchanged under the CUDA
        // caller contract.
        let r = unsafe { f(pool) };
        if r == CUDA_SUCCESS && state::config().is_some() {
            let _ = table::take(Kind::Pool, pool as u64);
            poolmem::destroyed(pool as u64);
            poolmem::current_gone(pool as u64);
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut usize, dev: c_int) -> CUresult {
    guard(|| {
        let f = real_or!(cuDeviceGetDefaultMemPool);
        // SAFETY: `f` is the driver's own cuDeviceGetDefaultMemPool (dlsym'd, non-null, transmuted
        // to its exact C signature); the application's arguments go through unchanged under the
        // CUDA caller contract.
        let r = unsafe { f(pool, dev) };
        if r == CUDA_SUCCESS {
            note_pool(pool, dev);
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut usize, dev: c_int) -> CUresult {
    guard(|| {
        let f = real_or!(cuDeviceGetMemPool);
        // SAFETY: `f` is the driver's own cuDeviceGetMemPool (dlsym'd, non-null, transmuted to its
        // exact C signature); the application's arguments go through unchanged under the CUDA
        // caller contract.
        let r = unsafe { f(pool, dev) };
        if r == CUDA_SUCCESS {
            note_pool(pool, dev);
            // SAFETY: the driver succeeded, so `pool` (checked non-null) holds the pool.
            if let Some(p) = unsafe { pool.as_ref() } {
                poolmem::set_current(dev, *p as u64);
            }
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: c_int, pool: usize) -> CUresult {
    guard(|| {
        let f = real_or!(cuDeviceSetMemPool);
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        let r = unsafe { f(dev, pool) };
        if r == CUDA_SUCCESS {
            poolmem::set_current(dev, pool as u64);
        }
        r
    })
}

macro_rules! primary_reset {
    ($name:ident) => {
        /// A reset primary context may come back with the default pool current: asked again.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dev: c_int) -> CUresult {
            guard(|| {
                let f = real_or!($name);
                // SAFETY: the caller's argument, unchanged, to the driver's own function.
                let r = unsafe { f(dev) };
                if r == CUDA_SUCCESS {
                    poolmem::set_current(dev, 0);
                }
                r
            })
        }
    };
}
primary_reset!(cuDevicePrimaryCtxReset_v2);
// the unversioned name a real driver keeps with the `_v2` meaning (XLA binds it)
primary_reset!(cuDevicePrimaryCtxReset);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: usize, keep: usize) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemPoolTrimTo);
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        let r = unsafe { f(pool, keep) };
        if r == CUDA_SUCCESS {
            poolmem::trimmed(pool as u64, keep as u64);
        }
        r
    })
}

/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`: what the pool keeps at a synchronization (`poolmem`).
const RELEASE_THRESHOLD: c_int = 4;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: usize,
    attr: c_int,
    value: *mut u64,
) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemPoolSetAttribute);
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        let r = unsafe { f(pool, attr, value) };
        if r == CUDA_SUCCESS && attr == RELEASE_THRESHOLD && !value.is_null() {
            // SAFETY: the driver accepted it: a cuuint64_t for this attribute.
            poolmem::set_threshold(pool as u64, unsafe { value.read() });
        }
        r
    })
}

// Virtual memory management (PyTorch expandable segments)

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const PropHead,
    flags: u64,
) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemCreate);
        let e = if prop.is_null() || state::config().is_none() {
            None
        } else {
            // SAFETY: `prop` was checked non-null; the CUDA contract makes it a valid
            // CUmemAllocationProp, whose leading fields PropHead mirrors (repr(C)).
            let p = unsafe { &*prop };
            if p.location_type == LOCATION_DEVICE {
                enforce_dev(p.location_id)
            } else {
                None
            }
        };
        charged(
            e,
            "cuMemCreate",
            Kind::Vmm,
            size as u64,
            // SAFETY: `f` is the driver's own cuMemCreate (dlsym'd, non-null, transmuted to its
            // exact C signature); the application's arguments go through unchanged under the CUDA
            // caller contract.
            || unsafe { f(handle, size, prop, flags) },
            // SAFETY: charged() runs this only after the driver returned CUDA_SUCCESS, i.e. wrote
            // the out-slot; read_ptr rejects null.
            || unsafe { read_ptr(handle) },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemRelease);
        // SAFETY: `f` is the driver's own cuMemRelease (dlsym'd, non-null, transmuted to its exact
        // C signature); the application's arguments go through unchanged under the CUDA caller
        // contract.
        vmmmem::release(handle, || unsafe { f(handle) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: u64,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemMap);
        let charged = match vmmmem::mapping(handle, size as u64) {
            Ok(c) => c,
            Err(e) => return e,
        };
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        let r = unsafe { f(ptr, size, offset, handle, flags) };
        vmmmem::mapped(ptr, size as u64, handle, charged, r == CUDA_SUCCESS);
        r
    })
}

macro_rules! unmapping {
    ($name:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(ptr: u64, size: usize) -> CUresult {
            guard(|| {
                let f = real_or!($name);
                // SAFETY: the caller's arguments, unchanged, to the driver's own function.
                let r = unsafe { f(ptr, size) };
                if r == CUDA_SUCCESS {
                    vmmmem::unmapped(ptr, size as u64);
                }
                r
            })
        }
    };
}
unmapping!(cuMemUnmap);
unmapping!(cuMemAddressFree);

/// An imported handle: its mappings are charged (`vmmmem`), on the device the driver names.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut c_void,
    handle_type: c_int,
) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemImportFromShareableHandle);
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        let r = unsafe { f(handle, os_handle, handle_type) };
        if r != CUDA_SUCCESS || handle.is_null() || state::config().is_none() {
            return r;
        }
        // SAFETY: the driver succeeded, so it wrote the caller's handle slot.
        let h = unsafe { handle.read() };
        let mut prop = AllocationProp {
            head: PropHead {
                alloc_type: 0,
                handle_types: 0,
                location_type: 0,
                location_id: 0,
            },
            rest: [0; 2],
        };
        let dev = match real::cuMemGetAllocationPropertiesFromHandle() {
            // SAFETY: the driver's own function, a whole CUmemAllocationProp to write.
            Some(get) if unsafe { get(&mut prop, h) } == CUDA_SUCCESS => {
                (prop.head.location_type == LOCATION_DEVICE).then_some(prop.head.location_id)
            }
            // the driver cannot say: the current device's (fail closed)
            _ => current_ordinal(),
        };
        if let Some(d) = dev {
            vmmmem::imported(h, d);
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(handle: *mut u64, addr: u64) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemRetainAllocationHandle);
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        let r = unsafe { f(handle, addr) };
        if r == CUDA_SUCCESS && !handle.is_null() {
            // SAFETY: the driver succeeded, so it wrote the caller's handle slot.
            vmmmem::retained(unsafe { handle.read() });
        }
        r
    })
}

// Arrays

/// Bytes an array (or all levels of a mipmapped array) takes; formats we do not know are
/// charged as 16 bytes per channel (the widest element), so nothing is charged as zero.
fn array_bytes(
    w: usize,
    h: usize,
    d: usize,
    format: c_uint,
    channels: c_uint,
    levels: c_uint,
) -> u64 {
    let elem: u64 = match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 16,
    };
    let (mut w, mut h, mut d) = (w.max(1) as u64, h.max(1) as u64, d.max(1) as u64);
    let mut total: u64 = 0;
    for _ in 0..levels.clamp(1, 64) {
        let lvl = w
            .saturating_mul(h)
            .saturating_mul(d)
            .saturating_mul(elem.saturating_mul(channels.max(1) as u64));
        total = total.saturating_add(lvl);
        w = (w / 2).max(1);
        h = (h / 2).max(1);
        d = (d / 2).max(1);
    }
    total
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(handle: *mut usize, desc: *const ArrayDesc) -> CUresult {
    guard(|| {
        let f = real_or!(cuArrayCreate_v2);
        if desc.is_null() {
            // SAFETY: `f` is the driver's own cuArrayCreate_v2 (dlsym'd, non-null, transmuted to
            // its exact C signature); the application's arguments go through unchanged under the
            // CUDA caller contract.
            return unsafe { f(handle, desc) };
        }
        // SAFETY: `desc` was checked non-null just above; the CUDA contract makes it a valid array
        // descriptor for the duration of the call (read only).
        let d = unsafe { &*desc };
        let bytes = array_bytes(d.width, d.height, 0, d.format, d.channels, 1);
        charged(
            enforce_current(),
            "cuArrayCreate",
            Kind::Array,
            bytes,
            // SAFETY: `f` is the driver's own cuArrayCreate_v2 (dlsym'd, non-null, transmuted to
            // its exact C signature); the application's arguments go through unchanged under the
            // CUDA caller contract.
            || unsafe { f(handle, desc) },
            // SAFETY: charged() runs this only after the driver returned CUDA_SUCCESS, i.e. wrote
            // the out-slot; read_ptr rejects null.
            || unsafe { read_ptr(handle.cast()) },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    handle: *mut usize,
    desc: *const Array3dDesc,
) -> CUresult {
    guard(|| {
        let f = real_or!(cuArray3DCreate_v2);
        if desc.is_null() {
            // SAFETY: `f` is the driver's own cuArray3DCreate_v2 (dlsym'd, non-null, transmuted to
            // its exact C signature); the application's arguments go through unchanged under the
            // CUDA caller contract.
            return unsafe { f(handle, desc) };
        }
        // SAFETY: `desc` was checked non-null just above; the CUDA contract makes it a valid array
        // descriptor for the duration of the call (read only).
        let d = unsafe { &*desc };
        let bytes = array_bytes(d.width, d.height, d.depth, d.format, d.channels, 1);
        charged(
            enforce_current(),
            "cuArray3DCreate",
            Kind::Array,
            bytes,
            // SAFETY: `f` is the driver's own cuArray3DCreate_v2 (dlsym'd, non-null, transmuted to
            // its exact C signature); the application's arguments go through unchanged under the
            // CUDA caller contract.
            || unsafe { f(handle, desc) },
            // SAFETY: charged() runs this only after the driver returned CUDA_SUCCESS, i.e. wrote
            // the out-slot; read_ptr rejects null.
            || unsafe { read_ptr(handle.cast()) },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    handle: *mut usize,
    desc: *const Array3dDesc,
    levels: c_uint,
) -> CUresult {
    guard(|| {
        let f = real_or!(cuMipmappedArrayCreate);
        if desc.is_null() {
            // SAFETY: `f` is the driver's own cuMipmappedArrayCreate (dlsym'd, non-null, transmuted
            // to its exact C signature); the application's arguments go through unchanged under the
            // CUDA caller contract.
            return unsafe { f(handle, desc, levels) };
        }
        // SAFETY: `desc` was checked non-null just above; the CUDA contract makes it a valid array
        // descriptor for the duration of the call (read only).
        let d = unsafe { &*desc };
        let bytes = array_bytes(d.width, d.height, d.depth, d.format, d.channels, levels);
        charged(
            enforce_current(),
            "cuMipmappedArrayCreate",
            Kind::Array,
            bytes,
            // SAFETY: `f` is the driver's own cuMipmappedArrayCreate (dlsym'd, non-null, transmuted
            // to its exact C signature); the application's arguments go through unchanged under the
            // CUDA caller contract.
            || unsafe { f(handle, desc, levels) },
            // SAFETY: charged() runs this only after the driver returned CUDA_SUCCESS, i.e. wrote
            // the out-slot; read_ptr rejects null.
            || unsafe { read_ptr(handle.cast()) },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(handle: usize) -> CUresult {
    guard(|| {
        let f = real_or!(cuArrayDestroy);
        // SAFETY: `f` is the driver's own cuArrayDestroy (dlsym'd, non-null, transmuted to its
        // exact C signature); the application's arguments go through unchanged under the CUDA
        // caller contract.
        released(Kind::Array, handle as u64, || unsafe { f(handle) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(handle: usize) -> CUresult {
    guard(|| {
        let f = real_or!(cuMipmappedArrayDestroy);
        // SAFETY: `f` is the driver's own cuMipmappedArrayDestroy (dlsym'd, non-null, transmuted to
        // its exact C signature); the application's arguments go through unchanged under the CUDA
        // caller contract.
        released(Kind::Array, handle as u64, || unsafe { f(handle) })
    })
}

// Reporting

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemGetInfo_v2);
        // SAFETY: `f` is the driver's own cuMemGetInfo_v2 (dlsym'd, non-null, transmuted to its
        // exact C signature); the application's arguments go through unchanged under the CUDA
        // caller contract.
        let r = unsafe { f(free, total) };
        if r != CUDA_SUCCESS || free.is_null() || total.is_null() {
            return r;
        }
        if let Some((cfg, a)) = enforce_current() {
            // SAFETY: `free` and `total` were checked non-null and the driver just returned
            // CUDA_SUCCESS, so both are initialised size_t slots.
            let (t, _, fr) = unsafe {
                slice(
                    a.limit,
                    cfg.region.used_by_live(a.idx),
                    total.read() as u64,
                    free.read() as u64,
                    0,
                )
            };
            // SAFETY: the same two non-null slots just read; the cuMemGetInfo contract makes them
            // writable.
            unsafe {
                total.write(t as usize);
                free.write(fr as usize);
            }
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CUresult {
    guard(|| {
        let f = real_or!(cuDeviceTotalMem_v2);
        // SAFETY: `f` is the driver's own cuDeviceTotalMem_v2 (dlsym'd, non-null, transmuted to its
        // exact C signature); the application's arguments go through unchanged under the CUDA
        // caller contract.
        let r = unsafe { f(bytes, dev) };
        if r == CUDA_SUCCESS
            && !bytes.is_null()
            && let Some((_, a)) = enforce_dev(dev)
        {
            // SAFETY: `bytes` was checked non-null and the driver just returned CUDA_SUCCESS, so it
            // is an initialised, writable size_t.
            unsafe { bytes.write((bytes.read() as u64).min(a.limit) as usize) };
        }
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes() {
        assert_eq!(array_bytes(100, 0, 0, 0x20, 4, 1), 1600);
        assert_eq!(array_bytes(8, 8, 0, 0x01, 1, 4), 64 + 16 + 4 + 1);
        assert_eq!(array_bytes(8, 8, 0, 0x77, 1, 1), 64 * 16);
    }
}
