//! `nvidia-smi` of the simulated node: lists each visible GPU with its memory, read through NVML.
//!
//! NVML is loaded with `dlopen("libnvidia-ml.so.1")` and every entry point is resolved with
//! `dlsym`, as CUDA applications and the real tools do, so an `LD_PRELOAD`ed interception shim
//! that hooks `dlsym` sees (and may virtualise) `nvmlDeviceGetMemoryInfo_v2`.
//!
//! Output, one line per GPU (plus a header):
//! `GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-…) memory.total=81559MiB memory.used=0MiB memory.free=81559MiB`
//! Exit 9 (as the real tool) when NVML cannot be loaded or initialised.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

#[repr(C)]
#[derive(Default)]
struct MemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

type Device = *mut c_void;

fn fail(msg: &str) -> ! {
    eprintln!(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver: {msg}"
    );
    std::process::exit(9)
}

unsafe fn sym<T>(lib: *mut c_void, name: &CStr) -> T {
    // SAFETY: lib is a live dlopen handle; name is NUL-terminated.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        fail(&format!("missing symbol {}", name.to_string_lossy()));
    }
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: T is the function-pointer type of this NVML entry point.
    unsafe { std::mem::transmute_copy(&p) }
}

fn main() {
    // SAFETY: plain FFI calls into libdl/NVML with valid arguments.
    unsafe {
        let lib = libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW);
        if lib.is_null() {
            let e = libc::dlerror();
            let msg = if e.is_null() {
                "dlopen failed".to_string()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            };
            fail(&msg);
        }
        let init: unsafe extern "C" fn() -> c_int = sym(lib, c"nvmlInit_v2");
        let shutdown: unsafe extern "C" fn() -> c_int = sym(lib, c"nvmlShutdown");
        let err: unsafe extern "C" fn(c_int) -> *const c_char = sym(lib, c"nvmlErrorString");
        let driver: unsafe extern "C" fn(*mut c_char, c_uint) -> c_int =
            sym(lib, c"nvmlSystemGetDriverVersion");
        let count: unsafe extern "C" fn(*mut c_uint) -> c_int = sym(lib, c"nvmlDeviceGetCount_v2");
        let by_index: unsafe extern "C" fn(c_uint, *mut Device) -> c_int =
            sym(lib, c"nvmlDeviceGetHandleByIndex_v2");
        let name: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int =
            sym(lib, c"nvmlDeviceGetName");
        let uuid: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int =
            sym(lib, c"nvmlDeviceGetUUID");
        let meminfo: unsafe extern "C" fn(Device, *mut MemoryV2) -> c_int =
            sym(lib, c"nvmlDeviceGetMemoryInfo_v2");

        let check = |what: &str, r: c_int| {
            if r != 0 {
                let s = CStr::from_ptr(err(r)).to_string_lossy().into_owned();
                fail(&format!("{what}: {s}"));
            }
        };
        check("nvmlInit_v2", init());
        let mut buf = [0 as c_char; 96];
        check("nvmlSystemGetDriverVersion", driver(buf.as_mut_ptr(), 96));
        println!(
            "Driver Version: {}",
            CStr::from_ptr(buf.as_ptr()).to_string_lossy()
        );
        let mut n: c_uint = 0;
        check("nvmlDeviceGetCount_v2", count(&mut n));
        if n == 0 {
            println!("No devices were found");
        }
        for i in 0..n {
            let mut d: Device = std::ptr::null_mut();
            check("nvmlDeviceGetHandleByIndex_v2", by_index(i, &mut d));
            let mut nb = [0 as c_char; 96];
            check("nvmlDeviceGetName", name(d, nb.as_mut_ptr(), 96));
            let mut ub = [0 as c_char; 96];
            check("nvmlDeviceGetUUID", uuid(d, ub.as_mut_ptr(), 96));
            let mut m = MemoryV2 {
                version: (std::mem::size_of::<MemoryV2>() as c_uint) | (2 << 24),
                ..Default::default()
            };
            check("nvmlDeviceGetMemoryInfo_v2", meminfo(d, &mut m));
            println!(
                "GPU {i}: {} (UUID: {}) memory.total={}MiB memory.used={}MiB memory.free={}MiB",
                CStr::from_ptr(nb.as_ptr()).to_string_lossy(),
                CStr::from_ptr(ub.as_ptr()).to_string_lossy(),
                m.total >> 20,
                m.used >> 20,
                m.free >> 20
            );
        }
        shutdown();
    }
}
