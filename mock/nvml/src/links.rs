//! The GPU's host link as NVML reports it (`nvmlDeviceGetCurrPcieLinkGeneration`, `…Width`, and
//! their `Max` forms) and the NVLink queries XLA makes besides the ones in `lib.rs`
//! (`nvmlDeviceGetNvLinkState`, `nvmlDeviceGetNvLinkCapability`). XLA (JAX's CUDA plugin) looks
//! all of them up when it starts, to model transfer bandwidth; a library without one of them
//! makes it log "NVML library doesn't have required functions" and assume PCIe gen 3 x16.
//!
//! Each simulated GPU is an H100 SXM5 on a PCIe gen 5 x16 link. The simulated node has no NVLink
//! topology: every link query answers `NVML_ERROR_NOT_SUPPORTED` (as the other NVLink queries in
//! `lib.rs`), which XLA reads as "no NVLink". A MIG handle answers for its parent GPU.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlEnableState_t, nvmlReturn_t};

use super::{NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED, NVML_SUCCESS, with_device};

/// PCIe generation and lane count of an H100 SXM5's host link.
const PCIE_GENERATION: c_uint = 5;
const PCIE_WIDTH: c_uint = 16;

/// Write `value` through `out` for a known device.
fn answer(d: nvmlDevice_t, out: *mut c_uint, value: c_uint) -> nvmlReturn_t {
    if out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, _, _| {
        // SAFETY: non-null out-pointer of the caller.
        unsafe { out.write(value) };
        NVML_SUCCESS
    })
}

/// No NVLink on the simulated node: `NOT_SUPPORTED` for a known device with an out-pointer.
fn no_nvlink(d: nvmlDevice_t, out: *mut c_uint) -> nvmlReturn_t {
    if out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, _, _| NVML_ERROR_NOT_SUPPORTED)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    d: nvmlDevice_t,
    generation: *mut c_uint,
) -> nvmlReturn_t {
    answer(d, generation, PCIE_GENERATION)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    d: nvmlDevice_t,
    width: *mut c_uint,
) -> nvmlReturn_t {
    answer(d, width, PCIE_WIDTH)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    d: nvmlDevice_t,
    generation: *mut c_uint,
) -> nvmlReturn_t {
    answer(d, generation, PCIE_GENERATION)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    d: nvmlDevice_t,
    width: *mut c_uint,
) -> nvmlReturn_t {
    answer(d, width, PCIE_WIDTH)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    d: nvmlDevice_t,
    _link: c_uint,
    active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    no_nvlink(d, active)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkCapability(
    d: nvmlDevice_t,
    _link: c_uint,
    _capability: c_uint,
    result: *mut c_uint,
) -> nvmlReturn_t {
    no_nvlink(d, result)
}
