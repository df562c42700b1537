//! Kernel launch entry points: each is paced by the container's compute share
//! (`cores::admit`) and, when sampled, bracketed by the events that measure its device time.
//! Stream capture is tracked so that launches building a graph are not charged (the graph's
//! replays are).
#![allow(clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use super::{guard, real_or};
use crate::ffi::{CUDA_SUCCESS, CUresult, LaunchConfigHead, MemAllocNodeParams, Ptr};
use crate::{cores, graphmem, poolmem};

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
        /// A graph replay is charged like one kernel of the graph's learnt device time; its first
        /// launch charges the graph's memory (`graphmem`).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(exec: usize, stream: usize) -> CUresult {
            guard(|| {
                let real = real_or!($name);
                if let Err(e) = graphmem::launching(exec, "cuGraphLaunch (graph memory)") {
                    return e;
                }
                // SAFETY: the caller's arguments, unchanged, to the driver's own function.
                let r = paced(exec, stream, $ptsz, || unsafe { real(exec, stream) });
                if r != CUDA_SUCCESS {
                    graphmem::launch_failed(exec);
                }
                r
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
    ($name:ident, $ptsz:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(stream: usize, graph: *mut usize) -> CUresult {
            guard(|| {
                let real = real_or!($name);
                // SAFETY: the caller's arguments, unchanged, to the driver's own function.
                let r = unsafe { real(stream, graph) };
                if r == CUDA_SUCCESS {
                    cores::capture_ended();
                    if !graph.is_null() {
                        // SAFETY: the driver succeeded, so it wrote the caller's graph slot.
                        graphmem::capture_ended(stream, $ptsz, unsafe { graph.read() });
                    }
                }
                r
            })
        }
    };
}
end_capture!(cuStreamEndCapture, false);
end_capture!(cuStreamEndCapture_ptsz, true);

// Graph instantiation, destruction and trimming: where a graph's memory goes (`graphmem`)

macro_rules! instantiate {
    ($name:ident($($a:ident: $t:ty),*)) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(exec: *mut usize, graph: usize $(, $a: $t)*) -> CUresult {
            guard(|| {
                let real = real_or!($name);
                // SAFETY: the caller's arguments, unchanged, to the driver's own function.
                let r = unsafe { real(exec, graph $(, $a)*) };
                if r == CUDA_SUCCESS && !exec.is_null() {
                    // SAFETY: the driver succeeded, so it wrote the caller's exec slot.
                    graphmem::instantiated(unsafe { exec.read() }, graph);
                }
                r
            })
        }
    };
}
instantiate!(cuGraphInstantiateWithFlags(flags: u64));
instantiate!(cuGraphInstantiate_v2(err_node: *mut usize, log: *mut c_char, log_size: usize));

/// An explicit memory node: its bytes belong to the graph (`graphmem`), charged at launch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut usize,
    graph: usize,
    deps: *const usize,
    n: usize,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    guard(|| {
        let real = real_or!(cuGraphAddMemAllocNode);
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        let r = unsafe { real(node, graph, deps, n, params) };
        if r == CUDA_SUCCESS && !params.is_null() {
            // SAFETY: the caller's node parameters (non-null), read after the driver succeeded.
            let p = unsafe { &*params };
            graphmem::added_to_graph(graph, p.head.location_id, p.bytesize as u64);
        }
        r
    })
}

/// The driver's `$name($arg)`, then, when it succeeded, `graphmem::$then($arg)`.
macro_rules! then_note {
    ($name:ident($arg:ident: $t:ty) => $then:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($arg: $t) -> CUresult {
            guard(|| {
                let real = real_or!($name);
                // SAFETY: the caller's argument, unchanged, to the driver's own function.
                let r = unsafe { real($arg) };
                if r == CUDA_SUCCESS {
                    graphmem::$then($arg);
                }
                r
            })
        }
    };
}
then_note!(cuGraphExecDestroy(exec: usize) => exec_destroyed);

/// A synchronization: memory pools give back what they keep above their release threshold
/// (`poolmem`).
macro_rules! sync_point {
    ($name:ident($($arg:ident: $t:ty)?)) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $t)?) -> CUresult {
            guard(|| {
                let real = real_or!($name);
                // SAFETY: the caller's argument, unchanged, to the driver's own function.
                let r = unsafe { real($($arg)?) };
                if r == CUDA_SUCCESS {
                    poolmem::synchronized();
                }
                r
            })
        }
    };
}
sync_point!(cuStreamSynchronize(stream: usize));
sync_point!(cuStreamSynchronize_ptsz(stream: usize));
sync_point!(cuEventSynchronize(event: usize));
sync_point!(cuCtxSynchronize());
sync_point!(cuCtxSynchronize_v2(ctx: usize));
then_note!(cuGraphDestroy(graph: usize) => graph_destroyed);
then_note!(cuDeviceGraphMemTrim(dev: c_int) => trimmed);
