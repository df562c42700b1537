//! Execution on the simulated GPU: modules and libraries, kernels, streams, events, stream
//! capture and graphs, against the node-wide device timeline (`gpufence_mock_node::timeline`).
//!
//! - Any module or library image loads. `cuModuleGetFunction` / `cuLibraryGetKernel` return a
//!   kernel whose device time per launch is N µs when its name is `gpufence_spin_<N>us`, zero
//!   otherwise, whatever the grid.
//! - A launch on a stream that is not capturing reserves its device time on the GPU's lane
//!   (one kernel at a time per GPU across the node, in launch order); the stream's tail becomes
//!   the kernel's end. On a capturing stream the kernel is appended to the capture instead.
//! - Events are zero-time commands in the same device queue: one recorded on a stream completes
//!   at `max(now, stream tail, GPU busy_until)`, so two events around a kernel time exactly that
//!   kernel's device time (`cuEventElapsedTime`).
//! - `cu*Synchronize` sleep until the work is done; `cuStreamQuery` / `cuEventQuery` answer
//!   `CUDA_ERROR_NOT_READY` until then.
//! - A graph launch reserves its kernels' total device time as one block.
#![allow(clippy::too_many_arguments)]

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_float, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use gpufence_mock_node::timeline::{self, Me, Timeline};

use crate::graphmem;
use crate::hostwork::{self, Pending};

use crate::driver::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS,
    CUresult, current_device, guard, put, state, tri,
};

pub const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;

/// `CU_STREAM_PER_THREAD`
const PER_THREAD: usize = 2;
const FUNC_BASE: usize = 0x0f0c_0000_0000;
const MAX_FUNCS: usize = 1 << 14;
const STREAM_BASE: usize = 0x05e0_0000_0000;
const HANDLE_STRIDE: usize = 16;

/// Device time per kernel handle, + 1 (0 = no such kernel).
static FUNCS: [AtomicU64; MAX_FUNCS] = [const { AtomicU64::new(0) }; MAX_FUNCS];
static NEXT_FUNC: AtomicUsize = AtomicUsize::new(0);
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

pub(crate) struct Stream {
    pub(crate) dev: usize,
    pub(crate) tail: u64,
    pub(crate) capture: Option<Vec<u64>>,
    /// bytes of the graph allocations made during the capture (graphmem.rs)
    pub(crate) capture_mem: u64,
    /// host callbacks queued on it that its later work waits for (hostwork.rs)
    pub(crate) host: crate::hostwork::Pending,
}

pub(crate) struct Exec {
    timeline: &'static Timeline,
    me: Me,
    streams: Mutex<HashMap<usize, Stream>>,
    /// event → completion time (None: created, never recorded)
    events: Mutex<HashMap<usize, Option<u64>>>,
    /// graph or graph exec → its kernels' device times
    graphs: Mutex<HashMap<usize, Vec<u64>>>,
}

static EXEC: OnceLock<Option<Exec>> = OnceLock::new();

/// Called from `cuInit` with the timeline file found beside the node description.
pub fn init(path: &std::path::Path) {
    EXEC.get_or_init(|| {
        let (t, shared) = timeline::open(path)?;
        if !shared && std::env::var_os("GPUFENCE_MOCK_DEBUG").is_some() {
            eprintln!(
                "mock cuda: {}: not usable; this process keeps its own device timeline",
                path.display()
            );
        }
        Some(Exec {
            timeline: t,
            me: Me::new(),
            streams: Mutex::new(HashMap::new()),
            events: Mutex::new(HashMap::new()),
            graphs: Mutex::new(HashMap::new()),
        })
    });
}

fn exec() -> Result<&'static Exec, CUresult> {
    state()?;
    EXEC.get()
        .and_then(Option::as_ref)
        .ok_or(CUDA_ERROR_UNKNOWN)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn new_handle() -> usize {
    0x0a00_0000_0000 + NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) as usize * HANDLE_STRIDE
}

/// Device time of a kernel named `gpufence_spin_<N>us`, in ns (0 for any other name).
pub fn spin_ns(name: &str) -> u64 {
    name.strip_prefix("gpufence_spin_")
        .and_then(|r| r.strip_suffix("us"))
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(0, |us| us.saturating_mul(1000))
}

pub(crate) fn new_kernel(name: *const c_char) -> Result<usize, CUresult> {
    if name.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's NUL-terminated kernel name.
    let n = unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("");
    let i = NEXT_FUNC.fetch_add(1, Ordering::Relaxed);
    let slot = FUNCS.get(i).ok_or(CUDA_ERROR_UNKNOWN)?;
    slot.store(spin_ns(n) + 1, Ordering::Release);
    Ok(FUNC_BASE + i * HANDLE_STRIDE)
}

/// Device time of kernel handle `f` (INVALID_HANDLE when it is not one of ours).
pub(crate) fn kernel_ns(f: *mut c_void) -> Result<u64, CUresult> {
    let f = f as usize;
    let off = f.wrapping_sub(FUNC_BASE);
    if f < FUNC_BASE || !off.is_multiple_of(HANDLE_STRIDE) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    match FUNCS
        .get(off / HANDLE_STRIDE)
        .map(|s| s.load(Ordering::Acquire))
    {
        Some(v) if v != 0 => Ok(v - 1),
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

/// Key of a stream handle: created streams are themselves; default streams (0, legacy 1,
/// per-thread 2; `ptsz` turns 0 into per-thread) are per device.
fn stream_key(s: usize, ptsz: bool, dev: usize) -> usize {
    let s = if ptsz && s == 0 { PER_THREAD } else { s };
    if s >= STREAM_BASE { s } else { (dev << 4) | s }
}

/// Run `f` on the stream's state (created on first use for default streams).
pub(crate) fn with_stream<R>(
    s: usize,
    ptsz: bool,
    f: impl FnOnce(&Exec, &mut Stream) -> Result<R, CUresult>,
) -> Result<R, CUresult> {
    let e = exec()?;
    let st = state()?;
    let dev = current_device(st)?;
    let mut m = lock(&e.streams);
    let key = stream_key(s, ptsz, dev);
    if key >= STREAM_BASE && !m.contains_key(&key) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let stream = m.entry(key).or_insert(Stream {
        dev,
        tail: 0,
        capture: None,
        capture_mem: 0,
        host: Default::default(),
    });
    f(e, stream)
}

fn lane_of(dev: usize) -> Result<usize, CUresult> {
    let s = state()?;
    s.devices
        .get(dev)
        .map(|d| d.lane)
        .ok_or(crate::CUDA_ERROR_INVALID_DEVICE)
}

/// Enqueue `kernels` (device times) on a stream: captured, or run on the GPU as one block.
fn enqueue(s: usize, ptsz: bool, kernels: &[u64]) -> CUresult {
    let r = with_stream(s, ptsz, |e, st| {
        if let Some(c) = st.capture.as_mut() {
            c.extend_from_slice(kernels);
            return Ok(());
        }
        let now = timeline::now_ns();
        let total: u64 = kernels.iter().sum();
        if total == 0 {
            st.tail = st.tail.max(now);
            return Ok(());
        }
        let lane = e.timeline.lane(lane_of(st.dev)?);
        let (_, end) = lane.reserve(total, now, &e.me);
        st.tail = end;
        Ok(())
    });
    r.err().unwrap_or(CUDA_SUCCESS)
}

fn launch(f: *mut c_void, s: usize, ptsz: bool) -> CUresult {
    guard(|| match kernel_ns(f) {
        Ok(ns) => enqueue(s, ptsz, &[ns]),
        Err(e) => e,
    })
}

// ---------------------------------------------------------------------------------------------
// Modules and libraries

unsafe fn new_module(out: *mut usize) -> CUresult {
    guard(|| {
        if let Err(e) = state() {
            return e;
        }
        // SAFETY: the caller's out-pointer (put refuses NULL).
        unsafe { put(out, new_handle()) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(m: *mut usize, image: *const c_void) -> CUresult {
    if image.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller's pointers, passed on unchanged.
    unsafe { new_module(m) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    m: *mut usize,
    image: *const c_void,
    _n: c_uint,
    _opts: *mut c_int,
    _vals: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's pointers, passed on unchanged.
    unsafe { cuModuleLoadData(m, image) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(m: *mut usize, fname: *const c_char) -> CUresult {
    if fname.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller's NUL-terminated path.
    let path = unsafe { CStr::from_ptr(fname) }
        .to_string_lossy()
        .into_owned();
    if std::fs::metadata(&path).is_err() {
        return CUDA_ERROR_FILE_NOT_FOUND;
    }
    // SAFETY: the caller's pointers, passed on unchanged.
    unsafe { new_module(m) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(_m: usize) -> CUresult {
    guard(|| state().err().unwrap_or(CUDA_SUCCESS))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut usize,
    _m: usize,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        if let Err(e) = state() {
            return e;
        }
        match new_kernel(name) {
            // SAFETY: the caller's out-pointer (put refuses NULL).
            Ok(h) => unsafe { put(f, h) },
            Err(e) => e,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadData(
    lib: *mut usize,
    code: *const c_void,
    _jo: *mut c_int,
    _jv: *mut *mut c_void,
    _nj: c_uint,
    _lo: *mut c_int,
    _lv: *mut *mut c_void,
    _nl: c_uint,
) -> CUresult {
    // SAFETY: the caller's pointers, passed on unchanged.
    unsafe { cuModuleLoadData(lib, code) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    lib: *mut usize,
    fname: *const c_char,
    _jo: *mut c_int,
    _jv: *mut *mut c_void,
    _nj: c_uint,
    _lo: *mut c_int,
    _lv: *mut *mut c_void,
    _nl: c_uint,
) -> CUresult {
    // SAFETY: the caller's pointers, passed on unchanged.
    unsafe { cuModuleLoad(lib, fname) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryUnload(_lib: usize) -> CUresult {
    cuModuleUnload(0)
}

/// The library each `CUkernel` came from (`cuKernelGetLibrary`).
static KERNEL_LIBRARY: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernel(
    k: *mut usize,
    lib: usize,
    name: *const c_char,
) -> CUresult {
    // SAFETY: the caller's pointers, passed on unchanged.
    let r = unsafe { cuModuleGetFunction(k, lib, name) };
    if r == CUDA_SUCCESS {
        // SAFETY: cuModuleGetFunction succeeded, so `k` is the caller's non-null slot it wrote.
        let kernel = unsafe { *k };
        lock(&KERNEL_LIBRARY)
            .get_or_insert_with(HashMap::new)
            .insert(kernel, lib);
    }
    r
}

/// The library a kernel was taken from (cuBLASLt asks for it, by `dlsym`, at its start).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetLibrary(lib: *mut usize, k: usize) -> CUresult {
    guard(|| {
        let found = lock(&KERNEL_LIBRARY)
            .as_ref()
            .and_then(|m| m.get(&k).copied());
        match found {
            // SAFETY: the caller's out-pointer (put refuses NULL).
            Some(l) => unsafe { put(lib, l) },
            None => CUDA_ERROR_INVALID_HANDLE,
        }
    })
}

/// A `CUkernel` is launchable as a `CUfunction` (same handle here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetFunction(f: *mut usize, k: usize) -> CUresult {
    guard(|| match kernel_ns(k as *mut c_void) {
        // SAFETY: the caller's out-pointer (put refuses NULL).
        Ok(_) => unsafe { put(f, k) },
        Err(e) => e,
    })
}

// ---------------------------------------------------------------------------------------------
// Launches

macro_rules! launch_kernel {
    ($name:ident, $ptsz:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: *mut c_void,
            _gx: c_uint,
            _gy: c_uint,
            _gz: c_uint,
            _bx: c_uint,
            _by: c_uint,
            _bz: c_uint,
            _shared: c_uint,
            stream: usize,
            _params: *mut *mut c_void,
            _extra: *mut *mut c_void,
        ) -> CUresult {
            launch(f, stream, $ptsz)
        }
    };
}
launch_kernel!(cuLaunchKernel, false);
launch_kernel!(cuLaunchKernel_ptsz, true);

macro_rules! launch_cooperative {
    ($name:ident, $ptsz:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: *mut c_void,
            _gx: c_uint,
            _gy: c_uint,
            _gz: c_uint,
            _bx: c_uint,
            _by: c_uint,
            _bz: c_uint,
            _shared: c_uint,
            stream: usize,
            _params: *mut *mut c_void,
        ) -> CUresult {
            launch(f, stream, $ptsz)
        }
    };
}
launch_cooperative!(cuLaunchCooperativeKernel, false);
launch_cooperative!(cuLaunchCooperativeKernel_ptsz, true);

/// `CUlaunchConfig`
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
    pub stream: usize,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

macro_rules! launch_ex {
    ($name:ident, $ptsz:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            config: *const LaunchConfig,
            f: *mut c_void,
            _params: *mut *mut c_void,
            _extra: *mut *mut c_void,
        ) -> CUresult {
            if config.is_null() {
                return CUDA_ERROR_INVALID_VALUE;
            }
            // SAFETY: non-null config from the caller.
            let s = unsafe { (*config).stream };
            launch(f, s, $ptsz)
        }
    };
}
launch_ex!(cuLaunchKernelEx, false);
launch_ex!(cuLaunchKernelEx_ptsz, true);

// ---------------------------------------------------------------------------------------------
// Streams and synchronisation

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(s: *mut usize, _flags: c_uint) -> CUresult {
    guard(|| {
        let e = match exec() {
            Ok(e) => e,
            Err(r) => return r,
        };
        let dev = match state().and_then(current_device) {
            Ok(d) => d,
            Err(r) => return r,
        };
        let h = STREAM_BASE + NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) as usize * HANDLE_STRIDE;
        lock(&e.streams).insert(
            h,
            Stream {
                dev,
                tail: 0,
                capture: None,
                capture_mem: 0,
                host: Default::default(),
            },
        );
        // SAFETY: the caller's out-pointer (put refuses NULL).
        unsafe { put(s, h) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    s: *mut usize,
    flags: c_uint,
    _prio: c_int,
) -> CUresult {
    // SAFETY: the caller's pointers, passed on unchanged.
    unsafe { cuStreamCreate(s, flags) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(s: usize) -> CUresult {
    guard(|| match exec() {
        Ok(e) => match lock(&e.streams).remove(&s) {
            Some(_) => CUDA_SUCCESS,
            None => CUDA_ERROR_INVALID_HANDLE,
        },
        Err(r) => r,
    })
}

/// The stream's device timeline tail and the host callbacks queued on it.
fn stream_tail(s: usize, ptsz: bool) -> Result<(u64, Pending), CUresult> {
    with_stream(s, ptsz, |_, st| Ok((st.tail, st.host.clone())))
}

fn sync_stream(s: usize, ptsz: bool) -> CUresult {
    guard(|| match stream_tail(s, ptsz) {
        Ok((t, host)) => {
            timeline::sleep_until(t);
            host.wait();
            crate::pools::synchronized();
            CUDA_SUCCESS
        }
        Err(e) => e,
    })
}

fn query_stream(s: usize, ptsz: bool) -> CUresult {
    guard(|| match stream_tail(s, ptsz) {
        Ok((t, host)) if t > timeline::now_ns() || !host.ready() => CUDA_ERROR_NOT_READY,
        Ok(_) => CUDA_SUCCESS,
        Err(e) => e,
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(s: usize) -> CUresult {
    sync_stream(s, false)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize_ptsz(s: usize) -> CUresult {
    sync_stream(s, true)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery(s: usize) -> CUresult {
    query_stream(s, false)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery_ptsz(s: usize) -> CUresult {
    query_stream(s, true)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(|| {
        let e = match exec() {
            Ok(e) => e,
            Err(r) => return r,
        };
        let dev = match state().and_then(current_device) {
            Ok(d) => d,
            Err(r) => return r,
        };
        let mut host = Pending::default();
        let t = lock(&e.streams)
            .values()
            .filter(|s| s.dev == dev)
            .map(|s| {
                host.join(&s.host);
                s.tail
            })
            .max()
            .unwrap_or(0);
        timeline::sleep_until(t);
        host.wait();
        crate::pools::synchronized();
        CUDA_SUCCESS
    })
}

// ---------------------------------------------------------------------------------------------
// Events

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(ev: *mut usize, _flags: c_uint) -> CUresult {
    guard(|| {
        let e = match exec() {
            Ok(e) => e,
            Err(r) => return r,
        };
        let h = new_handle();
        lock(&e.events).insert(h, None);
        // SAFETY: the caller's out-pointer (put refuses NULL).
        unsafe { put(ev, h) }
    })
}

fn destroy_event(ev: usize) -> CUresult {
    guard(|| match exec() {
        Ok(e) => match lock(&e.events).remove(&ev) {
            Some(_) => {
                hostwork::event_destroyed(ev);
                CUDA_SUCCESS
            }
            None => CUDA_ERROR_INVALID_HANDLE,
        },
        Err(r) => r,
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy_v2(ev: usize) -> CUresult {
    destroy_event(ev)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy(ev: usize) -> CUresult {
    destroy_event(ev)
}

fn record(ev: usize, s: usize, ptsz: bool) -> CUresult {
    guard(|| {
        let r = with_stream(s, ptsz, |e, st| {
            if st.capture.is_some() {
                // an event node of the captured graph: nothing runs now
                return Ok(());
            }
            let lane = e.timeline.lane(lane_of(st.dev)?);
            let t = timeline::now_ns().max(st.tail).max(lane.busy_until());
            match lock(&e.events).get_mut(&ev) {
                Some(slot) => {
                    *slot = Some(t);
                    hostwork::recorded(ev, &st.host);
                    Ok(())
                }
                None => Err(CUDA_ERROR_INVALID_HANDLE),
            }
        });
        r.err().unwrap_or(CUDA_SUCCESS)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(ev: usize, s: usize) -> CUresult {
    record(ev, s, false)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord_ptsz(ev: usize, s: usize) -> CUresult {
    record(ev, s, true)
}

pub(crate) fn event_time(ev: usize) -> Result<Option<u64>, CUresult> {
    let e = exec()?;
    lock(&e.events)
        .get(&ev)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(ev: usize) -> CUresult {
    guard(|| match event_time(ev) {
        Ok(Some(t)) if t > timeline::now_ns() || !hostwork::of_event(ev).ready() => {
            CUDA_ERROR_NOT_READY
        }
        Ok(_) => CUDA_SUCCESS,
        Err(e) => e,
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(ev: usize) -> CUresult {
    guard(|| match event_time(ev) {
        Ok(t) => {
            timeline::sleep_until(t.unwrap_or(0));
            hostwork::of_event(ev).wait();
            crate::pools::synchronized();
            CUDA_SUCCESS
        }
        Err(e) => e,
    })
}

/// Milliseconds of device time between two completed events.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut c_float,
    start: usize,
    end: usize,
) -> CUresult {
    guard(|| {
        let (a, b) = match (event_time(start), event_time(end)) {
            (Ok(Some(a)), Ok(Some(b))) => (a, b),
            (Err(e), _) | (_, Err(e)) => return e,
            _ => return CUDA_ERROR_INVALID_HANDLE,
        };
        if a.max(b) > timeline::now_ns() {
            return CUDA_ERROR_NOT_READY;
        }
        // SAFETY: the caller's out-pointer (put refuses NULL).
        unsafe { put(ms, ((b as f64 - a as f64) / 1e6) as c_float) }
    })
}

// ---------------------------------------------------------------------------------------------
// Stream capture and graphs

fn begin_capture(s: usize, ptsz: bool) -> CUresult {
    guard(|| {
        let r = with_stream(s, ptsz, |_, st| {
            if st.capture.is_some() || s == 0 || s == 1 {
                // capturing twice, or the legacy stream: refused like the driver does
                return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            st.capture = Some(Vec::new());
            st.capture_mem = 0;
            Ok(())
        });
        r.err().unwrap_or(CUDA_SUCCESS)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_v2(s: usize, _mode: c_int) -> CUresult {
    begin_capture(s, false)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_v2_ptsz(s: usize, _mode: c_int) -> CUresult {
    begin_capture(s, true)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture(s: usize) -> CUresult {
    begin_capture(s, false)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_ptsz(s: usize) -> CUresult {
    begin_capture(s, true)
}

fn end_capture(s: usize, ptsz: bool, graph: *mut usize) -> CUresult {
    guard(|| {
        let r = with_stream(s, ptsz, |e, st| {
            let kernels = st.capture.take().ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let h = new_handle();
            graphmem::captured_graph(h, st.dev, std::mem::take(&mut st.capture_mem));
            lock(&e.graphs).insert(h, kernels);
            Ok(h)
        });
        match r {
            // SAFETY: the caller's out-pointer (put refuses NULL).
            Ok(h) => unsafe { put(graph, h) },
            Err(e) => e,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(s: usize, graph: *mut usize) -> CUresult {
    end_capture(s, false, graph)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(s: usize, graph: *mut usize) -> CUresult {
    end_capture(s, true, graph)
}

pub(crate) fn is_capturing(s: usize, ptsz: bool, status: *mut c_int) -> CUresult {
    guard(
        || match with_stream(s, ptsz, |_, st| Ok(st.capture.is_some())) {
            // SAFETY: the caller's out-pointer (put refuses NULL).
            Ok(c) => unsafe { put(status, c_int::from(c)) },
            Err(e) => e,
        },
    )
}

/// Whether stream `s` captures (graph allocations instead of memory).
pub(crate) fn capturing(s: usize, ptsz: bool) -> Result<bool, CUresult> {
    with_stream(s, ptsz, |_, st| Ok(st.capture.is_some()))
}

/// A memory node of the graph being captured on `s`: its address (lazily backed, `vram.rs`),
/// its bytes added to the graph (`graphmem.rs`).
pub(crate) fn captured_alloc(
    s: usize,
    ptsz: bool,
    dev: usize,
    bytes: u64,
) -> Result<u64, CUresult> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = crate::vram::map(bytes, libc::PROT_READ | libc::PROT_WRITE)
        .ok_or(crate::driver::CUDA_ERROR_OUT_OF_MEMORY)?;
    with_stream(s, ptsz, |_, st| {
        st.capture_mem = st.capture_mem.saturating_add(bytes);
        Ok(())
    })?;
    crate::vram::insert(p, bytes, dev, crate::vram::RegionKind::Device, 0);
    graphmem::note_address(p);
    Ok(p)
}

/// An empty graph (explicit construction: memory nodes only, `cuGraphAddMemAllocNode`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(g: *mut usize, _flags: c_uint) -> CUresult {
    guard(|| {
        let e = match exec() {
            Ok(e) => e,
            Err(r) => return r,
        };
        let h = new_handle();
        lock(&e.graphs).insert(h, Vec::new());
        // SAFETY: the caller's out-pointer (put refuses NULL).
        unsafe { put(g, h) }
    })
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS`: pool properties (88 bytes: allocation type, handle types,
/// location, ...), access descriptors, then the size and the address the node returns.
#[repr(C)]
pub struct MemAllocNodeParams {
    alloc_type: c_int,
    handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    pool_props_rest: [u8; 72],
    access: *const c_void,
    access_count: usize,
    pub bytesize: usize,
    pub dptr: u64,
}

/// A memory node: its address now, its memory when the graph launches (`graphmem.rs`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut usize,
    g: usize,
    _deps: *const usize,
    _n: usize,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    guard(|| {
        // SAFETY: the caller's node parameters (null refused).
        tri!(add_mem_alloc_node(g, unsafe { params.as_mut() }));
        // SAFETY: the caller's out-pointer (put refuses NULL).
        unsafe { put(node, new_handle()) }
    })
}

/// Add a memory node described by `params` to graph `g`; its address goes into `params.dptr`.
pub(crate) fn add_mem_alloc_node(
    g: usize,
    params: Option<&mut MemAllocNodeParams>,
) -> Result<(), CUresult> {
    graph_kernels(g)?;
    let p = params.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let st = state()?;
    let dev = p.location_id;
    if p.location_type != 1 || crate::driver::device(st, dev).is_err() || p.bytesize == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ptr = crate::vram::map(p.bytesize as u64, libc::PROT_READ | libc::PROT_WRITE)
        .ok_or(crate::driver::CUDA_ERROR_OUT_OF_MEMORY)?;
    crate::vram::insert(
        ptr,
        p.bytesize as u64,
        dev as usize,
        crate::vram::RegionKind::Device,
        0,
    );
    graphmem::note_address(ptr);
    graphmem::added_to_graph(g, dev as usize, p.bytesize as u64);
    p.dptr = ptr;
    Ok(())
}

/// A free node of one of the graph's own allocations (its memory stays with the graph).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    node: *mut usize,
    g: usize,
    _deps: *const usize,
    _n: usize,
    dptr: u64,
) -> CUresult {
    guard(|| {
        tri!(add_mem_free_node(g, dptr));
        // SAFETY: the caller's out-pointer (put refuses NULL).
        unsafe { put(node, new_handle()) }
    })
}

/// Check a free node of `dptr` may join graph `g` (one of the graph allocations).
pub(crate) fn add_mem_free_node(g: usize, dptr: u64) -> Result<(), CUresult> {
    graph_kernels(g)?;
    if graphmem::is_graph_address(dptr) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// The nodes of a graph: one per kernel (handles are the graph's own, numbered).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetNodes(g: usize, nodes: *mut usize, n: *mut usize) -> CUresult {
    guard(|| {
        let k = match graph_kernels(g) {
            Ok(k) => k,
            Err(e) => return e,
        };
        if n.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: `n` checked non-null; `nodes`, when given, holds `*n` slots (caller contract).
        unsafe {
            if !nodes.is_null() {
                for i in 0..(*n).min(k.len()) {
                    *nodes.add(i) = g + 1 + i;
                }
            }
            *n = k.len();
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(s: usize, status: *mut c_int) -> CUresult {
    is_capturing(s, false, status)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(s: usize, status: *mut c_int) -> CUresult {
    is_capturing(s, true, status)
}

pub(crate) fn graph_kernels(g: usize) -> Result<Vec<u64>, CUresult> {
    let e = exec()?;
    lock(&e.graphs)
        .get(&g)
        .cloned()
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// A new graph (or instantiation) handle holding `kernels`.
pub(crate) fn new_graph(kernels: Vec<u64>) -> Result<usize, CUresult> {
    let e = exec()?;
    let h = new_handle();
    lock(&e.graphs).insert(h, kernels);
    Ok(h)
}

/// Append `kernels` to graph `g`, or replace what it holds (`replace`).
pub(crate) fn graph_set(g: usize, kernels: &[u64], replace: bool) -> Result<(), CUresult> {
    let e = exec()?;
    let mut m = lock(&e.graphs);
    let k = m.get_mut(&g).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if replace {
        k.clear();
    }
    k.extend_from_slice(kernels);
    Ok(())
}

/// Instantiate `graph`: its kernels and its memory (`graphmem`).
pub(crate) fn instantiate(graph: usize) -> Result<usize, CUresult> {
    let h = new_graph(graph_kernels(graph)?)?;
    graphmem::instantiated(h, graph);
    Ok(h)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec_out: *mut usize,
    graph: usize,
    _flags: u64,
) -> CUresult {
    guard(|| {
        let h = tri!(instantiate(graph));
        // SAFETY: the caller's out-pointer (put refuses NULL).
        unsafe { put(exec_out, h) }
    })
}

pub(crate) fn destroy_graph(g: usize) -> CUresult {
    graphmem::destroyed(g);
    guard(|| match exec() {
        Ok(e) => match lock(&e.graphs).remove(&g) {
            Some(_) => CUDA_SUCCESS,
            None => CUDA_ERROR_INVALID_HANDLE,
        },
        Err(r) => r,
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphDestroy(g: usize) -> CUresult {
    destroy_graph(g)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecDestroy(g: usize) -> CUresult {
    destroy_graph(g)
}

fn graph_launch(g: usize, s: usize, ptsz: bool) -> CUresult {
    guard(|| match graph_kernels(g) {
        Ok(k) => match graphmem::launching(g) {
            Ok(()) => enqueue(s, ptsz, &k),
            Err(e) => e,
        },
        Err(e) => e,
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch(g: usize, s: usize) -> CUresult {
    graph_launch(g, s, false)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch_ptsz(g: usize, s: usize) -> CUresult {
    graph_launch(g, s, true)
}

/// This module's exports for `cuGetProcAddress`.
pub fn exports() -> Vec<(&'static str, usize)> {
    crate::driver::table!(
        cuModuleLoadData,
        cuModuleLoadDataEx,
        cuModuleLoad,
        cuModuleUnload,
        cuModuleGetFunction,
        cuLibraryLoadData,
        cuLibraryLoadFromFile,
        cuLibraryUnload,
        cuLibraryGetKernel,
        cuKernelGetFunction,
        cuKernelGetLibrary,
        cuLaunchKernel,
        cuLaunchKernel_ptsz,
        cuLaunchCooperativeKernel,
        cuLaunchCooperativeKernel_ptsz,
        cuLaunchKernelEx,
        cuLaunchKernelEx_ptsz,
        cuStreamCreate,
        cuStreamCreateWithPriority,
        cuStreamDestroy_v2,
        cuStreamSynchronize,
        cuStreamSynchronize_ptsz,
        cuStreamQuery,
        cuStreamQuery_ptsz,
        cuCtxSynchronize,
        cuEventCreate,
        cuEventDestroy,
        cuEventDestroy_v2,
        cuEventRecord,
        cuEventRecord_ptsz,
        cuEventQuery,
        cuEventSynchronize,
        cuEventElapsedTime,
        cuStreamBeginCapture,
        cuStreamBeginCapture_ptsz,
        cuStreamBeginCapture_v2,
        cuStreamBeginCapture_v2_ptsz,
        cuStreamEndCapture,
        cuStreamEndCapture_ptsz,
        cuStreamIsCapturing,
        cuStreamIsCapturing_ptsz,
        cuGraphInstantiateWithFlags,
        cuGraphDestroy,
        cuGraphExecDestroy,
        cuGraphLaunch,
        cuGraphLaunch_ptsz,
        cuGraphGetNodes,
        cuGraphCreate,
        cuGraphAddMemAllocNode,
        cuGraphAddMemFreeNode,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_names() {
        assert_eq!(spin_ns("gpufence_spin_1000us"), 1_000_000);
        assert_eq!(spin_ns("gpufence_spin_7us"), 7000);
        assert_eq!(spin_ns("gpufence_spin_us"), 0);
        assert_eq!(spin_ns("matmul"), 0);
    }

    #[test]
    fn stream_keys() {
        assert_eq!(stream_key(0, true, 1), stream_key(PER_THREAD, false, 1));
        assert_ne!(stream_key(0, false, 0), stream_key(0, false, 1));
        assert_eq!(stream_key(STREAM_BASE + 16, false, 3), STREAM_BASE + 16);
    }

    #[test]
    fn kernel_handles() {
        let h = new_kernel(c"gpufence_spin_250us".as_ptr()).unwrap();
        assert_eq!(kernel_ns(h as *mut c_void), Ok(250_000));
        assert_eq!(
            kernel_ns((h + 1) as *mut c_void),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
        assert_eq!(
            kernel_ns(std::ptr::null_mut()),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
    }
}
