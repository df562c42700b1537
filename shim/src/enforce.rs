//! Holding a driver call to the quota: which quota device the call is for (the CUDA ordinal it
//! names, the current context's, a pool's), charging its bytes before the driver runs and
//! settling after (recorded per handle in `table`, released when the driver freed it), the
//! container's slice of a device that the memory reports show (CUDA's and NVML's), and the fork
//! child's reset (the `pthread_atfork` handler stores atomics only).

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::ffi::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUresult};
use crate::region;
use crate::state::{self, Acct, Config};
use crate::table::{self, Kind};
use crate::{cores, explain, real};

// ---------------------------------------------------------------------------------------------
// Fork safety

static ATFORK: AtomicBool = AtomicBool::new(false);

extern "C" fn atfork_child() {
    // async-signal-safe: atomics only
    region::forget_process();
    explain::forget_process();
    table::forget();
    state::forget_process();
    cores::forget_process();
    crate::poolmem::forget_process();
}

fn register_atfork() {
    if !ATFORK.load(Ordering::Relaxed) && !ATFORK.swap(true, Ordering::AcqRel) {
        // SAFETY: registering a plain function; the shim is never unloaded (preloaded).
        unsafe { libc::pthread_atfork(None, None, Some(atfork_child)) };
    }
}

// ---------------------------------------------------------------------------------------------
// Charging

/// Enforcement for a CUDA ordinal (None: no quota or unlimited, or the driver cannot say).
#[inline]
pub fn enforce_dev(dev: c_int) -> Option<(&'static Config, Acct)> {
    let cfg = state::config()?;
    let a = state::acct_for(cfg, dev).ok().flatten()?;
    register_atfork();
    Some((cfg, a))
}

/// The CUDA ordinal of the current context (None: the driver cannot say).
#[inline]
pub fn current_ordinal() -> Option<c_int> {
    let get = real::cuCtxGetDevice()?;
    let mut d: c_int = 0;
    // SAFETY: real driver call with a valid out-pointer.
    (unsafe { get(&mut d) } == CUDA_SUCCESS).then_some(d)
}

/// Enforcement for the current context's device.
#[inline]
pub fn enforce_current() -> Option<(&'static Config, Acct)> {
    state::config()?;
    enforce_dev(current_ordinal()?)
}

/// Device of a pool we saw created or handed out; else the current context's device.
pub fn enforce_pool(pool: usize) -> Option<(&'static Config, Acct)> {
    state::config()?;
    match table::get(Kind::Pool, pool as u64) {
        Some(dev) => enforce_dev(dev as c_int),
        None => enforce_current(),
    }
}

/// Charge `bytes` on `a` for the driver call `what`; a refusal is counted in the region and
/// explained on stderr.
#[inline]
pub fn charge(cfg: &Config, a: Acct, what: &str, bytes: u64) -> bool {
    let ok = cfg.region.charge(a.idx, bytes, a.limit);
    if !ok {
        explain::refused(cfg, a, what, bytes);
    }
    ok
}

/// Charge, call the driver, record (or roll back).
#[inline]
pub fn charged(
    e: Option<(&'static Config, Acct)>,
    what: &str,
    kind: Kind,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    handle: impl FnOnce() -> u64,
) -> CUresult {
    let Some((cfg, a)) = e else {
        return call();
    };
    if !charge(cfg, a, what, bytes) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let r = call();
    if r != CUDA_SUCCESS {
        cfg.region.uncharge(a.idx, bytes);
        return r;
    }
    // a full table keeps the charge until the process exits (fail closed)
    table::insert(kind, handle(), table::pack(a.idx, bytes));
    r
}

/// Release what `handle` was charged once the driver freed it.
#[inline]
pub fn released(kind: Kind, handle: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(cfg) = state::config() else {
        return call();
    };
    let taken = table::take(kind, handle);
    let r = call();
    if let Some(v) = taken {
        if r == CUDA_SUCCESS {
            let (d, b) = table::unpack(v);
            cfg.region.uncharge(d, b);
        } else {
            table::insert(kind, handle, v);
        }
    }
    r
}

pub unsafe fn read_ptr(p: *mut u64) -> u64 {
    // SAFETY: only called after the driver succeeded writing it.
    if p.is_null() { 0 } else { unsafe { p.read() } }
}

/// (total, used, free) of the slice given the device's real (total, free, reserved).
pub fn slice(limit: u64, charged: u64, total: u64, free: u64, reserved: u64) -> (u64, u64, u64) {
    let t = total.min(limit);
    let used = charged.min(t);
    let f = free.min(t.saturating_sub(used.saturating_add(reserved)));
    (t, used, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_math() {
        // quota 4 GiB on an 80 GiB device with 70 GiB free, 1 GiB charged
        let g = 1u64 << 30;
        assert_eq!(slice(4 * g, g, 80 * g, 70 * g, 0), (4 * g, g, 3 * g));
        // never more than the device
        assert_eq!(slice(100 * g, 0, 80 * g, 80 * g, 0), (80 * g, 0, 80 * g));
        // real free is the bound when neighbours used the device
        assert_eq!(slice(4 * g, 0, 80 * g, g, 0), (4 * g, 0, g));
    }
}
