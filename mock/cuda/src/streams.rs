//! Stream and event entry points beyond launch, record and synchronize (`exec.rs`): cross-stream
//! waits, host callbacks, stream properties, capture information.
//!
//! Host callbacks (`cuLaunchHostFunc`, `cuStreamAddCallback`) run on a thread of their own once
//! the work queued before them on the stream has finished on the device timeline, earlier host
//! callbacks included, and the stream's later work waits for them (`hostwork.rs`), as the real
//! driver runs them in stream order on a driver thread.

use std::ffi::{c_int, c_uint, c_void};

use crate::driver::{CTX_BASE, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, CUresult, guard, put, tri};
use crate::exec::{self, with_stream};
use crate::hostwork;

/// The stream's device timeline tail and device (created on first use for default streams).
fn stream_info(s: usize, ptsz: bool) -> Result<(u64, usize), CUresult> {
    with_stream(s, ptsz, |_, st| Ok((st.tail, st.dev)))
}

/// `stream` waits for `event`: its tail moves to the event's completion.
fn wait_event(s: usize, ptsz: bool, event: usize) -> CUresult {
    guard(|| {
        let t = tri!(exec::event_time(event)).unwrap_or(0);
        let host = hostwork::of_event(event);
        let r = with_stream(s, ptsz, |_, st| {
            st.tail = st.tail.max(t);
            st.host.join(&host);
            Ok(())
        });
        r.err().unwrap_or(CUDA_SUCCESS)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent(s: usize, event: usize, _flags: c_uint) -> CUresult {
    wait_event(s, false, event)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent_ptsz(s: usize, event: usize, _flags: c_uint) -> CUresult {
    wait_event(s, true, event)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecordWithFlags(event: usize, s: usize, _flags: c_uint) -> CUresult {
    exec::cuEventRecord(event, s)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecordWithFlags_ptsz(event: usize, s: usize, _flags: c_uint) -> CUresult {
    exec::cuEventRecord_ptsz(event, s)
}

struct Callback(Box<dyn FnOnce() + Send>);

/// Queue host work on the stream: it runs after the stream's earlier work, host callbacks
/// included, and the stream's later work waits for it (`hostwork.rs`).
fn after_stream(s: usize, ptsz: bool, f: Callback) -> CUresult {
    guard(|| {
        let r = with_stream(s, ptsz, |_, st| {
            let before = std::mem::take(&mut st.host);
            match hostwork::spawn_after(before.clone(), st.tail, f.0) {
                Ok(mine) => {
                    st.host = mine;
                    Ok(())
                }
                Err(_) => {
                    st.host = before;
                    Err(crate::driver::CUDA_ERROR_UNKNOWN)
                }
            }
        });
        r.err().unwrap_or(CUDA_SUCCESS)
    })
}

type HostFn = unsafe extern "C" fn(*mut c_void);
type StreamCallback = unsafe extern "C" fn(usize, CUresult, *mut c_void);

struct SendPtr(*mut c_void);
// SAFETY: the user data pointer is handed back to the caller's own callback, as the driver does
// from its own thread; the caller guarantees it may be used there.
unsafe impl Send for SendPtr {}

fn host_func(s: usize, ptsz: bool, f: Option<HostFn>, data: *mut c_void) -> CUresult {
    let Some(f) = f else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let data = SendPtr(data);
    after_stream(
        s,
        ptsz,
        Callback(Box::new(move || {
            let d = data;
            // SAFETY: the caller's host function with its own user data, as the API promises.
            unsafe { f(d.0) }
        })),
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchHostFunc(s: usize, f: Option<HostFn>, data: *mut c_void) -> CUresult {
    host_func(s, false, f, data)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchHostFunc_ptsz(
    s: usize,
    f: Option<HostFn>,
    data: *mut c_void,
) -> CUresult {
    host_func(s, true, f, data)
}

fn add_callback(s: usize, ptsz: bool, f: Option<StreamCallback>, data: *mut c_void) -> CUresult {
    let Some(f) = f else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let data = SendPtr(data);
    after_stream(
        s,
        ptsz,
        Callback(Box::new(move || {
            let d = data;
            // SAFETY: the caller's callback with its stream, a success status and its data.
            unsafe { f(s, CUDA_SUCCESS, d.0) }
        })),
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamAddCallback(
    s: usize,
    f: Option<StreamCallback>,
    data: *mut c_void,
    _flags: c_uint,
) -> CUresult {
    add_callback(s, false, f, data)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamAddCallback_ptsz(
    s: usize,
    f: Option<StreamCallback>,
    data: *mut c_void,
    _flags: c_uint,
) -> CUresult {
    add_callback(s, true, f, data)
}

fn stream_out<T>(s: usize, ptsz: bool, out: *mut T, f: impl FnOnce(usize) -> T) -> CUresult {
    guard(|| {
        let (_, dev) = tri!(stream_info(s, ptsz));
        // SAFETY: put refuses a null `out`; otherwise the caller's out-slot.
        unsafe { put(out, f(dev)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetCtx(s: usize, ctx: *mut usize) -> CUresult {
    stream_out(s, false, ctx, |d| CTX_BASE + d)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetCtx_ptsz(s: usize, ctx: *mut usize) -> CUresult {
    stream_out(s, true, ctx, |d| CTX_BASE + d)
}

/// The green context a stream belongs to: none (the simulated driver has no green contexts,
/// `unsupported.rs`). cuBLASLt binds it by `dlsym` and refuses to start without it.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetGreenCtx(s: usize, green: *mut usize) -> CUresult {
    stream_out(s, false, green, |_| 0)
}

/// CUDA 12.5: the context, and the green context (none here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx_v2(
    s: usize,
    ctx: *mut usize,
    green: *mut usize,
) -> CUresult {
    stream_ctx_v2(s, false, ctx, green)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx_v2_ptsz(
    s: usize,
    ctx: *mut usize,
    green: *mut usize,
) -> CUresult {
    stream_ctx_v2(s, true, ctx, green)
}

fn stream_ctx_v2(s: usize, ptsz: bool, ctx: *mut usize, green: *mut usize) -> CUresult {
    if !green.is_null() {
        // SAFETY: the caller's non-null out-slot.
        unsafe { *green = 0 };
    }
    stream_out(s, ptsz, ctx, |d| CTX_BASE + d)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetDevice(s: usize, dev: *mut c_int) -> CUresult {
    stream_out(s, false, dev, |d| d as c_int)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetDevice_ptsz(s: usize, dev: *mut c_int) -> CUresult {
    stream_out(s, true, dev, |d| d as c_int)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetFlags(s: usize, flags: *mut c_uint) -> CUresult {
    stream_out(s, false, flags, |_| 0)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetFlags_ptsz(s: usize, flags: *mut c_uint) -> CUresult {
    stream_out(s, true, flags, |_| 0)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetPriority(s: usize, prio: *mut c_int) -> CUresult {
    stream_out(s, false, prio, |_| 0)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetPriority_ptsz(s: usize, prio: *mut c_int) -> CUresult {
    stream_out(s, true, prio, |_| 0)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetId(s: usize, id: *mut u64) -> CUresult {
    stream_out(s, false, id, |d| {
        if s > 2 {
            s as u64
        } else {
            (d as u64) << 4 | s as u64
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetId_ptsz(s: usize, id: *mut u64) -> CUresult {
    stream_out(s, true, id, |d| {
        if s > 2 { s as u64 } else { (d as u64) << 4 | 2 }
    })
}

/// Capture status (none / active) and id; the graph and its dependencies are not exposed.
fn capture_info(
    s: usize,
    ptsz: bool,
    status: *mut c_int,
    id: *mut u64,
    rest: &[*mut usize],
) -> CUresult {
    guard(|| {
        let mut capturing: c_int = 0;
        let r = exec::is_capturing(s, ptsz, &mut capturing);
        if r != CUDA_SUCCESS {
            return r;
        }
        // SAFETY: each out-slot may be null (CUDA allows it); non-null ones are the caller's.
        unsafe {
            if !status.is_null() {
                *status = capturing;
            }
            if !id.is_null() {
                *id = if capturing != 0 { s as u64 } else { 0 };
            }
            for p in rest {
                if !p.is_null() {
                    **p = 0;
                }
            }
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetCaptureInfo(s: usize, status: *mut c_int, id: *mut u64) -> CUresult {
    capture_info(s, false, status, id, &[])
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetCaptureInfo_ptsz(
    s: usize,
    status: *mut c_int,
    id: *mut u64,
) -> CUresult {
    capture_info(s, true, status, id, &[])
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetCaptureInfo_v2(
    s: usize,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut usize,
    deps: *mut usize,
    n: *mut usize,
) -> CUresult {
    capture_info(s, false, status, id, &[graph, deps, n])
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetCaptureInfo_v2_ptsz(
    s: usize,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut usize,
    deps: *mut usize,
    n: *mut usize,
) -> CUresult {
    capture_info(s, true, status, id, &[graph, deps, n])
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetCaptureInfo_v3(
    s: usize,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut usize,
    deps: *mut usize,
    edges: *mut usize,
    n: *mut usize,
) -> CUresult {
    capture_info(s, false, status, id, &[graph, deps, edges, n])
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetCaptureInfo_v3_ptsz(
    s: usize,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut usize,
    deps: *mut usize,
    edges: *mut usize,
    n: *mut usize,
) -> CUresult {
    capture_info(s, true, status, id, &[graph, deps, edges, n])
}

/// The capture mode of this thread (global by default), exchanged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CUresult {
    thread_local! {
        static MODE: std::cell::Cell<c_int> = const { std::cell::Cell::new(0) };
    }
    guard(|| {
        if mode.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: `mode` checked non-null; the caller's in/out slot.
        unsafe { *mode = MODE.with(|m| m.replace(*mode)) };
        CUDA_SUCCESS
    })
}

/// Stream attributes (access policy window, synchronization policy, priority...): read back as
/// zero, accepted when set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetAttribute(
    s: usize,
    _attr: c_int,
    value: *mut [u8; 48],
) -> CUresult {
    guard(|| {
        tri!(stream_info(s, false));
        // SAFETY: put refuses a null `value`; CUstreamAttrValue is a 48-byte union.
        unsafe { put(value, [0u8; 48]) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSetAttribute(s: usize, _attr: c_int, _value: *const c_void) -> CUresult {
    guard(|| stream_info(s, false).err().unwrap_or(CUDA_SUCCESS))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamCopyAttributes(dst: usize, src: usize) -> CUresult {
    guard(|| {
        tri!(stream_info(src, false));
        stream_info(dst, false).err().unwrap_or(CUDA_SUCCESS)
    })
}

pub(crate) fn exports() -> Vec<(&'static str, usize)> {
    crate::driver::table!(
        cuStreamWaitEvent,
        cuStreamWaitEvent_ptsz,
        cuEventRecordWithFlags,
        cuEventRecordWithFlags_ptsz,
        cuLaunchHostFunc,
        cuLaunchHostFunc_ptsz,
        cuStreamAddCallback,
        cuStreamAddCallback_ptsz,
        cuStreamGetCtx,
        cuStreamGetCtx_ptsz,
        cuStreamGetCtx_v2,
        cuStreamGetCtx_v2_ptsz,
        cuStreamGetGreenCtx,
        cuStreamGetDevice,
        cuStreamGetDevice_ptsz,
        cuStreamGetFlags,
        cuStreamGetFlags_ptsz,
        cuStreamGetPriority,
        cuStreamGetPriority_ptsz,
        cuStreamGetId,
        cuStreamGetId_ptsz,
        cuStreamGetCaptureInfo,
        cuStreamGetCaptureInfo_ptsz,
        cuStreamGetCaptureInfo_v2,
        cuStreamGetCaptureInfo_v2_ptsz,
        cuStreamGetCaptureInfo_v3,
        cuStreamGetCaptureInfo_v3_ptsz,
        cuThreadExchangeStreamCaptureMode,
        cuStreamGetAttribute,
        cuStreamSetAttribute,
        cuStreamCopyAttributes,
    )
}
