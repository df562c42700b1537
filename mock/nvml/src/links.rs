//! The GPU's links as NVML reports them: PCIe (`nvmlDeviceGetCurrPcieLinkGeneration`, `…Width`),
//! NVLink (`nvmlDeviceGetNvLinkState`, `nvmlDeviceGetNvLinkCapability`) and the multi-node NVLink
//! fabric (`nvmlDeviceGetGpuFabricInfoV`). XLA (JAX's CUDA plugin) asks for all of them when it
//! starts, to model transfer bandwidth; a library without one of these functions makes it fall
//! back to "PCIe gen 3 x16" with an error line, and a fabric query that fails aborts it.
//!
//! The simulated node is a set of standalone H100 SXM5 boards: each sits on a PCIe gen 5 x16
//! link, has the 18 NVLinks of its class, none of them connected (so no peer traffic goes over
//! NVLink), and belongs to no NVLink fabric (`NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`). A MIG
//! handle answers for its parent GPU's links, as the real library does.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::{
    NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, NVML_NVLINK_MAX_LINKS, nvmlDevice_t,
    nvmlEnableState_enum_NVML_FEATURE_DISABLED, nvmlEnableState_t, nvmlGpuFabricInfo_v2_t,
    nvmlGpuFabricInfo_v3_t, nvmlReturn_t,
};

use super::{
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_INVALID_ARGUMENT, NVML_SUCCESS, with_device,
};

/// PCIe generation and lane count of an H100 SXM5's host link.
const PCIE_GENERATION: c_uint = 5;
const PCIE_WIDTH: c_uint = 16;

/// `NVML_STRUCT_VERSION(GpuFabricInfo, 2)` and `…3`.
const FABRIC_INFO_V2: c_uint =
    (std::mem::size_of::<nvmlGpuFabricInfo_v2_t>() as c_uint) | (2 << 24);
const FABRIC_INFO_V3: c_uint =
    (std::mem::size_of::<nvmlGpuFabricInfo_v3_t>() as c_uint) | (3 << 24);

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

/// Every NVLink of the board is down: `NVML_FEATURE_DISABLED`; past the last link,
/// `INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    d: nvmlDevice_t,
    link: c_uint,
    active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    if link >= NVML_NVLINK_MAX_LINKS {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    answer(d, active, nvmlEnableState_enum_NVML_FEATURE_DISABLED)
}

/// No capability (P2P, system memory access, atomics, SLI) over a link that is down: 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkCapability(
    d: nvmlDevice_t,
    link: c_uint,
    _capability: c_uint,
    result: *mut c_uint,
) -> nvmlReturn_t {
    if link >= NVML_NVLINK_MAX_LINKS {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    answer(d, result, 0)
}

/// No NVLink fabric: a zeroed cluster UUID, clique 0, `NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`.
/// Structure versions 2 and 3 (`nvmlGpuFabricInfoV_t` of CUDA 12.4 and later headers).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    d: nvmlDevice_t,
    info: *mut nvmlGpuFabricInfo_v3_t,
) -> nvmlReturn_t {
    if info.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the caller's struct; its first field is the version, present in every version.
    let version = unsafe { (*info).version };
    if version != FABRIC_INFO_V2 && version != FABRIC_INFO_V3 {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    with_device(d, |_, _, _| {
        // SAFETY: `info` is non-null and, by its version, at least a v2 struct; the v3-only
        // field is written only when the caller said v3.
        unsafe {
            let v2 = info.cast::<nvmlGpuFabricInfo_v2_t>();
            (*v2).clusterUuid = [0; 16];
            (*v2).status = NVML_SUCCESS;
            (*v2).cliqueId = 0;
            (*v2).state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED as u8;
            (*v2).healthMask = 0;
            if version == FABRIC_INFO_V3 {
                (*info).healthSummary = 0;
            }
        }
        NVML_SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_versions_match_nvml_h() {
        // nvml.h: sizeof(nvmlGpuFabricInfo_v2_t) == 36, sizeof(nvmlGpuFabricInfo_v3_t) == 40
        assert_eq!(FABRIC_INFO_V2, 36 | (2 << 24));
        assert_eq!(FABRIC_INFO_V3, 40 | (3 << 24));
    }
}
