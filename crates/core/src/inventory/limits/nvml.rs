//! NVML's memory-limit calls (R615+), behind a small trait with a recording fake.
//!
//! nvml-wrapper does not bind these yet, so the library is opened with `dlopen` and the five
//! symbols used here resolved by name. Layouts are nvml.h's (no version field; the `_v1` in the
//! function name is the version):
//!
//! ```c
//! typedef struct { const char *nameSpace; unsigned long long softLimit; unsigned long long hardLimit; } nvmlSetMemoryLimits_v1_t;
//! typedef struct { const char *nameSpace; unsigned long long softLimit; unsigned long long hardLimit;
//!                  unsigned long long currentUsed; } nvmlGetMemoryLimits_v1_t;
//! nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t, nvmlSetMemoryLimits_v1_t *);
//! nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t, nvmlGetMemoryLimits_v1_t *);
//! ```
//! Clearing is soft 0, hard `NVML_DEVICE_MEMORY_LIMIT_MAX` (all ones).

use std::ffi::{CStr, CString, c_char, c_int, c_void};

/// `NVML_DEVICE_MEMORY_LIMIT_MAX`: no hard limit.
pub const LIMIT_MAX: u64 = u64::MAX;

#[repr(C)]
pub struct SetMemoryLimitsV1 {
    pub name_space: *const c_char,
    pub soft_limit: u64,
    pub hard_limit: u64,
}

#[repr(C)]
pub struct GetMemoryLimitsV1 {
    pub name_space: *const c_char,
    pub soft_limit: u64,
    pub hard_limit: u64,
    pub current_used: u64,
}

/// Limits and usage of one cgroup on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub soft: u64,
    pub hard: u64,
    pub used: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlCallError {
    #[error("NVML {library}: {message}")]
    Load { library: String, message: String },
    #[error("NVML {call} on {uuid}: {message} (NVML error {code})")]
    Call {
        call: &'static str,
        uuid: String,
        code: i32,
        message: String,
    },
}

/// Setting and reading per-cgroup memory limits of a GPU.
pub trait MemoryLimits {
    fn set(
        &mut self,
        uuid: &str,
        namespace: &str,
        soft: u64,
        hard: u64,
    ) -> Result<(), NvmlCallError>;
    fn get(&mut self, uuid: &str, namespace: &str) -> Result<Limits, NvmlCallError>;
    /// Remove the limits (soft 0, hard max).
    fn clear(&mut self, uuid: &str, namespace: &str) -> Result<(), NvmlCallError> {
        self.set(uuid, namespace, 0, LIMIT_MAX)
    }
}

type Device = *mut c_void;
type InitFn = unsafe extern "C" fn() -> c_int;
type ByUuidFn = unsafe extern "C" fn(*const c_char, *mut Device) -> c_int;
type SetFn = unsafe extern "C" fn(Device, *mut SetMemoryLimitsV1) -> c_int;
type GetFn = unsafe extern "C" fn(Device, *mut GetMemoryLimitsV1) -> c_int;
type ErrFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// The node's NVML, initialised (shut down on drop).
pub struct Nvml {
    by_uuid: ByUuidFn,
    set_fn: SetFn,
    get_fn: GetFn,
    err_fn: ErrFn,
    shutdown: InitFn,
}

fn sym<T>(lib: *mut c_void, name: &str, library: &str) -> Result<T, NvmlCallError> {
    let c = CString::new(name).expect("symbol names have no NUL");
    // SAFETY: lib is a live dlopen handle; c is a NUL-terminated name.
    let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
    if p.is_null() {
        return Err(NvmlCallError::Load {
            library: library.to_string(),
            message: format!("no {name} (driver older than R615?)"),
        });
    }
    // SAFETY: T is a function pointer type of the symbol's C signature (see the module docs);
    // both are pointer-sized.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

impl Nvml {
    /// `dlopen` the library and `nvmlInit_v2`.
    pub fn open(library: &str) -> Result<Nvml, NvmlCallError> {
        let load = |message: String| NvmlCallError::Load {
            library: library.to_string(),
            message,
        };
        let c = CString::new(library).map_err(|_| load("NUL in the library name".into()))?;
        // SAFETY: c is a NUL-terminated path; the handle is never closed (NVML stays loaded for
        // the process's life, as nvml-wrapper leaves it).
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            // SAFETY: dlerror returns a thread-local message or NULL.
            let e = unsafe { libc::dlerror() };
            let msg = if e.is_null() {
                "dlopen failed".to_string()
            } else {
                // SAFETY: non-NULL dlerror strings are NUL-terminated.
                unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
            };
            return Err(load(msg));
        }
        let init: InitFn = sym(lib, "nvmlInit_v2", library)?;
        let n = Nvml {
            by_uuid: sym(lib, "nvmlDeviceGetHandleByUUID", library)?,
            set_fn: sym(lib, "nvmlDeviceSetMemoryLimits_v1", library)?,
            get_fn: sym(lib, "nvmlDeviceGetMemoryLimits_v1", library)?,
            err_fn: sym(lib, "nvmlErrorString", library)?,
            shutdown: sym(lib, "nvmlShutdown", library)?,
        };
        // SAFETY: nvmlInit_v2 takes no arguments.
        let r = unsafe { init() };
        if r != 0 {
            return Err(load(format!("nvmlInit_v2: error {r}")));
        }
        Ok(n)
    }

    fn err(&self, call: &'static str, uuid: &str, code: c_int) -> NvmlCallError {
        // SAFETY: nvmlErrorString returns a static NUL-terminated string (or NULL).
        let p = unsafe { (self.err_fn)(code) };
        let message = if p.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: see above.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        NvmlCallError::Call {
            call,
            uuid: uuid.to_string(),
            code,
            message,
        }
    }

    fn device(&self, uuid: &str) -> Result<Device, NvmlCallError> {
        let c = CString::new(uuid).map_err(|_| self.err("nvmlDeviceGetHandleByUUID", uuid, 2))?;
        let mut d: Device = std::ptr::null_mut();
        // SAFETY: c is NUL-terminated; d is a valid out-pointer.
        let r = unsafe { (self.by_uuid)(c.as_ptr(), &mut d) };
        if r != 0 {
            return Err(self.err("nvmlDeviceGetHandleByUUID", uuid, r));
        }
        Ok(d)
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: balances the nvmlInit_v2 of `open`.
        unsafe { (self.shutdown)() };
    }
}

impl Nvml {
    /// Resolve the device, build the nameSpace string, run `f(device, nameSpace)` (one NVML
    /// call), and map its return code.
    fn call(
        &self,
        name: &'static str,
        uuid: &str,
        namespace: &str,
        f: impl FnOnce(Device, *const c_char) -> c_int,
    ) -> Result<(), NvmlCallError> {
        let d = self.device(uuid)?;
        let ns = CString::new(namespace).map_err(|_| self.err(name, uuid, 2))?;
        match f(d, ns.as_ptr()) {
            0 => Ok(()),
            r => Err(self.err(name, uuid, r)),
        }
    }
}

impl MemoryLimits for Nvml {
    fn set(
        &mut self,
        uuid: &str,
        namespace: &str,
        soft: u64,
        hard: u64,
    ) -> Result<(), NvmlCallError> {
        let set_fn = self.set_fn;
        self.call("nvmlDeviceSetMemoryLimits_v1", uuid, namespace, |d, ns| {
            let mut l = SetMemoryLimitsV1 {
                name_space: ns,
                soft_limit: soft,
                hard_limit: hard,
            };
            // SAFETY: d is a handle from NVML; l is a live struct whose nameSpace outlives the
            // call.
            unsafe { set_fn(d, &mut l) }
        })
    }

    fn get(&mut self, uuid: &str, namespace: &str) -> Result<Limits, NvmlCallError> {
        let get_fn = self.get_fn;
        let mut out = GetMemoryLimitsV1 {
            name_space: std::ptr::null(),
            soft_limit: 0,
            hard_limit: 0,
            current_used: 0,
        };
        self.call("nvmlDeviceGetMemoryLimits_v1", uuid, namespace, |d, ns| {
            out.name_space = ns;
            // SAFETY: as in `set`.
            unsafe { get_fn(d, &mut out) }
        })?;
        Ok(Limits {
            soft: out.soft_limit,
            hard: out.hard_limit,
            used: out.current_used,
        })
    }
}

/// A recording fake: every call is appended to `calls`; `fail_on` makes the call on that UUID
/// fail.
#[derive(Debug, Default)]
pub struct Recording {
    pub calls: Vec<(String, String, u64, u64)>,
    pub fail_on: Option<String>,
}

impl MemoryLimits for Recording {
    fn set(
        &mut self,
        uuid: &str,
        namespace: &str,
        soft: u64,
        hard: u64,
    ) -> Result<(), NvmlCallError> {
        if self.fail_on.as_deref() == Some(uuid) && hard != LIMIT_MAX {
            return Err(NvmlCallError::Call {
                call: "nvmlDeviceSetMemoryLimits_v1",
                uuid: uuid.to_string(),
                code: 4,
                message: "Insufficient Permissions".into(),
            });
        }
        self.calls
            .push((uuid.to_string(), namespace.to_string(), soft, hard));
        Ok(())
    }
    fn get(&mut self, _uuid: &str, _namespace: &str) -> Result<Limits, NvmlCallError> {
        Ok(Limits {
            soft: 0,
            hard: LIMIT_MAX,
            used: 0,
        })
    }
}

const _: () = assert!(std::mem::size_of::<SetMemoryLimitsV1>() == 24);
const _: () = assert!(std::mem::size_of::<GetMemoryLimitsV1>() == 32);
