//! Device and context entry points NVIDIA's runtime resolves besides the ones `lib.rs` models
//! (enumeration, memory): PCI identity, peers, primary-context state and flags, context limits,
//! cache and shared-memory configuration, stream priorities, ids.

use std::ffi::{c_char, c_int, c_uint};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use crate::driver::{
    CTX_BASE, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE,
    CUDA_SUCCESS, CURRENT, CUdevice, CUresult, State, guard, put, state, tri,
};

const MAX_DEVICES: usize = 64;
/// Primary context per device: retain count and flags.
static PRIMARY_RETAINS: [AtomicI32; MAX_DEVICES] = [const { AtomicI32::new(0) }; MAX_DEVICES];
static PRIMARY_FLAGS: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];

fn dev_index(s: &State, dev: CUdevice) -> Result<usize, CUresult> {
    usize::try_from(dev)
        .ok()
        .filter(|d| *d < s.devices.len() && *d < MAX_DEVICES)
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

pub(crate) fn primary_retained(dev: usize) {
    if let Some(c) = PRIMARY_RETAINS.get(dev) {
        c.fetch_add(1, Ordering::AcqRel);
    }
}

pub(crate) fn primary_released(dev: usize) {
    if let Some(c) = PRIMARY_RETAINS.get(dev) {
        let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n > 0).then(|| n - 1)
        });
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let d = tri!(dev_index(s, dev));
        if flags.is_null() || active.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: both out-slots checked non-null.
        unsafe {
            *flags = PRIMARY_FLAGS[d].load(Ordering::Acquire);
            *active = c_int::from(PRIMARY_RETAINS[d].load(Ordering::Acquire) > 0);
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let d = tri!(dev_index(s, dev));
        PRIMARY_FLAGS[d].store(flags, Ordering::Release);
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let d = tri!(dev_index(s, dev));
        PRIMARY_RETAINS[d].store(0, Ordering::Release);
        PRIMARY_FLAGS[d].store(0, Ordering::Release);
        CUDA_SUCCESS
    })
}

/// `dddd:bb:dd.0`, as `cudaDeviceGetPCIBusId` shows it.
fn pci_text(pci: (i32, i32, i32)) -> String {
    format!("{:04x}:{:02x}:{:02x}.0", pci.0, pci.1, pci.2)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    out: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let d = tri!(dev_index(s, dev));
        if out.is_null() || len <= 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let t = pci_text(s.devices[d].pci);
        let n = t.len().min(len as usize - 1);
        // SAFETY: `out` holds `len` bytes (caller contract); n + 1 <= len are written.
        unsafe {
            std::ptr::copy_nonoverlapping(t.as_ptr(), out.cast::<u8>(), n);
            *out.add(n) = 0;
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, id: *const c_char) -> CUresult {
    guard(|| {
        let s = tri!(state());
        if id.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller's NUL-terminated bus id.
        let text = unsafe { std::ffi::CStr::from_ptr(id) }
            .to_string_lossy()
            .to_string();
        let want = crate::driver::pci_numbers(&text);
        match s.devices.iter().position(|d| d.pci == want) {
            // SAFETY: put refuses a null `dev`; otherwise the caller's out-slot.
            Some(i) => unsafe { put(dev, i as CUdevice) },
            None => CUDA_ERROR_INVALID_DEVICE,
        }
    })
}

/// HGX H100s reach each other over NVLink: every pair of distinct devices are peers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        tri!(dev_index(s, dev));
        tri!(dev_index(s, peer));
        // SAFETY: put refuses a null `can`; otherwise the caller's out-slot.
        unsafe { put(can, c_int::from(dev != peer)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    v: *mut c_int,
    attr: c_int,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        tri!(dev_index(s, src));
        tri!(dev_index(s, dst));
        if src == dst {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        // performance rank 0; access, native atomics, CUDA array access supported
        let val = c_int::from(attr != 1);
        // SAFETY: put refuses a null `v`; otherwise the caller's out-slot.
        unsafe { put(v, val) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetTexture1DLinearMaxWidth(
    w: *mut usize,
    _fmt: c_int,
    _ch: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        tri!(dev_index(s, dev));
        // SAFETY: put refuses a null `w`; otherwise the caller's out-slot.
        unsafe { put(w, 268_435_456) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFlushGPUDirectRDMAWrites(_target: c_int, _scope: c_int) -> CUresult {
    guard(|| state().err().unwrap_or(CUDA_SUCCESS))
}

fn ctx_or_current(ctx: usize) -> Result<usize, CUresult> {
    let s = state()?;
    let c = if ctx == 0 {
        CURRENT.with(|c| c.get())
    } else {
        ctx
    };
    if c < CTX_BASE || c - CTX_BASE >= s.devices.len() {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    Ok(c)
}

/// CUDA 13: the device of a given context (0: the current one).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: usize) -> CUresult {
    guard(|| {
        let c = tri!(ctx_or_current(ctx));
        // SAFETY: put refuses a null `dev`; otherwise the caller's out-slot.
        unsafe { put(dev, (c - CTX_BASE) as CUdevice) }
    })
}

/// CUDA 13: synchronize a given context (0: the current one).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize_v2(ctx: usize) -> CUresult {
    guard(|| {
        tri!(ctx_or_current(ctx));
        crate::exec::cuCtxSynchronize()
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    guard(|| {
        let c = tri!(ctx_or_current(0));
        let f = PRIMARY_FLAGS
            .get(c - CTX_BASE)
            .map_or(0, |f| f.load(Ordering::Acquire));
        // SAFETY: put refuses a null `flags`; otherwise the caller's out-slot.
        unsafe { put(flags, f) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetFlags(flags: c_uint) -> CUresult {
    guard(|| {
        let c = tri!(ctx_or_current(0));
        if let Some(f) = PRIMARY_FLAGS.get(c - CTX_BASE) {
            f.store(flags, Ordering::Release);
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: usize, v: *mut c_uint) -> CUresult {
    guard(|| {
        tri!(ctx_or_current(ctx));
        // SAFETY: put refuses a null `v`; otherwise the caller's out-slot.
        unsafe { put(v, 3020) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetId(ctx: usize, id: *mut u64) -> CUresult {
    guard(|| {
        let c = tri!(ctx_or_current(ctx));
        // SAFETY: put refuses a null `id`; otherwise the caller's out-slot.
        unsafe { put(id, (c - CTX_BASE + 1) as u64) }
    })
}

/// `CUlimit` defaults of the real driver (13.0): stack, printf FIFO, malloc heap, sync depth,
/// pending launches, L2 fetch granularity, persisting L2, then the three limits of CUDA in
/// Graphics contexts (12.8): the shared memory kernels may use on a CIG context (the libraries
/// seen ask it only of a CIG context; here a multiprocessor's whole shared memory), whether the
/// context is CIG (never here), whether kernels needing more shared memory than a CIG context has
/// fall back instead of failing (on by default).
/// cuBLASLt asks `CU_LIMIT_CIG_ENABLED` when it builds its device context (`cublasLtCreate`,
/// `cublasCreate`): any answer but success, `CUDA_ERROR_INVALID_VALUE` or
/// `CUDA_ERROR_INVALID_CONTEXT` makes it drop the device description it just read, and every
/// GEMM of the handle then fails with `CUBLAS_STATUS_ARCH_MISMATCH` (compute capability 0).
const LIMITS: [usize; 10] = [1024, 1 << 20, 8 << 20, 2, 2048, 64, 0, 233_472, 0, 1];
/// `CU_LIMIT_SHMEM_SIZE` and `CU_LIMIT_CIG_ENABLED` can only be queried.
const QUERY_ONLY_LIMITS: [usize; 2] = [7, 8];
static LIMIT_VALUES: [std::sync::atomic::AtomicUsize; LIMITS.len()] =
    [const { std::sync::atomic::AtomicUsize::new(usize::MAX) }; LIMITS.len()];

/// `CUDA_ERROR_UNSUPPORTED_LIMIT`.
const UNSUPPORTED_LIMIT: CUresult = 215;

/// The value of `limit`: what was set, else the driver's default; a limit a 13.0 driver does not
/// know is `CUDA_ERROR_UNSUPPORTED_LIMIT`.
fn limit_value(limit: c_int) -> Result<usize, CUresult> {
    let i = usize::try_from(limit)
        .ok()
        .filter(|i| *i < LIMITS.len())
        .ok_or(UNSUPPORTED_LIMIT)?;
    let set = LIMIT_VALUES[i].load(Ordering::Acquire);
    Ok(if set == usize::MAX { LIMITS[i] } else { set })
}

/// Sets `limit`; the unknown and the query-only ones are `CUDA_ERROR_UNSUPPORTED_LIMIT`.
fn set_limit(limit: c_int, v: usize) -> CUresult {
    match usize::try_from(limit)
        .ok()
        .filter(|i| *i < LIMITS.len() && !QUERY_ONLY_LIMITS.contains(i))
    {
        Some(i) => {
            LIMIT_VALUES[i].store(v, Ordering::Release);
            CUDA_SUCCESS
        }
        None => UNSUPPORTED_LIMIT,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetLimit(v: *mut usize, limit: c_int) -> CUresult {
    guard(|| {
        tri!(ctx_or_current(0));
        let val = tri!(limit_value(limit));
        // SAFETY: put refuses a null `v`; otherwise the caller's out-slot.
        unsafe { put(v, val) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetLimit(limit: c_int, v: usize) -> CUresult {
    guard(|| {
        tri!(ctx_or_current(0));
        set_limit(limit, v)
    })
}

fn write_current<T>(out: *mut T, v: T) -> CUresult {
    guard(|| {
        tri!(ctx_or_current(0));
        // SAFETY: put refuses a null `out`; otherwise the caller's out-slot.
        unsafe { put(out, v) }
    })
}

fn accept_current() -> CUresult {
    guard(|| ctx_or_current(0).err().unwrap_or(CUDA_SUCCESS))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxGetCacheConfig(cfg: *mut c_int) -> CUresult {
    write_current(cfg, 0)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCacheConfig(_cfg: c_int) -> CUresult {
    accept_current()
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxGetSharedMemConfig(cfg: *mut c_int) -> CUresult {
    write_current(cfg, 1)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetSharedMemConfig(_cfg: c_int) -> CUresult {
    accept_current()
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxResetPersistingL2Cache() -> CUresult {
    accept_current()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    guard(|| {
        tri!(ctx_or_current(0));
        // SAFETY: either slot may be null (CUDA allows it); non-null ones are the caller's.
        unsafe {
            if !least.is_null() {
                *least = 0;
            }
            if !greatest.is_null() {
                *greatest = -5;
            }
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxEnablePeerAccess(peer: usize, _flags: c_uint) -> CUresult {
    guard(|| {
        let me = tri!(ctx_or_current(0));
        let p = tri!(ctx_or_current(peer));
        if me == p {
            return 217; // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED for itself
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDisablePeerAccess(peer: usize) -> CUresult {
    guard(|| {
        tri!(ctx_or_current(peer));
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(err: CUresult, out: *mut *const c_char) -> CUresult {
    let name: &'static std::ffi::CStr = match err {
        0 => c"CUDA_SUCCESS",
        1 => c"CUDA_ERROR_INVALID_VALUE",
        2 => c"CUDA_ERROR_OUT_OF_MEMORY",
        3 => c"CUDA_ERROR_NOT_INITIALIZED",
        100 => c"CUDA_ERROR_NO_DEVICE",
        101 => c"CUDA_ERROR_INVALID_DEVICE",
        201 => c"CUDA_ERROR_INVALID_CONTEXT",
        400 => c"CUDA_ERROR_INVALID_HANDLE",
        500 => c"CUDA_ERROR_NOT_FOUND",
        600 => c"CUDA_ERROR_NOT_READY",
        801 => c"CUDA_ERROR_NOT_SUPPORTED",
        999 => c"CUDA_ERROR_UNKNOWN",
        _ => {
            // SAFETY: put refuses a null `out`; otherwise the caller's out-slot.
            unsafe { put(out, std::ptr::null()) };
            return CUDA_ERROR_INVALID_VALUE;
        }
    };
    // SAFETY: put refuses a null `out`; the name is a 'static C string.
    unsafe { put(out, name.as_ptr()) }
}

pub(crate) fn exports() -> Vec<(&'static str, usize)> {
    crate::driver::table!(
        cuDevicePrimaryCtxGetState,
        cuDevicePrimaryCtxSetFlags_v2,
        cuDevicePrimaryCtxReset_v2,
        cuDeviceGetPCIBusId,
        cuDeviceGetByPCIBusId,
        cuDeviceCanAccessPeer,
        cuDeviceGetP2PAttribute,
        cuDeviceGetTexture1DLinearMaxWidth,
        cuFlushGPUDirectRDMAWrites,
        cuCtxGetDevice_v2,
        cuCtxSynchronize_v2,
        cuCtxGetFlags,
        cuCtxSetFlags,
        cuCtxGetApiVersion,
        cuCtxGetId,
        cuCtxGetLimit,
        cuCtxSetLimit,
        cuCtxGetCacheConfig,
        cuCtxSetCacheConfig,
        cuCtxGetSharedMemConfig,
        cuCtxSetSharedMemConfig,
        cuCtxResetPersistingL2Cache,
        cuCtxGetStreamPriorityRange,
        cuCtxEnablePeerAccess,
        cuCtxDisablePeerAccess,
        cuGetErrorName,
    )
}

// Contexts and primary contexts (current context per thread: driver.rs)

fn ctx_for(s: &State, dev: CUdevice) -> Result<usize, CUresult> {
    crate::driver::device(s, dev)?;
    Ok(CTX_BASE + dev as usize)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut usize,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let c = tri!(ctx_for(s, dev));
        crate::driver::ctx_push(c);
        // SAFETY: put rejects a null `pctx`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a CUcontext.
        unsafe { put(pctx, c) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut usize, dev: CUdevice) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let c = tri!(ctx_for(s, dev));
        primary_retained(dev as usize);
        // SAFETY: put rejects a null `pctx`; otherwise the CUDA driver-API contract makes it a
        // valid, writable out-pointer for a CUcontext.
        unsafe { put(pctx, c) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_of_a_13_0_driver() {
        assert_eq!(limit_value(0), Ok(1024), "stack size");
        assert_eq!(
            limit_value(8),
            Ok(0),
            "a context is not CIG (cuBLASLt asks at cublasCreate)"
        );
        assert_eq!(
            limit_value(7),
            Ok(233_472),
            "shared memory: a multiprocessor's"
        );
        assert_eq!(
            limit_value(10),
            Err(UNSUPPORTED_LIMIT),
            "CUDA 13.1+'s per-block memory"
        );
        assert_eq!(limit_value(-1), Err(UNSUPPORTED_LIMIT));
        assert_eq!(
            set_limit(8, 1),
            UNSUPPORTED_LIMIT,
            "CIG_ENABLED can only be queried"
        );
        assert_eq!(
            set_limit(7, 1),
            UNSUPPORTED_LIMIT,
            "SHMEM_SIZE can only be queried"
        );
        assert_eq!(limit_value(8), Ok(0));
        assert_eq!(
            set_limit(9, 0),
            CUDA_SUCCESS,
            "the CIG fallback can be turned off"
        );
        assert_eq!(limit_value(9), Ok(0));
        assert_eq!(set_limit(9, 1), CUDA_SUCCESS);
    }
}
