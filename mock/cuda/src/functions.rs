//! Kernels, modules and libraries beyond loading and launching (`exec.rs`): function and kernel
//! attributes of an H100 kernel, occupancy, module globals and loading mode, library queries.
//! Module globals (`__device__` variables the runtime registers) get their own small lazily
//! committed device region per (module, name), not charged to the device, as module memory is
//! not part of what `cuMemGetInfo` reports as allocatable on a real GPU either.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Mutex;

use crate::driver::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS, CUresult, guard, put, state, tri,
};
use crate::vram;

/// `CUfunction_attribute` values of a simulated kernel.
fn func_attribute(attr: c_int) -> Option<c_int> {
    Some(match attr {
        0 => 1024,    // max threads per block
        1..=3 => 0,   // static shared, constant, local bytes
        4 => 32,      // registers
        5 | 6 => 90,  // PTX and binary version
        7 => 0,       // cache mode CA
        8 => 49152,   // max dynamic shared memory
        9 => -1,      // preferred carveout
        10..=14 => 0, // cluster attributes
        15 => 0,      // non-portable cluster size allowed
        16 => 0,      // cluster scheduling policy
        _ => return None,
    })
}

fn attr_out(v: *mut c_int, attr: c_int, f: usize) -> CUresult {
    guard(|| {
        tri!(state());
        tri!(crate::exec::kernel_ns(f as *mut c_void));
        match func_attribute(attr) {
            // SAFETY: put refuses a null `v`; otherwise the caller's out-slot.
            Some(x) => unsafe { put(v, x) },
            None => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

fn accept_func(f: usize) -> CUresult {
    guard(|| {
        tri!(state());
        crate::exec::kernel_ns(f as *mut c_void)
            .err()
            .unwrap_or(CUDA_SUCCESS)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncGetAttribute(v: *mut c_int, attr: c_int, f: usize) -> CUresult {
    attr_out(v, attr, f)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuKernelGetAttribute(
    v: *mut c_int,
    attr: c_int,
    k: usize,
    _dev: c_int,
) -> CUresult {
    attr_out(v, attr, k)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetAttribute(f: usize, _attr: c_int, _v: c_int) -> CUresult {
    accept_func(f)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuKernelSetAttribute(_attr: c_int, _v: c_int, k: usize, _dev: c_int) -> CUresult {
    accept_func(k)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetCacheConfig(f: usize, _cfg: c_int) -> CUresult {
    accept_func(f)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuKernelSetCacheConfig(k: usize, _cfg: c_int, _dev: c_int) -> CUresult {
    accept_func(k)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetSharedMemConfig(f: usize, _cfg: c_int) -> CUresult {
    accept_func(f)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncGetName(name: *mut *const c_char, f: usize) -> CUresult {
    guard(|| {
        tri!(crate::exec::kernel_ns(f as *mut c_void));
        // SAFETY: put refuses a null `name`; the text is a 'static C string.
        unsafe { put(name, c"gpufence_simulated_kernel".as_ptr()) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuKernelGetName(name: *mut *const c_char, k: usize) -> CUresult {
    cuFuncGetName(name, k)
}

/// Blocks of `block` threads per multiprocessor: 2048 threads, 32 blocks at most.
fn blocks_per_sm(block: c_int) -> c_int {
    if block <= 0 {
        0
    } else {
        (2048 / block).clamp(1, 32)
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut c_int,
    f: usize,
    block: c_int,
    _smem: usize,
) -> CUresult {
    guard(|| {
        tri!(crate::exec::kernel_ns(f as *mut c_void));
        // SAFETY: put refuses a null `n`; otherwise the caller's out-slot.
        unsafe { put(n, blocks_per_sm(block)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    n: *mut c_int,
    f: usize,
    block: c_int,
    smem: usize,
    _flags: c_uint,
) -> CUresult {
    cuOccupancyMaxActiveBlocksPerMultiprocessor(n, f, block, smem)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSize(
    grid: *mut c_int,
    block: *mut c_int,
    f: usize,
    _cb: *const c_void,
    _smem: usize,
    limit: c_int,
) -> CUresult {
    guard(|| {
        tri!(crate::exec::kernel_ns(f as *mut c_void));
        let b = if limit > 0 { limit.min(1024) } else { 1024 };
        if grid.is_null() || block.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: both out-slots checked non-null.
        unsafe {
            *block = b;
            *grid = 132 * blocks_per_sm(b);
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    grid: *mut c_int,
    block: *mut c_int,
    f: usize,
    cb: *const c_void,
    smem: usize,
    limit: c_int,
    _flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's slots, passed on.
    unsafe { cuOccupancyMaxPotentialBlockSize(grid, block, f, cb, smem, limit) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    out: *mut usize,
    f: usize,
    _blocks: c_int,
    _block: c_int,
) -> CUresult {
    guard(|| {
        tri!(crate::exec::kernel_ns(f as *mut c_void));
        // SAFETY: put refuses a null `out`; otherwise the caller's out-slot.
        unsafe { put(out, 232_448) }
    })
}

/// Size of each module global's region (a `__device__` variable of any size the runtime
/// registers fits; the runtime reads back only what it registered).
const GLOBAL_BYTES: u64 = 1 << 20;
static GLOBALS: Mutex<Option<HashMap<(usize, String), u64>>> = Mutex::new(None);

fn global(dptr: *mut u64, bytes: *mut usize, module: usize, name: *const c_char) -> CUresult {
    guard(|| {
        let s = tri!(state());
        if name.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller's NUL-terminated symbol name.
        let n = unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .to_string();
        let dev = crate::driver::current_device(s).unwrap_or(0);
        let mut m = GLOBALS.lock().unwrap_or_else(|e| e.into_inner());
        let m = m.get_or_insert_with(HashMap::new);
        let p = match m.get(&(module, n.clone())) {
            Some(p) => *p,
            None => {
                let Some(p) = vram::map(GLOBAL_BYTES, libc::PROT_READ | libc::PROT_WRITE) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                vram::insert(p, GLOBAL_BYTES, dev, vram::RegionKind::Device, 0);
                m.insert((module, n), p);
                p
            }
        };
        // SAFETY: either slot may be null (CUDA allows it); non-null ones are the caller's.
        unsafe {
            if !dptr.is_null() {
                *dptr = p;
            }
            if !bytes.is_null() {
                *bytes = GLOBAL_BYTES as usize;
            }
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut u64,
    bytes: *mut usize,
    module: usize,
    name: *const c_char,
) -> CUresult {
    global(dptr, bytes, module, name)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryGetGlobal(
    dptr: *mut u64,
    bytes: *mut usize,
    lib: usize,
    name: *const c_char,
) -> CUresult {
    global(dptr, bytes, lib, name)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryGetManaged(
    dptr: *mut u64,
    bytes: *mut usize,
    lib: usize,
    name: *const c_char,
) -> CUresult {
    global(dptr, bytes, lib, name)
}

/// `CU_MODULE_LAZY_LOADING`, the default since CUDA 12.2.
#[unsafe(no_mangle)]
pub extern "C" fn cuModuleGetLoadingMode(mode: *mut c_int) -> CUresult {
    // SAFETY: put refuses a null `mode`; otherwise the caller's out-slot.
    guard(|| unsafe { put(mode, 2) })
}

/// A library is its own module here.
#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryGetModule(module: *mut usize, lib: usize) -> CUresult {
    // SAFETY: put refuses a null `module`; otherwise the caller's out-slot.
    guard(|| unsafe { put(module, lib) })
}

/// Kernels are made on demand by name (`cuLibraryGetKernel`): none to enumerate up front.
#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryGetKernelCount(count: *mut c_uint, _lib: usize) -> CUresult {
    // SAFETY: put refuses a null `count`; otherwise the caller's out-slot.
    guard(|| unsafe { put(count, 0) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryEnumerateKernels(
    _kernels: *mut usize,
    _n: c_uint,
    _lib: usize,
) -> CUresult {
    guard(|| state().err().unwrap_or(CUDA_SUCCESS))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryGetUnifiedFunction(
    f: *mut *mut c_void,
    _lib: usize,
    _name: *const c_char,
) -> CUresult {
    // SAFETY: put refuses a null `f`; otherwise the caller's out-slot.
    guard(|| unsafe { put(f, std::ptr::null_mut()) })
}

pub(crate) fn exports() -> Vec<(&'static str, usize)> {
    crate::driver::table!(
        cuFuncGetAttribute,
        cuKernelGetAttribute,
        cuFuncSetAttribute,
        cuKernelSetAttribute,
        cuFuncSetCacheConfig,
        cuKernelSetCacheConfig,
        cuFuncSetSharedMemConfig,
        cuFuncGetName,
        cuKernelGetName,
        cuOccupancyMaxActiveBlocksPerMultiprocessor,
        cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
        cuOccupancyMaxPotentialBlockSize,
        cuOccupancyMaxPotentialBlockSizeWithFlags,
        cuOccupancyAvailableDynamicSMemPerBlock,
        cuModuleGetGlobal_v2,
        cuLibraryGetGlobal,
        cuLibraryGetManaged,
        cuModuleGetLoadingMode,
        cuLibraryGetModule,
        cuLibraryGetKernelCount,
        cuLibraryEnumerateKernels,
        cuLibraryGetUnifiedFunction,
    )
}
