//! The shim's exports, one file per API they stand in for: the CUDA driver's memory calls
//! (`cuda_memory`), its kernel launches and stream capture (`cuda_launch`), NVML's memory
//! reports (`nvml`), and glibc's `dlsym`/`dlvsym` (`dl`). `cuGetProcAddress` lives with the table
//! of exports in `interpose.rs`: it hands out the exports by the driver's addresses.
//!
//! What every export shares is here: no panic crosses the FFI boundary (`guard`), and a driver
//! function that cannot be found makes the call fail as the driver would before `cuInit`
//! (`real_or!`).

use crate::ffi::{CUDA_ERROR_UNKNOWN, CUresult};

pub mod cuda_graph;
pub mod cuda_launch;
pub mod cuda_memory;
pub mod dl;
pub mod nvml;

/// Runs an export's body; a panic becomes `CUDA_ERROR_UNKNOWN` instead of unwinding into C.
#[inline(always)]
pub fn guard(f: impl FnOnce() -> CUresult) -> CUresult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(CUDA_ERROR_UNKNOWN)
}

/// The driver's own `$f` (`real::$f()`), or return `CUDA_ERROR_NOT_INITIALIZED` from the
/// enclosing export when it cannot be found.
macro_rules! real_or {
    ($f:ident) => {
        match $crate::real::$f() {
            Some(f) => f,
            None => return $crate::ffi::CUDA_ERROR_NOT_INITIALIZED,
        }
    };
}
pub(crate) use real_or;
