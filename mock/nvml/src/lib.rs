//! Mock NVML (`libnvidia-ml.so.1`) driven by the simulated node description
//! (`GPUFENCE_MOCK_NODE`, see `gpufence-mock-node`).
//!
//! Every function the gpufence inventory, nvml-wrapper's init/drop and the simulated `nvidia-smi`
//! call is exported with NVML's C signature and struct layouts (taken from `nvml-wrapper-sys`, the
//! bindgen output of `nvml.h`), and returns the error codes the real library returns:
//! `NVML_ERROR_UNINITIALIZED` before `nvmlInit`, `NVML_ERROR_INVALID_ARGUMENT` for a bad index,
//! handle or null pointer, `NVML_ERROR_INSUFFICIENT_SIZE` for a short buffer,
//! `NVML_ERROR_NOT_SUPPORTED` for MIG queries on a GPU without MIG, `NVML_ERROR_NOT_FOUND` for an
//! unpopulated MIG slot.
//!
//! `nvmlInit*` reads the node file; a file that is missing gives `NVML_ERROR_DRIVER_NOT_LOADED`,
//! one that does not parse gives `NVML_ERROR_UNKNOWN` (the reason is in `GPUFENCE_MOCK_NVML_DEBUG`
//! output only, so the caller's error stays one line).
//!
//! Device handles are opaque non-dereferenceable values encoding (visible GPU position, MIG slot).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint};

use gpufence_mock_node::MigMode;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlPciInfo_t, nvmlReturn_t,
};

/// `nvmlMemory_v2` struct version (`NVML_STRUCT_VERSION(Memory, 2)`).
pub const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

/// Maximum MIG devices per GPU reported by `nvmlDeviceGetMaxMigDeviceCount` (H100/A100: 7).
const MAX_MIG: usize = 7;

mod links;
mod memlimits;
mod state;
pub mod util;

use state::{Handle, STATE, State, decode, encode, with_device, with_state};
pub use state::{
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_UNINITIALIZED, NVML_ERROR_UNKNOWN, NVML_SUCCESS,
};

fn debug(msg: &str) {
    if std::env::var_os("GPUFENCE_MOCK_NVML_DEBUG").is_some() {
        eprintln!("mock-nvml: {msg}");
    }
}

fn init() -> nvmlReturn_t {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = st.as_mut() {
        s.refs += 1;
        return NVML_SUCCESS;
    }
    let path = match gpufence_mock_node::locate(init as *const libc::c_void) {
        Some(p) => p,
        None => {
            debug("no node file");
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            debug(&format!("{}: {e}", path.display()));
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
    };
    let node = match gpufence_mock_node::parse(&text) {
        Ok(n) => n,
        Err(e) => {
            debug(&format!("{}: {e}", path.display()));
            return NVML_ERROR_UNKNOWN;
        }
    };
    util::open(&path, node.timeline.as_deref());
    let visible_refs = node.visible_gpus();
    let visible = visible_refs
        .iter()
        .filter_map(|v| node.gpus.iter().position(|g| std::ptr::eq(g, *v)))
        .collect();
    *st = Some(State {
        node,
        visible,
        refs: 1,
    });
    NVML_SUCCESS
}

/// Copy `s` with its NUL into a caller buffer of `len` bytes.
unsafe fn write_str(s: &str, buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    if buf.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let b = s.as_bytes();
    if b.len() + 1 > len as usize {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller promises `len` writable bytes at `buf`; we checked b.len()+1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(b.as_ptr().cast::<c_char>(), buf, b.len());
        *buf.add(b.len()) = 0;
    }
    NVML_SUCCESS
}

fn mig_name(gpu: &gpufence_mock_node::Gpu, mig: &gpufence_mock_node::Mig) -> String {
    format!("{} MIG {}", gpu.name, mig.profile)
}

// ---- init / shutdown / errors -------------------------------------------------------------

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    match st.as_mut() {
        None => NVML_ERROR_UNINITIALIZED,
        Some(s) => {
            s.refs -= 1;
            if s.refs == 0 {
                *st = None;
            }
            NVML_SUCCESS
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static std::ffi::CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        25 => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

// ---- system ---------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the NVML contract gives `version` `length` writable bytes (or null, which write_str
    // rejects); write_str checks the length before copying.
    with_state(|s| unsafe { write_str(&s.node.driver_version, version, length) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // NVML's own version is "12.<driver version>".
    // SAFETY: the NVML contract gives `version` `length` writable bytes (or null, which write_str
    // rejects); write_str checks the length before copying.
    with_state(|s| unsafe {
        write_str(
            &format!("{}.{}", s.node.cuda_version() / 1000, s.node.driver_version),
            version,
            length,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    // SAFETY: the same contract as the _v2 entry point: `v` is null (rejected there) or a valid
    // out-pointer from the caller.
    unsafe { nvmlSystemGetCudaDriverVersion_v2(v) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    if v.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_state(|s| {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { *v = s.node.cuda_version() };
        NVML_SUCCESS
    })
}

// ---- device enumeration ---------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_state(|s| {
        // SAFETY: non-null out-pointer.
        unsafe { *count = s.visible.len() as c_uint };
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the same contract as the _v2 entry point: `count` is null (rejected there) or a valid
    // out-pointer from the caller.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    if device.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_state(|s| {
        if index as usize >= s.visible.len() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null out-pointer.
        unsafe { *device = encode(Handle::Gpu(index as usize)) };
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the same contract as the _v2 entry point: `device` is null (rejected there) or a
    // valid out-pointer from the caller.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

unsafe fn find_handle(
    key: *const c_char,
    device: *mut nvmlDevice_t,
    pick: impl Fn(&State, &str) -> Option<Handle>,
) -> nvmlReturn_t {
    if key.is_null() || device.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: NUL-terminated string from the caller.
    let Ok(k) = unsafe { std::ffi::CStr::from_ptr(key) }.to_str() else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    with_state(|s| match pick(s, k) {
        Some(h) => {
            // SAFETY: non-null out-pointer.
            unsafe { *device = encode(h) };
            NVML_SUCCESS
        }
        None => NVML_ERROR_NOT_FOUND,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract: `uuid` is a NUL-terminated string and `device` an out-pointer;
    // find_handle rejects nulls.
    unsafe {
        find_handle(uuid, device, |s, k| {
            s.visible.iter().enumerate().find_map(|(p, &i)| {
                let g = &s.node.gpus[i];
                if g.uuid.eq_ignore_ascii_case(k) {
                    return Some(Handle::Gpu(p));
                }
                if g.mig_mode() != MigMode::Enabled {
                    return None;
                }
                g.mig
                    .iter()
                    .position(|m| m.uuid.eq_ignore_ascii_case(k))
                    .map(|m| Handle::Mig(p, m))
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract: `bus_id` is a NUL-terminated string and `device` an out-pointer;
    // find_handle rejects nulls.
    unsafe {
        find_handle(bus_id, device, |s, k| {
            s.visible
                .iter()
                .position(|&i| pci_eq(&s.node.gpus[i].pci_bus_id, k))
                .map(Handle::Gpu)
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: identical contract to the _v2 entry point, which rejects null pointers.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus_id, device) }
}

/// PCI bus ids compare case-insensitively, with a 4- or 8-hex-digit domain.
fn pci_eq(a: &str, b: &str) -> bool {
    fn norm(s: &str) -> String {
        let s = s.to_ascii_lowercase();
        match s.split_once(':') {
            Some((dom, rest)) => format!("{:0>8}:{rest}", dom.trim_start_matches('0')),
            None => s,
        }
    }
    norm(a) == norm(b)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(d: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    if index.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, _, mig| {
        if mig.is_some() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let Some(Handle::Gpu(p)) = decode(d) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        // SAFETY: non-null out-pointer.
        unsafe { *index = p as c_uint };
        NVML_SUCCESS
    })
}

// ---- device attributes ----------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    d: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the NVML contract gives `uuid` `length` writable bytes (or null, which write_str
    // rejects); write_str checks the length before copying.
    with_device(d, |_, g, m| unsafe {
        write_str(m.map_or(&g.uuid, |m| &m.uuid), uuid, length)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    d: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_device(d, |_, g, m| {
        let n = m.map_or_else(|| g.name.clone(), |m| mig_name(g, m));
        // SAFETY: the NVML contract gives `name` `length` writable bytes (or null, which write_str
        // rejects); write_str checks the length before copying.
        unsafe { write_str(&n, name, length) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    d: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    if minor.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, g, m| {
        if m.is_some() {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        // SAFETY: non-null out-pointer.
        unsafe { *minor = g.minor };
        NVML_SUCCESS
    })
}

fn memory_of(g: &gpufence_mock_node::Gpu, m: Option<&gpufence_mock_node::Mig>) -> u64 {
    m.map_or_else(|| g.memory_bytes(), |m| m.memory_bytes())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    d: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    if memory.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, g, m| {
        let total = memory_of(g, m);
        // SAFETY: non-null out-pointer to the v1 struct.
        unsafe {
            *memory = nvmlMemory_t {
                total,
                free: total,
                used: 0,
            }
        };
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    d: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    if memory.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null pointer to a caller-owned struct; its version field is an input.
    let version = unsafe { (*memory).version };
    // nvml-wrapper zero-initialises and leaves version 0; the real library accepts it too.
    if version != 0 && version != NVML_MEMORY_V2 {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    with_device(d, |_, g, m| {
        let total = memory_of(g, m);
        // SAFETY: non-null out-pointer to the v2 struct.
        unsafe {
            *memory = nvmlMemory_v2_t {
                version: NVML_MEMORY_V2,
                total,
                reserved: 0,
                free: total,
                used: 0,
            }
        };
        NVML_SUCCESS
    })
}

/// Parse `DDDDDDDD:BB:DD.F`.
fn parse_bus_id(s: &str) -> (u32, u32, u32) {
    let mut it = s.split([':', '.']);
    let dom = it.next().and_then(|x| u32::from_str_radix(x, 16).ok());
    let bus = it.next().and_then(|x| u32::from_str_radix(x, 16).ok());
    let dev = it.next().and_then(|x| u32::from_str_radix(x, 16).ok());
    (dom.unwrap_or(0), bus.unwrap_or(0), dev.unwrap_or(0))
}

fn fill_c(dst: &mut [c_char], s: &str) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    d: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    if pci.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, g, _| {
        let (domain, bus, device) = parse_bus_id(&g.pci_bus_id);
        // SAFETY: nvmlPciInfo_t is plain old data.
        let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
        info.domain = domain;
        info.bus = bus;
        info.device = device;
        info.pciDeviceId = 0x2330_10de; // H100 SXM5 80GB, vendor 10de
        info.pciSubSystemId = 0x16c1_10de;
        fill_c(&mut info.busId, &g.pci_bus_id);
        fill_c(
            &mut info.busIdLegacy,
            &format!("{:04x}:{bus:02x}:{device:02x}.0", domain & 0xffff),
        );
        // SAFETY: non-null out-pointer.
        unsafe { *pci = info };
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    d: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    // SAFETY: nvmlPciInfo_t is the same struct for _v2 and _v3; `pci` is null (rejected there) or a
    // valid out-pointer from the caller.
    unsafe { nvmlDeviceGetPciInfo_v3(d, pci) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    d: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    if major.is_null() || minor.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, g, _| {
        // SAFETY: non-null out-pointers.
        unsafe {
            *major = g.compute_capability[0];
            *minor = g.compute_capability[1];
        }
        NVML_SUCCESS
    })
}

// ---- MIG ------------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    d: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    if current.is_null() || pending.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, g, m| {
        if m.is_some() {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let mode = match g.mig_mode() {
            MigMode::Unsupported => return NVML_ERROR_NOT_SUPPORTED,
            MigMode::Enabled => 1,
            MigMode::Disabled => 0,
        };
        // SAFETY: non-null out-pointers.
        unsafe {
            *current = mode;
            *pending = mode;
        }
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    d: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, g, m| {
        if m.is_some() || g.mig_mode() == MigMode::Unsupported {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        // SAFETY: non-null out-pointer.
        unsafe { *count = MAX_MIG.max(g.mig.len()) as c_uint };
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    d: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    if mig.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let Some(Handle::Gpu(p)) = decode(d) else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    with_device(d, |_, g, _| {
        match g.mig_mode() {
            MigMode::Unsupported => return NVML_ERROR_NOT_SUPPORTED,
            MigMode::Disabled => return NVML_ERROR_INVALID_ARGUMENT,
            MigMode::Enabled => {}
        }
        let i = index as usize;
        if i >= MAX_MIG.max(g.mig.len()) {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if i >= g.mig.len() {
            return NVML_ERROR_NOT_FOUND;
        }
        // SAFETY: non-null out-pointer.
        unsafe { *mig = encode(Handle::Mig(p, i)) };
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    d: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    if is_mig.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, _, m| {
        // SAFETY: non-null out-pointer.
        unsafe { *is_mig = c_uint::from(m.is_some()) };
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    d: nvmlDevice_t,
    parent: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    if parent.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let Some(Handle::Mig(p, _)) = decode(d) else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    with_device(d, |_, _, _| {
        // SAFETY: non-null out-pointer.
        unsafe { *parent = encode(Handle::Gpu(p)) };
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    d: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    if id.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, _, m| match m {
        None => NVML_ERROR_NOT_SUPPORTED,
        Some(m) => {
            // SAFETY: non-null out-pointer.
            unsafe { *id = m.gi };
            NVML_SUCCESS
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    d: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    if id.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, _, m| match m {
        None => NVML_ERROR_NOT_SUPPORTED,
        Some(m) => {
            // SAFETY: non-null out-pointer.
            unsafe { *id = m.ci };
            NVML_SUCCESS
        }
    })
}

// ---- NVLink and fabric ------------------------------------------------------------------------
// PyTorch's CUDA allocator resolves these at its first out-of-memory report (c10 `DriverAPI`);
// the simulated node has no NVLink topology (NVML_ERROR_NOT_SUPPORTED per link) and no fabric
// manager.

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    d: nvmlDevice_t,
    _link: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    if out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, _, _| NVML_ERROR_NOT_SUPPORTED)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    d: nvmlDevice_t,
    _link: c_uint,
    out: *mut std::ffi::c_void,
) -> nvmlReturn_t {
    if out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, _, _| NVML_ERROR_NOT_SUPPORTED)
}

/// The fields every `nvmlGpuFabricInfoV_t` version starts with (version, cluster UUID, status,
/// clique id, state); later versions append fields this never writes.
#[repr(C)]
pub struct FabricInfoHead {
    pub version: c_uint,
    pub cluster_uuid: [u8; 16],
    pub status: nvmlReturn_t,
    pub clique_id: c_uint,
    pub state: u8,
}

/// An H100 of an HGX board without a fabric manager: the query succeeds and says the GPU takes
/// part in no fabric (`NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`), as the real driver answers there.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    d: nvmlDevice_t,
    out: *mut FabricInfoHead,
) -> nvmlReturn_t {
    if out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device(d, |_, _, _| {
        // SAFETY: `out` is the caller's non-null nvmlGpuFabricInfoV_t, which starts with these
        // fields in every version; its own `version` field is kept.
        unsafe {
            (*out).cluster_uuid = [0; 16];
            (*out).status = NVML_SUCCESS;
            (*out).clique_id = 0;
            (*out).state = 0;
        }
        NVML_SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip() {
        for h in [Handle::Gpu(0), Handle::Gpu(7), Handle::Mig(3, 6)] {
            let d = encode(h);
            match (h, decode(d).unwrap()) {
                (Handle::Gpu(a), Handle::Gpu(b)) => assert_eq!(a, b),
                (Handle::Mig(a, x), Handle::Mig(b, y)) => assert_eq!((a, x), (b, y)),
                _ => panic!("kind changed"),
            }
        }
        assert!(decode(std::ptr::null_mut()).is_none());
        assert!(decode(0x1234 as nvmlDevice_t).is_none());
    }

    #[test]
    fn uninitialised_calls_fail() {
        let mut n = 0u32;
        assert_eq!(
            // SAFETY: `n` is a live local u32, a valid out-pointer for the call.
            unsafe { nvmlDeviceGetCount_v2(&mut n) },
            NVML_ERROR_UNINITIALIZED
        );
        assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    }

    #[test]
    fn pci_ids_compare_loosely() {
        assert!(pci_eq("00000000:19:00.0", "0000:19:00.0"));
        assert!(!pci_eq("00000000:19:00.0", "00000000:1A:00.0"));
        assert_eq!(parse_bus_id("00000000:1a:00.0"), (0, 0x1a, 0));
    }
}
