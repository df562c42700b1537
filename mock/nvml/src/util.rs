//! What the simulated GPUs are doing, from the node-wide device timeline the mock CUDA driver
//! writes (`gpufence_mock_node::timeline`): device utilisation, per-process utilisation samples
//! and the processes running kernels.

use std::ffi::c_uint;
use std::sync::atomic::{AtomicUsize, Ordering};

use gpufence_mock_node::timeline::{self, Lane, Timeline};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t, nvmlProcessUtilizationSample_t,
    nvmlReturn_t, nvmlUtilization_t,
};

use crate::state::{
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND, NVML_SUCCESS,
    with_device,
};

/// The timeline, mapped once per process (0 = not yet, 1 = unusable, else the mapping).
static TIMELINE: AtomicUsize = AtomicUsize::new(0);

/// Map the timeline beside the node file at `node_file` (called from `nvmlInit`).
pub fn open(node_file: &std::path::Path, named: Option<&str>) {
    if TIMELINE.load(Ordering::Acquire) != 0 {
        return;
    }
    let v = timeline::open(&timeline::path_for(node_file, named))
        .map_or(1, |(t, _)| t as *const Timeline as usize);
    let _ = TIMELINE.compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire);
}

fn timeline() -> Option<&'static Timeline> {
    match TIMELINE.load(Ordering::Acquire) {
        0 | 1 => None,
        // SAFETY: a mapping of SIZE bytes published once and never unmapped.
        p => Some(unsafe { &*(p as *const Timeline) }),
    }
}

/// Run `f` on the lane of device `d` (a GPU or a MIG instance).
fn with_lane(d: nvmlDevice_t, f: impl FnOnce(&Lane) -> nvmlReturn_t) -> nvmlReturn_t {
    with_device(d, |_, gpu, mig| {
        let m = mig.and_then(|m| gpu.mig.iter().position(|x| std::ptr::eq(x, m)));
        let lane = timeline::lane_index(gpu.minor, m.map_or(0, |i| i + 1));
        match timeline() {
            Some(t) => f(t.lane(lane)),
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    d: nvmlDevice_t,
    u: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    if u.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_lane(d, |lane| {
        let gpu = lane.utilization(timeline::now_ns());
        // SAFETY: non-null out-pointer from the caller.
        unsafe { u.write(nvmlUtilization_t { gpu, memory: 0 }) };
        NVML_SUCCESS
    })
}

/// Monotonic ns → NVML's realtime microseconds.
fn to_realtime_us(mono_ns: u64) -> u64 {
    let now = timeline::now_ns();
    timeline::realtime_us().saturating_sub(now.saturating_sub(mono_ns) / 1000)
}

/// One sample per process active on the device, newer than `last_seen` (µs since the epoch).
/// With `samples` NULL, `count` receives the number of samples.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    d: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: u64,
) -> nvmlReturn_t {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_lane(d, |lane| {
        let list: Vec<nvmlProcessUtilizationSample_t> = lane
            .processes(timeline::now_ns())
            .into_iter()
            .map(|p| nvmlProcessUtilizationSample_t {
                pid: p.pid as c_uint,
                timeStamp: to_realtime_us(p.at_ns),
                smUtil: p.util,
                memUtil: 0,
                encUtil: 0,
                decUtil: 0,
            })
            .filter(|s| s.timeStamp > last_seen)
            .collect();
        // SAFETY: count is non-null; samples holds *count entries when non-null.
        unsafe { fill(&list, samples, count) }
    })
}

unsafe fn fill<T: Copy>(list: &[T], out: *mut T, count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller checked count; out has room for *count entries.
    unsafe {
        let room = *count as usize;
        *count = list.len() as c_uint;
        if list.is_empty() {
            return if out.is_null() {
                NVML_SUCCESS
            } else {
                NVML_ERROR_NOT_FOUND
            };
        }
        if out.is_null() || room < list.len() {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        std::ptr::copy_nonoverlapping(list.as_ptr(), out, list.len());
    }
    NVML_SUCCESS
}

fn running(d: nvmlDevice_t, f: impl FnOnce(Vec<u64>) -> nvmlReturn_t) -> nvmlReturn_t {
    with_lane(d, |lane| {
        f(lane
            .processes(timeline::now_ns())
            .iter()
            .map(|p| p.pid)
            .collect())
    })
}

/// Processes that ran kernels on the device within the last 2 s (memory not tracked per
/// process: `usedGpuMemory` is NVML_VALUE_NOT_AVAILABLE).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    running(d, |pids| {
        let list: Vec<nvmlProcessInfo_t> = pids
            .into_iter()
            .map(|pid| nvmlProcessInfo_t {
                pid: pid as c_uint,
                usedGpuMemory: u64::MAX,
                gpuInstanceId: u32::MAX,
                computeInstanceId: u32::MAX,
            })
            .collect();
        // SAFETY: as in fill.
        let r = unsafe { fill(&list, infos, count) };
        if r == NVML_ERROR_NOT_FOUND {
            NVML_SUCCESS
        } else {
            r
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's pointers, passed on unchanged.
    unsafe { nvmlDeviceGetComputeRunningProcesses_v3(d, count, infos) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    running(d, |pids| {
        let list: Vec<nvmlProcessInfo_v1_t> = pids
            .into_iter()
            .map(|pid| nvmlProcessInfo_v1_t {
                pid: pid as c_uint,
                usedGpuMemory: u64::MAX,
            })
            .collect();
        // SAFETY: as in fill.
        let r = unsafe { fill(&list, infos, count) };
        if r == NVML_ERROR_NOT_FOUND {
            NVML_SUCCESS
        } else {
            r
        }
    })
}
