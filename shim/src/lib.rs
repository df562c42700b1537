//! libgpufence.so — holds every process of a container to the container's GPU memory quota and
//! compute share.
//!
//! Preloaded into every process (`/etc/ld.so.preload` or `LD_PRELOAD`). Applications reach the
//! driver three ways and all land here:
//! - direct linking against `libcuda.so.1`: the preloaded exports below come first in the
//!   global scope;
//! - `dlopen` + `dlsym`: `dlsym` is overridden (a tail-calling trampoline on x86_64, so glibc
//!   still sees the caller's return address for `RTLD_NEXT`) and hands out our exports for the
//!   functions we wrap;
//! - `cuGetProcAddress(_v2)`: wrapped; any returned driver function we wrap is swapped for ours,
//!   including `cuGetProcAddress` itself.
//!
//! Kernel launches (every launch form, graph replays included) are paced to the container's
//! compute share (`cores`): see `cores.rs`.
//!
//! Design rules: no constructor at all (everything is lazy, on the first CUDA/NVML call), no
//! lock anywhere (atomics, publish-once pointers), no lock held across a driver call, no panic
//! across the FFI boundary (`catch_unwind` in every export), fork-safe (the `pthread_atfork`
//! child handler only stores atomics). Without a quota every export is a plain forward (one
//! atomic load), and `dlsym`/`cuGetProcAddress` hand out the driver's own functions.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use gpufence_format::quota;

mod cores;
mod elfsym;
mod enforce;
mod explain;
mod exports;
mod ffi;
use gpufence_format::human;
mod nvml;
mod real;
use gpufence_format::region;
mod state;
mod table;

use std::ffi::{CStr, c_char, c_int, c_uint};

use enforce::{charge, charged, enforce_current, enforce_dev, enforce_pool, read_ptr, released};
use exports::cuda_launch::*;
use exports::{guard, real_or};
use ffi::{
    ATTACH_GLOBAL, Array3dDesc, ArrayDesc, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUresult,
    LOCATION_DEVICE, NvmlMemory, NvmlMemoryV2, PropHead, Ptr,
};
use table::Kind;

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

// ---------------------------------------------------------------------------------------------
// Allocation entry points

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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut u64, bytes: usize, stream: usize) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemAllocAsync);
        charged(
            enforce_current(),
            "cuMemAllocAsync",
            Kind::Linear,
            bytes as u64,
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
        charged(
            enforce_current(),
            "cuMemAllocAsync",
            Kind::Linear,
            bytes as u64,
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
        charged(
            enforce_pool(pool),
            "cuMemAllocFromPoolAsync",
            Kind::Linear,
            bytes as u64,
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
        charged(
            enforce_pool(pool),
            "cuMemAllocFromPoolAsync",
            Kind::Linear,
            bytes as u64,
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
        released(Kind::Linear, dptr, || unsafe { f(dptr, stream) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: u64, stream: usize) -> CUresult {
    guard(|| {
        let f = real_or!(cuMemFreeAsync_ptsz);
        // SAFETY: `f` is the driver's own cuMemFreeAsync_ptsz (dlsym'd, non-null, transmuted to its
        // exact C signature); the application's arguments go through unchanged under the CUDA
        // caller contract.
        released(Kind::Linear, dptr, || unsafe { f(dptr, stream) })
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
        released(Kind::Vmm, handle, || unsafe { f(handle) })
    })
}

// Arrays

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

// ---------------------------------------------------------------------------------------------
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
                nvml::slice(
                    a.limit,
                    cfg.region.used(a.idx),
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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: Ptr, mem: *mut NvmlMemory) -> c_int {
    nvml::guard(|| nvml::get_memory_info(device, mem))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: Ptr, mem: *mut NvmlMemoryV2) -> c_int {
    nvml::guard(|| nvml::get_memory_info_v2(device, mem))
}

// ---------------------------------------------------------------------------------------------
// The shim's exports by name, and by the real function they stand for

macro_rules! hooks {
    ($($f:ident),* $(,)?) => {
        fn hooks() -> &'static [(real::Id, usize)] {
            static H: std::sync::OnceLock<Vec<(real::Id, usize)>> = std::sync::OnceLock::new();
            H.get_or_init(|| vec![$((real::Id::$f, $f as *const () as usize)),*])
        }
    };
}

hooks!(
    cuMemAlloc_v2,
    cuMemAllocManaged,
    cuMemAllocPitch_v2,
    cuMemFree_v2,
    cuMemAllocAsync,
    cuMemAllocAsync_ptsz,
    cuMemAllocFromPoolAsync,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemFreeAsync,
    cuMemFreeAsync_ptsz,
    cuMemPoolCreate,
    cuMemPoolDestroy,
    cuDeviceGetDefaultMemPool,
    cuDeviceGetMemPool,
    cuMemCreate,
    cuMemRelease,
    cuArrayCreate_v2,
    cuArray3DCreate_v2,
    cuMipmappedArrayCreate,
    cuArrayDestroy,
    cuMipmappedArrayDestroy,
    cuMemGetInfo_v2,
    cuDeviceTotalMem_v2,
    cuLaunchKernel,
    cuLaunchKernel_ptsz,
    cuLaunchKernelEx,
    cuLaunchKernelEx_ptsz,
    cuLaunchCooperativeKernel,
    cuLaunchCooperativeKernel_ptsz,
    cuGraphLaunch,
    cuGraphLaunch_ptsz,
    cuStreamBeginCapture,
    cuStreamBeginCapture_ptsz,
    cuStreamBeginCapture_v2,
    cuStreamBeginCapture_v2_ptsz,
    cuStreamEndCapture,
    cuStreamEndCapture_ptsz,
    cuGetProcAddress,
    cuGetProcAddress_v2,
    nvmlDeviceGetMemoryInfo,
    nvmlDeviceGetMemoryInfo_v2,
);

fn hook_by_name(name: &[u8]) -> Option<usize> {
    let id = real::id_of(name)?;
    hooks().iter().find(|h| h.0 == id).map(|h| h.1)
}

/// Our export standing for the real driver function at `p`.
fn hook_for_real(p: usize) -> Option<usize> {
    if real::is_ours(p) {
        return None;
    }
    let id = real::id_of_address(p)?;
    hooks().iter().find(|h| h.0 == id).map(|h| h.1)
}

// ---------------------------------------------------------------------------------------------
// cuGetProcAddress

unsafe fn swap_proc(pfn: *mut Ptr, r: CUresult) -> CUresult {
    if r != CUDA_SUCCESS || pfn.is_null() || state::config().is_none() {
        return r;
    }
    // SAFETY: `pfn` was checked non-null and the driver returned CUDA_SUCCESS, so it holds the
    // function pointer the driver wrote.
    let p = unsafe { pfn.read() } as usize;
    if p != 0
        && let Some(h) = hook_for_real(p)
    {
        // SAFETY: the same non-null `pfn` out-slot the caller gave; `h` is one of our own exports
        // with the same C signature as the real function.
        unsafe { pfn.write(h as Ptr) };
    }
    r
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut Ptr,
    version: c_int,
    flags: u64,
) -> CUresult {
    guard(|| {
        let r = match real::cuGetProcAddress() {
            // SAFETY: `f` is the driver's own cuGetProcAddress (dlsym'd, non-null, transmuted to
            // its exact C signature); the application's arguments go through unchanged under the
            // CUDA caller contract.
            Some(f) => unsafe { f(symbol, pfn, version, flags) },
            None => {
                let f = real_or!(cuGetProcAddress_v2);
                // SAFETY: `f` is the driver's own cuGetProcAddress_v2 (dlsym'd, non-null,
                // transmuted to its exact C signature); the application's arguments go through
                // unchanged under the CUDA caller contract.
                unsafe { f(symbol, pfn, version, flags, std::ptr::null_mut()) }
            }
        };
        // SAFETY: `pfn` is the caller's out-slot passed on unchanged; swap_proc checks success and
        // null before touching it.
        unsafe { swap_proc(pfn, r) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut Ptr,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    guard(|| {
        let f = real_or!(cuGetProcAddress_v2);
        // SAFETY: `f` is the driver's own cuGetProcAddress_v2 (dlsym'd, non-null, transmuted to its
        // exact C signature); the application's arguments go through unchanged under the CUDA
        // caller contract.
        let r = unsafe { f(symbol, pfn, version, flags, status) };
        // SAFETY: `pfn` is the caller's out-slot passed on unchanged; swap_proc checks success and
        // null before touching it.
        unsafe { swap_proc(pfn, r) }
    })
}

// ---------------------------------------------------------------------------------------------
// dlsym

/// Our export for `name` when the application should get it, else 0 (then the trampoline
/// tail-calls the real dlsym). Always leaves the real dlsym resolved.
extern "C" fn dlsym_decide(handle: Ptr, name: *const c_char) -> usize {
    std::panic::catch_unwind(|| {
        real::real_dlsym();
        if name.is_null() {
            return 0;
        }
        // SAFETY: the caller's NUL-terminated symbol name.
        let n = unsafe { CStr::from_ptr(name) }.to_bytes();
        let Some(lib) = real::Lib::of(n) else {
            return 0;
        };
        let Some(hook) = hook_by_name(n) else {
            return 0;
        };
        let p = real::learn_handle(lib, handle, name);
        if let Some(id) = real::id_of(n) {
            real::seed(id, p);
        }
        if state::config().is_none() {
            return 0;
        }
        hook
    })
    .unwrap_or(0)
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: Ptr, name: *const c_char) -> Ptr {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "jmp qword ptr [rip + {real}]",
        decide = sym dlsym_decide,
        real = sym real::GPUFENCE_REAL_DLSYM,
    )
}

#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: Ptr, name: *const c_char) -> Ptr {
    let h = dlsym_decide(handle, name);
    if h != 0 {
        return h as Ptr;
    }
    unsafe { real::real_dlsym()(handle, name) }
}

// ---------------------------------------------------------------------------------------------
// dlvsym: glibc's `dlsym` (or `dlvsym`) fetched by version, and the driver's names, go through
// the shim like `dlsym` does.

/// Our export for `name` asked for by version, else 0 (then the trampoline tail-calls glibc's
/// dlvsym). Always leaves the real dlvsym resolved.
extern "C" fn dlvsym_decide(handle: Ptr, name: *const c_char) -> usize {
    real::real_dlvsym();
    if name.is_null() {
        return 0;
    }
    // SAFETY: the caller's NUL-terminated symbol name.
    match unsafe { CStr::from_ptr(name) }.to_bytes() {
        b"dlsym" => dlsym as unsafe extern "C" fn(Ptr, *const c_char) -> Ptr as usize,
        b"dlvsym" => {
            dlvsym as unsafe extern "C" fn(Ptr, *const c_char, *const c_char) -> Ptr as usize
        }
        _ => dlsym_decide(handle, name),
    }
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlvsym(handle: Ptr, name: *const c_char, version: *const c_char) -> Ptr {
    // Three pushes keep the stack 16-byte aligned at the call; the tail jump keeps the
    // caller's return address (RTLD_NEXT is relative to it).
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "push rdx",
        "call {decide}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "jmp qword ptr [rip + {real}]",
        decide = sym dlvsym_decide,
        real = sym real::GPUFENCE_REAL_DLVSYM,
    )
}

#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlvsym(handle: Ptr, name: *const c_char, version: *const c_char) -> Ptr {
    let h = dlvsym_decide(handle, name);
    if h != 0 {
        return h as Ptr;
    }
    // SAFETY: glibc's dlvsym with the caller's arguments.
    unsafe { real::real_dlvsym()(handle, name, version) }
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

    #[test]
    fn slice_math() {
        // quota 4 GiB on an 80 GiB device with 70 GiB free, 1 GiB charged
        let g = 1u64 << 30;
        assert_eq!(nvml::slice(4 * g, g, 80 * g, 70 * g, 0), (4 * g, g, 3 * g));
        // never more than the device
        assert_eq!(
            nvml::slice(100 * g, 0, 80 * g, 80 * g, 0),
            (80 * g, 0, 80 * g)
        );
        // real free is the bound when neighbours used the device
        assert_eq!(nvml::slice(4 * g, 0, 80 * g, g, 0), (4 * g, 0, g));
    }
}
