//! Kernel launch entry points: each is paced by the container's compute share
//! (`cores::admit`) and, when sampled, bracketed by the events that measure its device time.
//! Stream capture is tracked so that launches building a graph are not charged (the graph's
//! replays are).
#![allow(clippy::too_many_arguments)]

use std::ffi::{c_int, c_uint, c_void};

use super::{guard, real_or};
use crate::cores;
use crate::ffi::{CUDA_SUCCESS, CUresult, LaunchConfigHead, Ptr};

/// Admit, launch, and close the measurement when this launch was sampled.
#[inline(always)]
fn paced(key: usize, stream: usize, ptsz: bool, call: impl FnOnce() -> CUresult) -> CUresult {
    match cores::admit(key as u64, stream, ptsz) {
        None => call(),
        Some(s) => {
            if !s.begin(stream, ptsz) {
                return call();
            }
            let r = call();
            s.end(stream, ptsz, r == CUDA_SUCCESS);
            r
        }
    }
}

macro_rules! launch_kernel {
    ($name:ident, $ptsz:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: Ptr,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: usize,
            params: *mut Ptr,
            extra: *mut Ptr,
        ) -> CUresult {
            guard(|| {
                let real = real_or!($name);
                // SAFETY: see the enclosing function: pointers come from the caller.
                paced(f as usize, stream, $ptsz, || unsafe {
                    real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
                })
            })
        }
    };
}
launch_kernel!(cuLaunchKernel, false);
launch_kernel!(cuLaunchKernel_ptsz, true);

macro_rules! launch_cooperative {
    ($name:ident, $ptsz:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: Ptr,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shared: c_uint,
            stream: usize,
            params: *mut Ptr,
        ) -> CUresult {
            guard(|| {
                let real = real_or!($name);
                // SAFETY: see the enclosing function: pointers come from the caller.
                paced(f as usize, stream, $ptsz, || unsafe {
                    real(f, gx, gy, gz, bx, by, bz, shared, stream, params)
                })
            })
        }
    };
}
launch_cooperative!(cuLaunchCooperativeKernel, false);
launch_cooperative!(cuLaunchCooperativeKernel_ptsz, true);

macro_rules! launch_ex {
    ($name:ident, $ptsz:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            config: *const c_void,
            f: Ptr,
            params: *mut Ptr,
            extra: *mut Ptr,
        ) -> CUresult {
            guard(|| {
                let real = real_or!($name);
                if config.is_null() {
                    // SAFETY: the caller's arguments, unchanged, to the driver's own function.
                    return unsafe { real(config, f, params, extra) };
                }
                // SAFETY: the caller's CUlaunchConfig (checked non-null).
                let stream = unsafe { (*config.cast::<LaunchConfigHead>()).stream };
                // SAFETY: see the enclosing function: pointers come from the caller.
                paced(f as usize, stream, $ptsz, || unsafe {
                    real(config, f, params, extra)
                })
            })
        }
    };
}
launch_ex!(cuLaunchKernelEx, false);
launch_ex!(cuLaunchKernelEx_ptsz, true);

macro_rules! graph_launch {
    ($name:ident, $ptsz:expr) => {
        /// A graph replay is charged like one kernel of the graph's learnt device time.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(exec: usize, stream: usize) -> CUresult {
            guard(|| {
                let real = real_or!($name);
                // SAFETY: the caller's arguments, unchanged, to the driver's own function.
                paced(exec, stream, $ptsz, || unsafe { real(exec, stream) })
            })
        }
    };
}
graph_launch!(cuGraphLaunch, false);
graph_launch!(cuGraphLaunch_ptsz, true);

macro_rules! begin_capture {
    ($name:ident $(, $mode:ident)?) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(stream: usize $(, $mode: c_int)?) -> CUresult {
            guard(|| {
                let real = real_or!($name);
                // SAFETY: the caller's arguments, unchanged, to the driver's own function.
                let r = unsafe { real(stream $(, $mode)?) };
                if r == CUDA_SUCCESS {
                    cores::capture_begun();
                }
                r
            })
        }
    };
}
begin_capture!(cuStreamBeginCapture);
begin_capture!(cuStreamBeginCapture_ptsz);
begin_capture!(cuStreamBeginCapture_v2, mode);
begin_capture!(cuStreamBeginCapture_v2_ptsz, mode);

macro_rules! end_capture {
    ($name:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(stream: usize, graph: *mut usize) -> CUresult {
            guard(|| {
                let real = real_or!($name);
                // SAFETY: the caller's arguments, unchanged, to the driver's own function.
                let r = unsafe { real(stream, graph) };
                if r == CUDA_SUCCESS {
                    cores::capture_ended();
                }
                r
            })
        }
    };
}
end_capture!(cuStreamEndCapture);
end_capture!(cuStreamEndCapture_ptsz);
