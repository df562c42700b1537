//! `nvmlDeviceSetMemoryLimits_v1` / `nvmlDeviceGetMemoryLimits_v1` (NVML R615) of the simulated
//! driver. Struct layouts are nvml.h's (`nvmlSetMemoryLimits_v1_t`: nameSpace pointer, soft and
//! hard limit; `nvmlGetMemoryLimits_v1_t`: the same plus currentUsed; no version field, 24 and 32
//! bytes). `nameSpace` is the full sysfs path of a cgroup v2 directory; it is kept node-wide by
//! its path inside the hierarchy (`gpufence_mock_node::memlimits`), where the mock CUDA of the
//! cgroup's processes charges against it.
//!
//! Errors as the real library documents them: `NOT_SUPPORTED` when the node file has no
//! `memory_limits_dir` (a driver before R615) or for a MIG handle, `NO_PERMISSION` for a
//! non-root caller of the setter, `INVALID_ARGUMENT` for a null struct or a nameSpace that is not
//! a directory of the host's cgroup2 hierarchy (clearing the limits of a removed cgroup is
//! accepted: the driver drops a cgroup's limits with the cgroup).

use std::ffi::{CStr, c_char};
use std::path::{Path, PathBuf};

use gpufence_mock_node::memlimits;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use super::{NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED, NVML_SUCCESS, with_device};

pub const NVML_ERROR_NO_PERMISSION: nvmlReturn_t = 4;
/// `NVML_DEVICE_MEMORY_LIMIT_MAX`.
pub const LIMIT_MAX: u64 = u64::MAX;

#[repr(C)]
pub struct nvmlSetMemoryLimits_v1_t {
    pub nameSpace: *const c_char,
    pub softLimit: u64,
    pub hardLimit: u64,
}

#[repr(C)]
pub struct nvmlGetMemoryLimits_v1_t {
    pub nameSpace: *const c_char,
    pub softLimit: u64,
    pub hardLimit: u64,
    pub currentUsed: u64,
}

const _: () = assert!(std::mem::size_of::<nvmlSetMemoryLimits_v1_t>() == 24);
const _: () = assert!(std::mem::size_of::<nvmlGetMemoryLimits_v1_t>() == 32);

/// The host's cgroup2 mount point (from this process's mountinfo).
fn cgroup2_root() -> Option<PathBuf> {
    let t = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    t.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let dash = f.iter().position(|x| *x == "-")?;
        (f.get(dash + 1) == Some(&"cgroup2")).then(|| PathBuf::from(f[4]))
    })
}

/// The cgroup path (inside the v2 hierarchy) of a sysfs `nameSpace`.
fn cgroup_of(ns: *const c_char, must_exist: bool) -> Option<String> {
    if ns.is_null() {
        return None;
    }
    // SAFETY: non-null NUL-terminated string from the caller.
    let ns = unsafe { CStr::from_ptr(ns) }.to_str().ok()?;
    let root = cgroup2_root()?;
    let rel = Path::new(ns).strip_prefix(&root).ok()?;
    if rel
        .components()
        .any(|c| c == std::path::Component::ParentDir)
        || (must_exist && !Path::new(ns).is_dir())
    {
        return None;
    }
    Some(
        format!("/{}", rel.display())
            .trim_end_matches('/')
            .to_string(),
    )
    .map(|p| if p.is_empty() { "/".to_string() } else { p })
}

fn limits_dir(s: &super::State) -> Option<PathBuf> {
    s.node.memory_limits_dir.as_ref().map(PathBuf::from)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMemoryLimits_v1(
    d: nvmlDevice_t,
    limits: *mut nvmlSetMemoryLimits_v1_t,
) -> nvmlReturn_t {
    with_device(d, |s, g, m| {
        let Some(dir) = limits_dir(s) else {
            return NVML_ERROR_NOT_SUPPORTED;
        };
        if m.is_some() {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        if limits.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return NVML_ERROR_NO_PERMISSION;
        }
        // SAFETY: non-null pointer to the caller's struct.
        let l = unsafe { &*limits };
        // Clearing the limits of a cgroup that is already gone is accepted (its limits went
        // with it); setting needs the cgroup.
        let clearing = l.softLimit == 0 && l.hardLimit == LIMIT_MAX;
        let Some(cg) = cgroup_of(l.nameSpace, !clearing) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        if l.softLimit > l.hardLimit {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        match memlimits::set_limit(&dir, &cg, &g.uuid, l.softLimit, l.hardLimit) {
            Ok(()) => NVML_SUCCESS,
            Err(_) => super::NVML_ERROR_UNKNOWN,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryLimits_v1(
    d: nvmlDevice_t,
    limits: *mut nvmlGetMemoryLimits_v1_t,
) -> nvmlReturn_t {
    with_device(d, |s, g, m| {
        let Some(dir) = limits_dir(s) else {
            return NVML_ERROR_NOT_SUPPORTED;
        };
        if m.is_some() {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        if limits.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null pointer to the caller's struct.
        let l = unsafe { &mut *limits };
        let Some(cg) = cgroup_of(l.nameSpace, true) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        let (soft, hard) = memlimits::get_limit(&dir, &cg, &g.uuid).unwrap_or((0, LIMIT_MAX));
        l.softLimit = soft;
        l.hardLimit = hard;
        l.currentUsed = memlimits::used(&dir, &cg, &g.uuid);
        NVML_SUCCESS
    })
}
