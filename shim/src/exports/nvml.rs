//! NVML memory reporting: `nvmlDeviceGetMemoryInfo` and `_v2` show the container's slice
//! (total = quota, never more than the device; used = what the container has charged;
//! free = what is left of the slice, never more than the device really has free).

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use crate::ffi::{NVML_ERROR_UNINITIALIZED, NVML_ERROR_UNKNOWN, NvmlMemory, NvmlMemoryV2, Ptr};
use crate::{enforce, real, state};

fn acct_for(device: *mut c_void) -> Option<(state::Acct, u64)> {
    let cfg = state::config()?;
    let mut buf = [0 as c_char; 96];
    let uuid = real::nvmlDeviceGetUUID().and_then(|f| {
        // SAFETY: real NVML call with a valid buffer.
        (unsafe { f(device, buf.as_mut_ptr(), buf.len() as c_uint) } == 0)
            .then(|| unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().ok())
            .flatten()
    });
    let mut index: c_uint = 0;
    let index = real::nvmlDeviceGetIndex().and_then(|f| {
        // SAFETY: real NVML call.
        (unsafe { f(device, &mut index) } == 0).then_some(index)
    });
    let a = state::entry_for_nvml(cfg, uuid, index)?;
    Some((a, cfg.region.used_by_live(a.idx)))
}

fn get_memory_info(device: *mut c_void, mem: *mut NvmlMemory) -> c_int {
    let Some(f) = real::nvmlDeviceGetMemoryInfo() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: real NVML call with the caller's arguments.
    let r = unsafe { f(device, mem) };
    if r != 0 || mem.is_null() {
        return r;
    }
    if let Some((a, charged)) = acct_for(device) {
        // SAFETY: non-null, just filled by NVML.
        let m = unsafe { &mut *mem };
        let (t, u, fr) = enforce::slice(a.limit, charged, m.total, m.free, 0);
        *m = NvmlMemory {
            total: t,
            free: fr,
            used: u,
        };
    }
    r
}

fn get_memory_info_v2(device: *mut c_void, mem: *mut NvmlMemoryV2) -> c_int {
    let Some(f) = real::nvmlDeviceGetMemoryInfo_v2() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: real NVML call with the caller's arguments.
    let r = unsafe { f(device, mem) };
    if r != 0 || mem.is_null() {
        return r;
    }
    if let Some((a, charged)) = acct_for(device) {
        // SAFETY: non-null, just filled by NVML.
        let m = unsafe { &mut *mem };
        let t = m.total.min(a.limit);
        let reserved = m.reserved.min(t);
        let (t, u, fr) = enforce::slice(a.limit, charged, m.total, m.free, reserved);
        m.total = t;
        m.reserved = reserved;
        m.used = u;
        m.free = fr;
    }
    r
}

/// Runs an NVML export's body; a panic becomes `NVML_ERROR_UNKNOWN` instead of unwinding into C.
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(NVML_ERROR_UNKNOWN)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: Ptr, mem: *mut NvmlMemory) -> c_int {
    guard(|| get_memory_info(device, mem))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: Ptr, mem: *mut NvmlMemoryV2) -> c_int {
    guard(|| get_memory_info_v2(device, mem))
}
