//! Interposition: which of the shim's exports stands for which driver function, by name (what
//! `dlsym` hands out, `exports/dl.rs`) and by the driver's address (what `cuGetProcAddress`
//! hands out). `cuGetProcAddress(_v2)` lives here rather than in `exports/`: it is in the table
//! it reads (an application may look `cuGetProcAddress` itself up through it).

use std::ffi::{c_char, c_int};

use crate::exports::cuda_graph::*;
use crate::exports::cuda_launch::*;
use crate::exports::cuda_memory::*;
use crate::exports::nvml::*;
use crate::exports::{guard, real_or};
use crate::ffi::{CUDA_SUCCESS, CUresult, Ptr};
use crate::{real, state};

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
    cuDeviceSetMemPool,
    cuDevicePrimaryCtxReset_v2,
    cuDevicePrimaryCtxReset,
    cuMemCreate,
    cuMemRelease,
    cuMemMap,
    cuMemUnmap,
    cuMemAddressFree,
    cuMemRetainAllocationHandle,
    cuMemImportFromShareableHandle,
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
    cuGraphInstantiateWithFlags,
    cuGraphInstantiateWithParams,
    cuGraphInstantiateWithParams_ptsz,
    cuGraphInstantiate_v2,
    cuGraphExecDestroy,
    cuMemPoolTrimTo,
    cuMemPoolSetAttribute,
    cuStreamSynchronize,
    cuStreamSynchronize_ptsz,
    cuEventSynchronize,
    cuCtxSynchronize,
    cuGraphAddMemAllocNode,
    cuGraphDestroy,
    cuDeviceGraphMemTrim,
    cuGraphAddNode,
    cuGraphAddNode_v2,
    cuGraphNodeSetParams,
    cuGraphExecNodeSetParams,
    cuGraphAddChildGraphNode,
    cuGraphExecChildGraphNodeSetParams,
    cuGraphClone,
    cuGraphUpload,
    cuGraphUpload_ptsz,
    cuGraphExecUpdate,
    cuGraphExecUpdate_v2,
    cuCtxSynchronize_v2,
    cuGetProcAddress,
    cuGetProcAddress_v2,
    nvmlDeviceGetMemoryInfo,
    nvmlDeviceGetMemoryInfo_v2,
);

pub fn hook_by_name(name: &[u8]) -> Option<usize> {
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
