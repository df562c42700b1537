//! What every entry point of the mock driver stands on: CUDA's handle types and return codes,
//! the process's state (`cuInit` builds it: the devices this process sees, their allocations, the
//! driver limits), the current context per thread, the guard no panic crosses, the out-pointer
//! write and the macro that lists the exports `cuGetProcAddress` resolves.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::limits;

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// One CUDA device as this process sees it.
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) uuid: [u8; 16],
    pub(crate) total: u64,
    pub(crate) used: AtomicU64,
    /// Lane of the node-wide device timeline (GPU minor, MIG instance).
    pub(crate) lane: usize,
    /// PCI domain, bus and device numbers (of the parent GPU for a MIG instance).
    pub(crate) pci: (i32, i32, i32),
}

pub(crate) struct State {
    pub(crate) driver_version: c_int,
    pub(crate) devices: Vec<Device>,
    /// (kind, handle) → (device, bytes)
    pub(crate) allocs: Mutex<HashMap<(u8, u64), (usize, u64)>>,
    pub(crate) next_handle: AtomicU64,
    /// Driver memory limits and MPS client limits (limits.rs).
    pub(crate) limits: limits::Limits,
}

pub(crate) static STATE: OnceLock<Result<State, String>> = OnceLock::new();

thread_local! {
    /// The calling thread's current context: the top of its context stack (0: the stack is
    /// empty).
    pub(crate) static CURRENT: Cell<usize> = const { Cell::new(0) };
    /// The contexts beneath the top of the calling thread's context stack, oldest first.
    static BELOW: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The real driver keeps a stack of contexts per thread: `cuCtxPushCurrent` and `cuCtxCreate`
/// push, `cuCtxPopCurrent` pops and makes the context beneath current again, `cuCtxSetCurrent`
/// replaces the top (with null: pops). cuBLAS 13 brackets work on a handle's context with a push
/// and a pop; a pop that left no current context made the next kernel launch of the thread fail
/// with `CUDA_ERROR_INVALID_CONTEXT` (CuPy: `CUFFT_EXEC_FAILED` on an FFT after two GEMMs).
pub(crate) fn ctx_push(ctx: usize) {
    let top = CURRENT.with(|c| c.replace(ctx));
    if top != 0 {
        // At thread exit the stack may be gone already: nothing to keep then.
        let _ = BELOW.try_with(|b| b.borrow_mut().push(top));
    }
}

/// Pops the top of the calling thread's context stack: the popped context (0: the stack was
/// empty); the one beneath becomes current.
pub(crate) fn ctx_pop() -> usize {
    let beneath = BELOW
        .try_with(|b| b.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or(0);
    CURRENT.with(|c| c.replace(beneath))
}

/// `cuCtxSetCurrent`: replaces the top of the stack (pushes onto an empty one); null pops.
pub(crate) fn ctx_set_top(ctx: usize) {
    if ctx == 0 {
        ctx_pop();
    } else {
        CURRENT.with(|c| c.set(ctx));
    }
}

/// A destroyed context leaves the calling thread's stack wherever it is.
pub(crate) fn ctx_forget(ctx: usize) {
    let _ = BELOW.try_with(|b| b.borrow_mut().retain(|c| *c != ctx));
    if CURRENT.with(Cell::get) == ctx {
        ctx_pop();
    }
}

/// Context handles are `CTX_BASE + device` (never 0).
pub(crate) const CTX_BASE: usize = 0x0c7c_0000;

pub(crate) fn guard(f: impl FnOnce() -> CUresult) -> CUresult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(CUDA_ERROR_UNKNOWN)
}

pub(crate) fn state() -> Result<&'static State, CUresult> {
    match STATE.get() {
        Some(Ok(s)) => Ok(s),
        Some(Err(_)) => Err(CUDA_ERROR_NO_DEVICE),
        None => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

pub(crate) fn current_device(s: &State) -> Result<usize, CUresult> {
    let c = CURRENT.with(Cell::get);
    if c < CTX_BASE || c - CTX_BASE >= s.devices.len() {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    Ok(c - CTX_BASE)
}

pub(crate) unsafe fn put<T>(out: *mut T, v: T) -> CUresult {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passed a valid out-pointer (checked non-null).
    unsafe { out.write(v) };
    CUDA_SUCCESS
}

macro_rules! table {
    ($($f:ident),* $(,)?) => {
        vec![$((stringify!($f), $f as *const std::ffi::c_void as usize)),*]
    };
}
pub(crate) use table;

/// The value of an `Ok`, or return the error code from the enclosing entry point.
macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return e,
        }
    };
}
pub(crate) use tri;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Linear,
    Vmm,
    Array,
    Pool,
    /// a VMM handle imported from a shareable handle (its memory is its exporter's)
    VmmImport,
}

pub(crate) fn device(s: &State, dev: CUdevice) -> Result<&Device, CUresult> {
    usize::try_from(dev)
        .ok()
        .and_then(|d| s.devices.get(d))
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

/// (domain, bus, device) of a PCI bus id `dddddddd:bb:dd.f`; zeros where it does not parse.
pub fn pci_numbers(bus_id: &str) -> (i32, i32, i32) {
    let mut parts = bus_id.split([':', '.']);
    let mut next = || {
        parts
            .next()
            .and_then(|p| i32::from_str_radix(p, 16).ok())
            .unwrap_or(0)
    };
    (next(), next(), next())
}

/// Take `bytes` of device `dev`'s memory (and of the driver and MPS limits, `limits.rs`).
pub(crate) fn charge(s: &State, dev: usize, bytes: u64) -> Result<(), CUresult> {
    let d = s.devices.get(dev).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    d.used
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
            u.checked_add(bytes).filter(|n| *n <= d.total)
        })
        .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    if !limits::charge(&s.limits, dev, bytes) {
        d.used.fetch_sub(bytes, Ordering::AcqRel);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(())
}

/// Give back what [`charge`] took.
pub(crate) fn uncharge(s: &State, dev: usize, bytes: u64) {
    if let Some(d) = s.devices.get(dev) {
        d.used.fetch_sub(bytes, std::sync::atomic::Ordering::AcqRel);
        limits::release(&s.limits, dev, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current() -> usize {
        CURRENT.with(Cell::get)
    }

    #[test]
    fn contexts_stack_per_thread() {
        std::thread::spawn(|| {
            let (a, b) = (CTX_BASE, CTX_BASE + 1);
            assert_eq!(ctx_pop(), 0, "an empty stack pops nothing");
            ctx_push(a);
            ctx_push(b);
            assert_eq!(current(), b);
            assert_eq!(ctx_pop(), b);
            assert_eq!(
                current(),
                a,
                "the pop makes the context beneath current again"
            );
            ctx_set_top(b);
            assert_eq!(current(), b, "set replaces the top");
            assert_eq!(ctx_pop(), b);
            assert_eq!(current(), 0, "a was replaced, not kept beneath");
            ctx_push(a);
            ctx_push(b);
            ctx_set_top(0);
            assert_eq!(current(), a, "set to null pops");
            ctx_push(b);
            ctx_forget(a);
            assert_eq!(current(), b);
            assert_eq!(ctx_pop(), b);
            assert_eq!(current(), 0, "a destroyed context leaves the stack");
        })
        .join()
        .unwrap();
    }
}
