//! Mock CUDA driver (`libgpufence_mock_cuda.so`, installed as `libcuda.so.1` on the simulated
//! node). Driven by the same node description as the mock NVML (`GPUFENCE_MOCK_NODE`, see
//! `gpufence-mock-node`).
//!
//! What it models: `cuInit`, device enumeration (visible GPUs, MIG instances of MIG-enabled GPUs,
//! `CUDA_VISIBLE_DEVICES` by index or UUID), contexts (created and primary, current context per
//! thread), and device memory accounting per device and per process: every allocation entry point
//! the shim charges (`cuMemAlloc_v2`, pitch, managed, async and pool allocations, VMM
//! `cuMemCreate`, arrays and mipmapped arrays) takes bytes from the device's memory and fails with
//! `CUDA_ERROR_OUT_OF_MEMORY` past its size; frees give them back; `cuMemGetInfo_v2` reports what
//! is left. No host memory stands behind device allocations: pointers are fake, distinct and
//! 512-byte aligned. `cuGetProcAddress(_v2)` resolves base names like the real driver
//! (highest `_vN`, `_ptsz`/`_ptds` with the per-thread flag).
//!
//! All functions use the real CUDA signatures and return codes. Never panics across the FFI
//! boundary (every export runs inside `catch_unwind`).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use dark::cuGetExportTable;
use devctx::{cuCtxCreate_v2, cuDevicePrimaryCtxRetain};
use driver::{
    CTX_BASE, CURRENT, Device, STATE, State, current_device, guard, put, state, table, tri,
};
pub use driver::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS,
    CUdevice, CUdeviceptr, CUresult,
};
use driver::{Kind, charge, device, pci_numbers, uncharge};
use pools::{POOL_BASE, pool_device};

mod attrs;
mod dark;
mod dark13;
mod devctx;
mod driver;
mod functions;
mod graphmem;
mod graphnodes;
mod hostwork;
mod integrity;
mod limits;
mod memops;
mod pools;
mod streams;
mod trace;
mod unsupported;
mod vram;
mod xla;

pub mod exec;

/// 16 UUID bytes from `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (or `MIG-…`); names that are
/// not hex get a stable FNV-derived value.
pub fn uuid_bytes(text: &str) -> [u8; 16] {
    let hex: String = text
        .split_once('-')
        .map(|(_, r)| r)
        .unwrap_or(text)
        .chars()
        .filter(|c| *c != '-')
        .collect();
    let mut out = [0u8; 16];
    if hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit()) {
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0);
        }
        return out;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, b) in out.iter_mut().enumerate() {
        for c in text.bytes().chain([i as u8]) {
            h ^= c as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        *b = (h >> 24) as u8;
    }
    out
}

/// A device as enumerated: UUID, name, bytes, timeline lane, PCI numbers.
type Enumerated = (String, String, u64, usize, (i32, i32, i32));

fn build_state() -> Result<State, String> {
    let anchor = cuInit as *const c_void;
    let (node, timeline) = gpufence_mock_node::load_with_timeline(anchor)?;
    exec::init(&timeline);
    // (uuid, name, bytes, lane) of every device CUDA would enumerate, in order
    let mut all: Vec<Enumerated> = Vec::new();
    for g in node.visible_gpus() {
        let pci = pci_numbers(&g.pci_bus_id);
        if g.mig_mode() == gpufence_mock_node::MigMode::Enabled && !g.mig.is_empty() {
            for (j, m) in g.mig.iter().enumerate() {
                all.push((
                    m.uuid.clone(),
                    format!("{} MIG {}", g.name, m.profile),
                    m.memory_bytes(),
                    gpufence_mock_node::timeline::lane_index(g.minor, j + 1),
                    pci,
                ));
            }
        } else {
            all.push((
                g.uuid.clone(),
                g.name.clone(),
                g.memory_bytes(),
                gpufence_mock_node::timeline::lane_index(g.minor, 0),
                pci,
            ));
        }
    }
    if let Ok(cvd) = std::env::var("CUDA_VISIBLE_DEVICES") {
        let mut picked = Vec::new();
        for item in cvd.split(',').map(str::trim) {
            let found = if let Ok(i) = item.parse::<usize>() {
                all.get(i).cloned()
            } else if item.is_empty() {
                None
            } else {
                all.iter().find(|d| d.0.starts_with(item)).cloned()
            };
            // CUDA stops at the first invalid entry
            match found {
                Some(d) => picked.push(d),
                None => break,
            }
        }
        all = picked;
    }
    let limits = limits::build(&node, all.iter().map(|d| d.0.as_str()));
    let devices = all
        .into_iter()
        .map(|(uuid, name, total, lane, pci)| Device {
            uuid: uuid_bytes(&uuid),
            name,
            total,
            used: AtomicU64::new(0),
            lane,
            pci,
        })
        .collect();
    Ok(State {
        driver_version: node.cuda_version(),
        devices,
        allocs: Mutex::new(HashMap::new()),
        next_handle: AtomicU64::new(0x10_0000),
        limits,
    })
}

fn record(s: &State, kind: Kind, handle: u64, dev: usize, bytes: u64) {
    if let Ok(mut m) = s.allocs.lock() {
        m.insert((kind as u8, handle), (dev, bytes));
    }
}

fn release(kind: Kind, handle: u64) -> CUresult {
    let s = match state() {
        Ok(s) => s,
        Err(e) => return e,
    };
    let removed = s
        .allocs
        .lock()
        .ok()
        .and_then(|mut m| m.remove(&(kind as u8, handle)));
    match removed {
        Some((dev, bytes)) => {
            uncharge(s, dev, bytes);
            if matches!(kind, Kind::Linear)
                && let Some(r) = vram::remove(handle)
            {
                vram::unmap(handle, r.len);
            }
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

/// Allocate `bytes` of linear memory on `dev` (`region`: device or managed; `pool`: the memory
/// pool of a stream-ordered allocation, else 0); returns its address, backed lazily (`vram`).
fn alloc_linear(
    dev: usize,
    bytes: u64,
    region: vram::RegionKind,
    pool: u64,
) -> Result<u64, CUresult> {
    let s = state()?;
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    charge(s, dev, bytes)?;
    let Some(p) = vram::map(bytes, libc::PROT_READ | libc::PROT_WRITE) else {
        uncharge(s, dev, bytes);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    };
    vram::insert(p, bytes, dev, region, pool);
    record(s, Kind::Linear, p, dev, bytes);
    Ok(p)
}

// ---------------------------------------------------------------------------------------------
// Initialisation, version, devices

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guard(|| {
        if flags != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match STATE.get_or_init(build_state) {
            Ok(s) if s.devices.is_empty() => CUDA_ERROR_NO_DEVICE,
            Ok(_) => CUDA_SUCCESS,
            Err(e) => {
                if std::env::var_os("GPUFENCE_MOCK_DEBUG").is_some() {
                    eprintln!("mock cuda: cuInit: {e}");
                }
                CUDA_ERROR_NO_DEVICE
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    guard(|| {
        // works before cuInit, like the real driver; the node file decides the version
        let ver = match STATE.get() {
            Some(Ok(s)) => s.driver_version,
            _ => gpufence_mock_node::load(cuInit as *const c_void)
                .map(|n| n.cuda_version())
                .unwrap_or(13000),
        };
        // SAFETY: put rejects a null `v`; otherwise the CUDA driver-API contract makes it a valid,
        // writable out-pointer for an int.
        unsafe { put(v, ver) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guard(|| {
        let s = tri!(state());
        // SAFETY: put rejects a null `count`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for an int.
        unsafe { put(count, s.devices.len() as c_int) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult {
    guard(|| {
        let s = tri!(state());
        tri!(device(s, ordinal));
        // SAFETY: put rejects a null `dev`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a CUdevice.
        unsafe { put(dev, ordinal) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let d = tri!(device(s, dev));
        if name.is_null() || len <= 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let bytes = d.name.as_bytes();
        let n = bytes.len().min(len as usize - 1);
        // SAFETY: name has room for len bytes (caller contract); we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), name.cast::<u8>(), n);
            *name.add(n) = 0;
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let d = tri!(device(s, dev));
        // SAFETY: put rejects a null `uuid`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a 16-byte CUuuid.
        unsafe { put(uuid, d.uuid) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    // SAFETY: same caller contract as cuDeviceGetUuid (which null-checks `uuid` before writing);
    // only forwarded.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let d = tri!(device(s, dev));
        // SAFETY: put rejects a null `bytes`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a size_t.
        unsafe { put(bytes, d.total as usize) }
    })
}

/// The attributes of an H100 SXM5 80GB (`attrs.rs`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let d = tri!(device(s, dev));
        let Some(v) = attrs::value(attrib, d, limits::sm_count(&s.limits, 132)) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        // SAFETY: put rejects a null `pi`; otherwise the CUDA driver-API contract makes it a valid,
        // writable out-pointer for an int.
        unsafe { put(pi, v) }
    })
}

// ---------------------------------------------------------------------------------------------
// Contexts

/// Runs `then` with `ctx` if it is one of this process's contexts (null allowed where
/// `null_ok`); otherwise `CUDA_ERROR_INVALID_CONTEXT`.
fn with_context(ctx: usize, null_ok: bool, then: impl FnOnce(usize)) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let known = ctx >= CTX_BASE && ctx - CTX_BASE < s.devices.len();
        if !(known || (null_ok && ctx == 0)) {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        then(ctx);
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: usize) -> CUresult {
    with_context(ctx, false, driver::ctx_forget)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    guard(|| {
        let s = tri!(state());
        tri!(device(s, dev));
        devctx::primary_released(dev as usize);
        CUDA_SUCCESS
    })
}

/// The unversioned names a real driver still exports with the `_v2` meaning (XLA binds them).
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    cuDevicePrimaryCtxRelease_v2(dev)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: usize) -> CUresult {
    with_context(ctx, true, driver::ctx_set_top)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: usize) -> CUresult {
    with_context(ctx, false, driver::ctx_push)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent(ctx: usize) -> CUresult {
    cuCtxPushCurrent_v2(ctx)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent(pctx: *mut usize) -> CUresult {
    // SAFETY: the caller's out-pointer, passed on unchanged (null-checked there).
    unsafe { cuCtxPopCurrent_v2(pctx) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut usize) -> CUresult {
    guard(|| {
        tri!(state());
        if CURRENT.with(Cell::get) == 0 {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        let c = driver::ctx_pop();
        if !pctx.is_null() {
            // SAFETY: `pctx` was checked non-null just above; the caller's contract makes it a
            // writable CUcontext slot.
            unsafe { pctx.write(c) };
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut usize) -> CUresult {
    guard(|| {
        tri!(state());
        // SAFETY: put rejects a null `pctx`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a CUcontext.
        unsafe { put(pctx, CURRENT.with(Cell::get)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let d = tri!(current_device(s));
        // SAFETY: put rejects a null `dev`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a CUdevice.
        unsafe { put(dev, d as CUdevice) }
    })
}

// ---------------------------------------------------------------------------------------------
// Memory

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let dev = tri!(current_device(s));
        let d = &s.devices[dev];
        if free.is_null() || total.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let used = d.used.load(Ordering::Acquire);
        // SAFETY: `free` and `total` were checked non-null above; cuMemGetInfo's contract makes
        // them writable size_t slots.
        unsafe {
            free.write(d.total.saturating_sub(used) as usize);
            total.write(d.total as usize);
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    guard(|| {
        if dptr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let s = tri!(state());
        let dev = tri!(current_device(s));
        let p = tri!(alloc_linear(dev, bytes as u64, vram::RegionKind::Device, 0));
        // SAFETY: put rejects a null `dptr`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a CUdeviceptr.
        unsafe { put(dptr, p) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    _flags: c_uint,
) -> CUresult {
    guard(|| {
        if dptr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let s = tri!(state());
        let dev = tri!(current_device(s));
        let p = tri!(alloc_linear(
            dev,
            bytes as u64,
            vram::RegionKind::Managed,
            0
        ));
        // SAFETY: put rejects a null `dptr`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a CUdeviceptr.
        unsafe { put(dptr, p) }
    })
}

/// Pitch is the width rounded up to 512 bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    guard(|| {
        if dptr.is_null()
            || pitch.is_null()
            || !matches!(elem, 4 | 8 | 16)
            || width == 0
            || height == 0
        {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let s = tri!(state());
        let dev = tri!(current_device(s));
        let p = width.div_ceil(512) * 512;
        let ptr = tri!(alloc_linear(
            dev,
            (p as u64).saturating_mul(height as u64),
            vram::RegionKind::Device,
            0
        ));
        // SAFETY: `pitch` and `dptr` were checked non-null at the top; the caller's contract makes
        // them writable slots.
        unsafe {
            pitch.write(p);
            dptr.write(ptr);
        }
        CUDA_SUCCESS
    })
}

/// Freeing the null pointer succeeds and does nothing, as on a real driver: `cudaFree(0)` (the
/// idiom that makes the runtime set up its context, which cuBLAS's `cublasCreate` uses) reaches
/// the driver as `cuMemFree_v2(0)`, and an error there fails the handle's creation.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    if dptr == 0 {
        return CUDA_SUCCESS;
    }
    guard(|| release(Kind::Linear, dptr))
}

// Stream-ordered allocator

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut u64, dev: CUdevice) -> CUresult {
    guard(|| {
        let s = tri!(state());
        tri!(device(s, dev));
        // SAFETY: put rejects a null `pool`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a CUmemoryPool.
        unsafe { put(pool, POOL_BASE + dev as u64) }
    })
}

/// The device's current pool: its default pool until `cuDeviceSetMemPool` set another.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut u64, dev: CUdevice) -> CUresult {
    guard(|| {
        let s = tri!(state());
        tri!(device(s, dev));
        // SAFETY: put rejects a null `pool`; otherwise the caller's out-slot for a CUmemoryPool.
        unsafe { put(pool, pools::current(dev as usize)) }
    })
}

/// `CUmemPoolProps` / `CUmemAllocationProp` start the same way: allocType, handleTypes,
/// location { type, id }.
#[repr(C)]
pub struct PropHead {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut u64, props: *const PropHead) -> CUresult {
    guard(|| {
        let s = tri!(state());
        if props.is_null() || pool.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null pointer to the caller's props.
        let p = unsafe { &*props };
        if p.location_type != 1 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        tri!(device(s, p.location_id));
        let h = s.next_handle.fetch_add(16, Ordering::Relaxed);
        record(s, Kind::Pool, h, p.location_id as usize, 0);
        // SAFETY: put rejects a null `pool`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a CUmemoryPool.
        unsafe { put(pool, h) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolDestroy(pool: u64) -> CUresult {
    guard(|| {
        let r = release(Kind::Pool, pool);
        if r == CUDA_SUCCESS {
            pools::destroyed(pool);
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: usize,
) -> CUresult {
    // SAFETY: the caller's out-slot, passed on (null-checked there).
    unsafe { alloc_async(dptr, bytes, None, stream, false) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: usize,
) -> CUresult {
    // SAFETY: as cuMemAllocAsync.
    unsafe { alloc_async(dptr, bytes, None, stream, true) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: u64,
    stream: usize,
) -> CUresult {
    // SAFETY: as cuMemAllocAsync.
    unsafe { alloc_async(dptr, bytes, Some(pool), stream, false) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: u64,
    stream: usize,
) -> CUresult {
    // SAFETY: as cuMemAllocAsync.
    unsafe { alloc_async(dptr, bytes, Some(pool), stream, true) }
}

/// An allocation of `pool`: what the pool keeps is reused first, the rest taken from the device.
fn alloc_from_pool(dev: usize, bytes: u64, pool: u64) -> Result<u64, CUresult> {
    let s = state()?;
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let reused = pools::reuse(pool, bytes);
    if let Err(e) = charge(s, dev, bytes - reused) {
        pools::returned(pool, dev, reused);
        return Err(e);
    }
    let Some(p) = vram::map(bytes, libc::PROT_READ | libc::PROT_WRITE) else {
        uncharge(s, dev, bytes - reused);
        pools::returned(pool, dev, reused);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    };
    vram::insert(p, bytes, dev, vram::RegionKind::Device, pool);
    record(s, Kind::Linear, p, dev, bytes);
    Ok(p)
}

/// A stream-ordered allocation from `pool` (None: the current device's). On a capturing stream
/// it becomes a memory node of the graph (`graphmem.rs`): an address now, memory at launch.
unsafe fn alloc_async(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: Option<u64>,
    stream: usize,
    ptsz: bool,
) -> CUresult {
    guard(|| {
        if dptr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let s = tri!(state());
        let dev = match pool {
            Some(p) => tri!(pool_device(s, p)),
            None => tri!(current_device(s)),
        };
        let pool = pool.unwrap_or_else(|| pools::current(dev));
        let p = if tri!(exec::capturing(stream, ptsz)) {
            tri!(exec::captured_alloc(stream, ptsz, dev, bytes as u64))
        } else {
            tri!(alloc_from_pool(dev, bytes as u64, pool))
        };
        // SAFETY: put rejects a null `dptr`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a CUdeviceptr.
        unsafe { put(dptr, p) }
    })
}

/// A graph's allocation (freed by the graph itself, `graphmem.rs`), a pool's (kept by the pool,
/// `pools.rs`) or an ordinary one.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, _stream: usize) -> CUresult {
    guard(|| {
        let s = tri!(state());
        if graphmem::is_graph_address(dptr) {
            return CUDA_SUCCESS;
        }
        match vram::find(dptr) {
            Some((start, r))
                if start == dptr && r.pool != 0 && r.kind == vram::RegionKind::Device =>
            {
                let Some((dev, bytes)) = s
                    .allocs
                    .lock()
                    .ok()
                    .and_then(|mut m| m.remove(&(Kind::Linear as u8, dptr)))
                else {
                    return CUDA_ERROR_INVALID_VALUE;
                };
                vram::remove(dptr);
                vram::unmap(dptr, r.len);
                pools::returned(r.pool, dev, bytes);
                CUDA_SUCCESS
            }
            _ => cuMemFree_v2(dptr),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: usize) -> CUresult {
    cuMemFreeAsync(dptr, stream)
}

// Virtual memory management

const VMM_GRANULARITY: usize = 2 << 20;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    gran: *mut usize,
    prop: *const PropHead,
    _option: c_int,
) -> CUresult {
    guard(|| {
        tri!(state());
        if prop.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: put rejects a null `gran`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a size_t.
        unsafe { put(gran, VMM_GRANULARITY) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const PropHead,
    _flags: u64,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        if handle.is_null() || prop.is_null() || size == 0 || !size.is_multiple_of(VMM_GRANULARITY)
        {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null pointer to the caller's prop.
        let p = unsafe { &*prop };
        if p.location_type != 1 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        tri!(device(s, p.location_id));
        let dev = p.location_id as usize;
        tri!(charge(s, dev, size as u64));
        let h = s.next_handle.fetch_add(16, Ordering::Relaxed);
        record(s, Kind::Vmm, h, dev, size as u64);
        // SAFETY: put rejects a null `handle`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a CUmemGenericAllocationHandle.
        unsafe { put(handle, h) }
    })
}

/// Extra references `cuMemRetainAllocationHandle` took on a VMM handle.
static VMM_RETAINS: Mutex<Option<HashMap<u64, u32>>> = Mutex::new(None);

/// Drops one reference; the memory goes back when the creation's own reference goes.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    guard(|| {
        let mut refs = VMM_RETAINS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = refs.get_or_insert_with(HashMap::new).get_mut(&handle)
            && *n > 0
        {
            *n -= 1;
            return CUDA_SUCCESS;
        }
        drop(refs);
        let s = tri!(state());
        let mut released = vmm_released();
        if released.contains(&handle) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if vram::handle_mapped(handle) && vmm_allocation(s, handle).is_some() {
            // the memory lives on while mapped; the last cuMemUnmap frees it
            released.insert(handle);
            return CUDA_SUCCESS;
        }
        drop(released);
        drop_vmm(s, handle)
    })
}

/// VMM handles released while still mapped: their memory lives until the last range mapped to
/// them is unmapped, as the driver keeps it.
static VMM_RELEASED: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());

fn vmm_released() -> std::sync::MutexGuard<'static, BTreeSet<u64>> {
    VMM_RELEASED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ranges were unmapped: the memory of released handles no longer mapped anywhere goes back.
fn unmapped(gone: &[vram::Region]) {
    for r in gone {
        if r.kind != vram::RegionKind::Mapped || vram::handle_mapped(r.pool) {
            continue;
        }
        if vmm_released().remove(&r.pool)
            && let Ok(s) = state()
        {
            drop_vmm(s, r.pool);
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    align: usize,
    _addr: u64,
    _flags: u64,
) -> CUresult {
    guard(|| {
        tri!(state());
        if size == 0 || !size.is_multiple_of(VMM_GRANULARITY) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let align = (align as u64).max(VMM_GRANULARITY as u64);
        let Some(p) = vram::reserve(size as u64, align) else {
            return CUDA_ERROR_OUT_OF_MEMORY;
        };
        // SAFETY: put rejects a null `ptr`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a CUdeviceptr.
        unsafe { put(ptr, p) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        tri!(state());
        unmapped(&tri!(vram::unreserve(ptr, size as u64)));
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: u64,
    _flags: u64,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let alloc = vmm_allocation(s, handle).filter(|_| !vmm_released().contains(&handle));
        let Some((dev, bytes)) = alloc else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        if size == 0
            || (offset as u64).saturating_add(size as u64) > bytes
            || !vram::reserved_covers(ptr, size as u64)
        {
            return CUDA_ERROR_INVALID_VALUE;
        }
        tri!(vram::remap_fixed(
            ptr,
            size as u64,
            libc::PROT_READ | libc::PROT_WRITE
        ));
        // a mapped range records its handle where allocations record their pool
        vram::insert(ptr, size as u64, dev, vram::RegionKind::Mapped, handle);
        CUDA_SUCCESS
    })
}

/// (device, bytes) of a live VMM handle.
fn vmm_allocation(s: &State, handle: u64) -> Option<(usize, u64)> {
    s.allocs.lock().ok().and_then(|m| {
        m.get(&(Kind::Vmm as u8, handle))
            .or_else(|| m.get(&(Kind::VmmImport as u8, handle)))
            .copied()
    })
}

/// Drop a VMM handle: an imported one leaves the memory to its exporter (the simulation does not
/// keep an exporter's memory alive for its importers), one of ours gives it back.
fn drop_vmm(s: &State, handle: u64) -> CUresult {
    let imported = s
        .allocs
        .lock()
        .ok()
        .and_then(|mut m| m.remove(&(Kind::VmmImport as u8, handle)));
    if imported.is_some() {
        CUDA_SUCCESS
    } else {
        release(Kind::Vmm, handle)
    }
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`
const HANDLE_TYPE_POSIX_FD: c_int = 1;
const SHARE_MAGIC: u64 = 0x6766_766d_6d73_6872;

/// A VMM handle exported as a file descriptor (a memfd naming its size and device), for
/// `cuMemImportFromShareableHandle` in this or another process.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    out: *mut c_void,
    handle: u64,
    handle_type: c_int,
    _flags: u64,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        if handle_type != HANDLE_TYPE_POSIX_FD {
            return driver::CUDA_ERROR_NOT_SUPPORTED;
        }
        let Some((dev, bytes)) = vmm_allocation(s, handle) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        // SAFETY: a NUL-terminated name; memfd_create returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(c"gpufence-vmm".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        let words = [SHARE_MAGIC, bytes, dev as u64];
        // SAFETY: writes 24 bytes from `words` to our own new descriptor.
        let n = unsafe { libc::write(fd, words.as_ptr().cast(), 24) };
        if n != 24 {
            // SAFETY: our own descriptor, closed once.
            unsafe { libc::close(fd) };
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        // SAFETY: put refuses NULL; for this handle type the caller's slot is an int.
        unsafe { put(out.cast::<c_int>(), fd) }
    })
}

/// A handle to memory another handle (of this or another process) exported: the same bytes,
/// no new device memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut c_void,
    handle_type: c_int,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        if handle_type != HANDLE_TYPE_POSIX_FD {
            return driver::CUDA_ERROR_NOT_SUPPORTED;
        }
        let fd = os_handle as usize as c_int;
        let mut words = [0u64; 3];
        // SAFETY: reads at most 24 bytes into `words`; a bad descriptor fails the read.
        let n = unsafe { libc::pread(fd, words.as_mut_ptr().cast(), 24, 0) };
        if n != 24 || words[0] != SHARE_MAGIC || device(s, words[2] as c_int).is_err() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let h = s.next_handle.fetch_add(16, Ordering::Relaxed);
        record(s, Kind::VmmImport, h, words[2] as usize, words[1]);
        // SAFETY: put refuses NULL; otherwise the caller's handle slot.
        unsafe { put(handle, h) }
    })
}

/// The properties a VMM handle was created with: pinned device memory of its device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut PropHead,
    handle: u64,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let alloc = vmm_allocation(s, handle);
        let Some((dev, _)) = alloc else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        let head = PropHead {
            alloc_type: 1,
            handle_types: 0,
            location_type: 1,
            location_id: dev as c_int,
        };
        // SAFETY: put rejects a null `prop`; the caller's CUmemAllocationProp starts with these
        // four ints.
        unsafe { put(prop, head) }
    })
}

/// The handle mapped at `addr` (the allocation is retained: a `cuMemRelease` balances it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut u64,
    addr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        tri!(state());
        match vram::find(addr) {
            // SAFETY: put rejects a null `handle`; otherwise the caller's out-slot.
            Some((_, r)) if r.kind == vram::RegionKind::Mapped => {
                let mut refs = VMM_RETAINS.lock().unwrap_or_else(|e| e.into_inner());
                *refs
                    .get_or_insert_with(HashMap::new)
                    .entry(r.pool)
                    .or_insert(0) += 1;
                // SAFETY: put rejects a null `handle`; otherwise the caller's out-slot.
                unsafe { put(handle, r.pool) }
            }
            _ => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        tri!(state());
        if !vram::reserved_covers(ptr, size as u64) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let gone = vram::forget_range(ptr, size as u64);
        tri!(vram::remap_fixed(ptr, size as u64, libc::PROT_NONE));
        unmapped(&gone);
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const c_void,
    count: usize,
) -> CUresult {
    guard(|| {
        tri!(state());
        if desc.is_null() || count == 0 || !vram::reserved_covers(ptr, size as u64) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        CUDA_SUCCESS
    })
}

// Arrays

/// `CUDA_ARRAY_DESCRIPTOR`
#[repr(C)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`
#[repr(C)]
pub struct Array3dDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

/// Bytes per element of a `CUarray_format`, None for unknown formats.
pub fn format_bytes(format: c_uint) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return None,
    })
}

/// Bytes of a width × height × depth array (zero extents count as 1), each level of a
/// mipmapped array halving every extent.
pub fn array_bytes(
    w: usize,
    h: usize,
    d: usize,
    format: c_uint,
    channels: c_uint,
    levels: c_uint,
) -> Option<u64> {
    let elem = format_bytes(format)?;
    if !matches!(channels, 1 | 2 | 4) || w == 0 || levels == 0 {
        return None;
    }
    let (mut w, mut h, mut d) = (w as u64, h.max(1) as u64, d.max(1) as u64);
    let mut total: u64 = 0;
    for _ in 0..levels {
        let lvl = w
            .checked_mul(h)?
            .checked_mul(d)?
            .checked_mul(elem * channels as u64)?;
        total = total.checked_add(lvl)?;
        w = (w / 2).max(1);
        h = (h / 2).max(1);
        d = (d / 2).max(1);
    }
    Some(total)
}

unsafe fn array_create(handle: *mut usize, bytes: Option<u64>) -> CUresult {
    let s = tri!(state());
    let dev = tri!(current_device(s));
    let Some(bytes) = bytes.filter(|_| !handle.is_null()) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    tri!(charge(s, dev, bytes));
    let h = s.next_handle.fetch_add(16, Ordering::Relaxed);
    record(s, Kind::Array, h, dev, bytes);
    // SAFETY: `handle` was checked non-null above; array_create's callers pass the CUDA caller's
    // CUarray out-pointer.
    unsafe { put(handle, h as usize) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(handle: *mut usize, desc: *const ArrayDesc) -> CUresult {
    guard(|| {
        if desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null descriptor from the caller.
        let d = unsafe { &*desc };
        // SAFETY: `handle` is the caller's CUarray out-pointer, which array_create null-checks
        // before writing.
        unsafe {
            array_create(
                handle,
                array_bytes(d.width, d.height, 0, d.format, d.channels, 1),
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    handle: *mut usize,
    desc: *const Array3dDesc,
) -> CUresult {
    guard(|| {
        if desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null descriptor from the caller.
        let d = unsafe { &*desc };
        // SAFETY: `handle` is the caller's CUarray out-pointer, which array_create null-checks
        // before writing.
        unsafe {
            array_create(
                handle,
                array_bytes(d.width, d.height, d.depth, d.format, d.channels, 1),
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    handle: *mut usize,
    desc: *const Array3dDesc,
    levels: c_uint,
) -> CUresult {
    guard(|| {
        if desc.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null descriptor from the caller.
        let d = unsafe { &*desc };
        // SAFETY: `handle` is the caller's CUarray out-pointer, which array_create null-checks
        // before writing.
        unsafe {
            array_create(
                handle,
                array_bytes(d.width, d.height, d.depth, d.format, d.channels, levels),
            )
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuArrayDestroy(handle: usize) -> CUresult {
    guard(|| release(Kind::Array, handle as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMipmappedArrayDestroy(handle: usize) -> CUresult {
    guard(|| release(Kind::Array, handle as u64))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(err: CUresult, s: *mut *const c_char) -> CUresult {
    let text: &'static CStr = match err {
        CUDA_SUCCESS => c"no error",
        CUDA_ERROR_INVALID_VALUE => c"invalid argument",
        CUDA_ERROR_OUT_OF_MEMORY => c"out of memory",
        CUDA_ERROR_NOT_INITIALIZED => c"initialization error",
        CUDA_ERROR_NO_DEVICE => c"no CUDA-capable device is detected",
        CUDA_ERROR_INVALID_DEVICE => c"invalid device ordinal",
        CUDA_ERROR_INVALID_CONTEXT => c"invalid device context",
        CUDA_ERROR_INVALID_HANDLE => c"invalid resource handle",
        CUDA_ERROR_NOT_FOUND => c"named symbol not found",
        exec::CUDA_ERROR_NOT_READY => c"device not ready",
        _ => {
            // SAFETY: put rejects a null `s`; otherwise the CUDA driver-API contract makes it a
            // valid, writable out-pointer for a const char*.
            unsafe { put(s, std::ptr::null()) };
            return CUDA_ERROR_INVALID_VALUE;
        }
    };
    // SAFETY: put rejects a null `s`; otherwise the CUDA driver-API contract makes it a valid,
    // writable out-pointer for a const char*. The text is a 'static C string.
    unsafe { put(s, text.as_ptr()) }
}

// ---------------------------------------------------------------------------------------------
// cuGetProcAddress

fn exports() -> &'static [(&'static str, usize)] {
    static T: OnceLock<Vec<(&'static str, usize)>> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = table!(
            cuInit,
            cuDriverGetVersion,
            cuDeviceGetCount,
            cuDeviceGet,
            cuDeviceGetName,
            cuDeviceGetUuid,
            cuDeviceGetUuid_v2,
            cuDeviceTotalMem_v2,
            cuDeviceGetAttribute,
            cuCtxCreate_v2,
            cuCtxDestroy_v2,
            cuDevicePrimaryCtxRetain,
            cuDevicePrimaryCtxRelease_v2,
            cuDevicePrimaryCtxRelease,
            cuCtxSetCurrent,
            cuCtxPushCurrent_v2,
            cuCtxPopCurrent_v2,
            cuCtxPushCurrent,
            cuCtxPopCurrent,
            cuCtxGetCurrent,
            cuCtxGetDevice,
            cuMemGetInfo_v2,
            cuMemAlloc_v2,
            cuMemAllocManaged,
            cuMemAllocPitch_v2,
            cuMemFree_v2,
            cuDeviceGetDefaultMemPool,
            cuDeviceGetMemPool,
            cuMemPoolCreate,
            cuMemPoolDestroy,
            cuMemAllocAsync,
            cuMemAllocAsync_ptsz,
            cuMemAllocFromPoolAsync,
            cuMemAllocFromPoolAsync_ptsz,
            cuMemFreeAsync,
            cuMemFreeAsync_ptsz,
            cuMemGetAllocationGranularity,
            cuMemCreate,
            cuMemRelease,
            cuMemAddressReserve,
            cuMemAddressFree,
            cuMemMap,
            cuMemUnmap,
            cuMemSetAccess,
            cuMemGetAllocationPropertiesFromHandle,
            cuMemRetainAllocationHandle,
            cuMemExportToShareableHandle,
            cuMemImportFromShareableHandle,
            cuArrayCreate_v2,
            cuArray3DCreate_v2,
            cuMipmappedArrayCreate,
            cuArrayDestroy,
            cuMipmappedArrayDestroy,
            cuGetErrorString,
            cuGetProcAddress,
            cuGetProcAddress_v2,
            cuGetExportTable,
        );
        t.extend(exec::exports());
        t.extend(pools::exports());
        t.extend(graphmem::exports());
        t.extend(graphnodes::exports());
        t.extend(memops::exports());
        t.extend(devctx::exports());
        t.extend(streams::exports());
        t.extend(functions::exports());
        t.extend(xla::exports());
        t.extend(unsupported::exports());
        t
    })
}

/// Versioned variants whose signature or meaning changed, with the CUDA version that brought
/// them: a program built for an older CUDA asking for the base name gets the older variant.
/// Variants not listed here behave as their predecessors and are handed out at any version.
const INTRODUCED: &[(&str, i32)] = &[
    ("cuCtxCreate_v3", 11040),
    ("cuCtxCreate_v4", 12050),
    ("cuCtxGetDevice_v2", 13000),
    ("cuCtxSynchronize_v2", 13000),
    ("cuEventElapsedTime_v2", 12080),
    ("cuStreamBeginCapture_v2", 10010),
    ("cuStreamGetCtx_v2", 12050),
    ("cuStreamGetCaptureInfo_v2", 11030),
    ("cuStreamGetCaptureInfo_v3", 12030),
    ("cuMemAdvise_v2", 12020),
    ("cuMemPrefetchAsync_v2", 12020),
    ("cuGraphInstantiate_v2", 11000),
    ("cuGraphExecUpdate_v2", 12000),
    ("cuGraphAddNode_v2", 12030),
    ("cuGraphGetEdges_v2", 12030),
    ("cuGraphNodeGetDependencies_v2", 12030),
    ("cuGraphNodeGetDependentNodes_v2", 12030),
    ("cuGraphAddDependencies_v2", 12030),
    ("cuGraphRemoveDependencies_v2", 12030),
    ("cuStreamUpdateCaptureDependencies_v2", 12030),
    ("cuMemcpyBatchAsync_v2", 13000),
    ("cuMemcpy3DBatchAsync_v2", 13000),
];

fn introduced(name: &str) -> i32 {
    let base = name
        .strip_suffix("_ptsz")
        .or_else(|| name.strip_suffix("_ptds"))
        .unwrap_or(name);
    INTRODUCED.iter().find(|e| e.0 == base).map_or(0, |e| e.1)
}

/// Resolve a base name the way the driver does: per-thread-default-stream variant first when
/// asked (flag 2), then the highest `_vN` that the asking CUDA `version` knows, then the plain
/// name.
pub fn resolve(symbol: &str, version: i32, flags: u64) -> Option<usize> {
    let t = exports();
    let find = |n: &str| {
        if introduced(n) > version {
            return None;
        }
        t.iter().find(|e| e.0 == n).map(|e| e.1)
    };
    const VERSIONS: [&str; 5] = ["_v4", "_v3", "_v2", "", ""];
    if flags & 2 != 0 {
        for v in &VERSIONS[..4] {
            for suffix in ["_ptsz", "_ptds"] {
                if let Some(p) = find(&format!("{symbol}{v}{suffix}")) {
                    return Some(p);
                }
            }
        }
    }
    for v in &VERSIONS[..4] {
        if let Some(p) = find(&format!("{symbol}{v}")) {
            return Some(p);
        }
    }
    None
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    guard(|| {
        if symbol.is_null() || pfn.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: caller passes a NUL-terminated name.
        let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
        let found = resolve(name, _cuda_version, flags);
        trace::proc_address(name, _cuda_version, flags, found.is_some());
        // SAFETY: `pfn` was checked non-null above and `status` is checked before its write; both
        // are the caller's out-pointers per cuGetProcAddress's contract.
        unsafe {
            pfn.write(found.map_or(std::ptr::null_mut(), |p| p as *mut c_void));
            if !status.is_null() {
                status.write(if found.is_some() { 0 } else { 1 });
            }
        }
        if found.is_some() {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_NOT_FOUND
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: same caller contract as cuGetProcAddress_v2 (which null-checks `symbol` and `pfn`
    // before writing); only forwarded. A null `status` is allowed there.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_parse() {
        let b = uuid_bytes("GPU-2f5d1c3a-0000-1111-2222-333344445555");
        assert_eq!(b[0], 0x2f);
        assert_eq!(b[15], 0x55);
        assert_ne!(uuid_bytes("GPU-a"), uuid_bytes("GPU-b"));
    }

    #[test]
    fn array_sizes() {
        assert_eq!(array_bytes(100, 0, 0, 0x20, 4, 1), Some(1600));
        assert_eq!(array_bytes(8, 8, 0, 0x01, 1, 4), Some(64 + 16 + 4 + 1));
        assert_eq!(array_bytes(8, 8, 0, 0x77, 1, 1), None);
    }

    #[test]
    fn freeing_null_succeeds() {
        assert_eq!(cuMemFree_v2(0), CUDA_SUCCESS);
    }

    #[test]
    fn library_entry_points_bound_by_dlsym() {
        for name in [
            "cuKernelGetLibrary",
            "cuLinkCreate_v2",
            "cuLinkAddData_v2",
            "cuStreamGetGreenCtx",
            "cuTensorMapEncodeTiled",
            "cuOccupancyMaxActiveClusters",
        ] {
            assert!(exports().iter().any(|e| e.0 == name), "{name} not exported");
        }
        assert_eq!(
            resolve("cuLinkCreate", 13000, 0),
            Some(unsupported::cuLinkCreate_v2 as *const c_void as usize)
        );
    }

    #[test]
    fn proc_address_versions() {
        assert_eq!(
            resolve("cuMemAlloc", 13000, 0),
            Some(cuMemAlloc_v2 as *const c_void as usize)
        );
        assert_eq!(
            resolve("cuMemAllocAsync", 13000, 2),
            Some(cuMemAllocAsync_ptsz as *const c_void as usize)
        );
        assert_eq!(
            resolve("cuInit", 2000, 0),
            Some(cuInit as *const c_void as usize)
        );
        assert_eq!(resolve("cuNothing", 13000, 0), None);
        // the version asked picks the variant
        assert_eq!(
            resolve("cuCtxGetDevice", 2000, 0),
            Some(cuCtxGetDevice as *const c_void as usize)
        );
        assert_eq!(
            resolve("cuCtxGetDevice", 13000, 0),
            Some(devctx::cuCtxGetDevice_v2 as *const c_void as usize)
        );
        assert_eq!(
            resolve("cuMemcpyHtoD", 3020, 2),
            Some(memops::cuMemcpyHtoD_v2_ptds as *const c_void as usize)
        );
    }
}
