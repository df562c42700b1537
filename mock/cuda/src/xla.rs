//! What XLA (JAX's PJRT CUDA plugin, `jax-cuda13-plugin`) asks of the driver beyond what
//! NVIDIA's runtime asks. XLA calls the driver API itself: it `dlopen`s `libcuda.so.1` and looks
//! each function up by the name its `cuda.h` gives it (`dlsym`), so it needs the exported names
//! a real driver has, not only what `cuGetProcAddress` resolves:
//! - the versioned names of CUDA 12.8+ headers (`cuEventElapsedTime_v2`, which XLA's autotuner
//!   times kernels with);
//! - the unversioned names older builds (and some NVIDIA libraries) still bind, which a real
//!   driver keeps with the `_v2` meaning: `cuDevicePrimaryCtxReset` here, `cuCtxPushCurrent`,
//!   `cuCtxPopCurrent` and `cuDevicePrimaryCtxRelease` beside their `_v2` in `lib.rs`;
//! - `cuModuleLoadFatBinary`: XLA loads the kernels it compiles (PTX through the `ptxas` of the
//!   `nvidia-cuda-nvcc` wheel) as cubins wrapped in a fat binary. It loads like any image.

use std::ffi::{c_float, c_void};

use crate::driver::{CUdevice, CUresult};

/// A fat binary loads like any other image (`cuModuleLoadData`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadFatBinary(m: *mut usize, fatbin: *const c_void) -> CUresult {
    // SAFETY: the caller's pointers, passed on unchanged (checked there).
    unsafe { crate::exec::cuModuleLoadData(m, fatbin) }
}

/// CUDA 12.8's name for `cuEventElapsedTime` (same arguments and meaning).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut c_float,
    start: usize,
    end: usize,
) -> CUresult {
    // SAFETY: the caller's out-pointer and events, passed on unchanged (checked there).
    unsafe { crate::exec::cuEventElapsedTime(ms, start, end) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    crate::devctx::cuDevicePrimaryCtxReset_v2(dev)
}

/// This module's exports for `cuGetProcAddress`.
pub(crate) fn exports() -> Vec<(&'static str, usize)> {
    macro_rules! e {
        ($($f:ident),* $(,)?) => { vec![$((stringify!($f), $f as *const c_void as usize)),*] };
    }
    e!(
        cuModuleLoadFatBinary,
        cuEventElapsedTime_v2,
        cuDevicePrimaryCtxReset,
    )
}
