//! `cuGetExportTable`: the private tables NVIDIA's CUDA runtime (libcudart 12.x, 13.x) asks the
//! driver for, keyed by UUID. The runtime reads a table as an array of function pointers; the
//! first slot of most tables holds the table's size in bytes. Which tables and slots the runtime
//! uses, and what they mean, is documented by ZLUDA (`dark_api/`, vosen/ZLUDA); what follows is
//! the simulated driver's own answer to each:
//!
//! | table | slots used | here |
//! |---|---|---|
//! | runtime interface | 1, 6, 8: load a module from a `__fatBinC_Wrapper_t` / fatbin header; 2: primary context of a device; 7: a notification; 12: load the JIT compilers | any image loads (as `cuModuleLoadData`); the primary context; nothing; success |
//! | tools TLS | 2: the calling thread's context (cuBLASLt, before each heuristic query; the runtime, for a tool's callback record) | the current context, as `cuCtxGetCurrent` |
//! | tools callback hooks | 2, 6: a buffer for the runtime's callback state | two zeroed static buffers |
//! | context local storage | 0 put, 1 delete, 2 get (by context and key) | a map per (context, key) |
//! | context create bypass | 1: `cuCtxCreate_v2` | `cuCtxCreate_v2` |
//! | heap access | 1, 2 | not supported |
//! | device extended | 5: an extended attribute, 13: a device flag | not supported; 0 |
//! | integrity check | 1: a hash of the driver's identity | 16 bytes the runtime does not check on Linux |
//! | context checks | 2: context state bits, 3: a check | 0, 0 |
//!
//! Any other UUID answers `CUDA_ERROR_INVALID_VALUE`, as the real driver does for a table it lacks.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use crate::driver::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_SUPPORTED, CUDA_SUCCESS, CURRENT, CUresult, guard, put,
};
use crate::{integrity, trace};

const INTEGRITY_CHECK: [u8; 16] = [
    0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2,
];

/// A table as the runtime reads it: `N` pointer-sized slots.
#[repr(C)]
struct Table<const N: usize>([usize; N]);

type Ctx = usize;
type Dtor = Option<unsafe extern "C" fn(Ctx, *mut c_void, *mut c_void)>;

/// Context-local storage: (context, key) → value.
static CLS: Mutex<Option<HashMap<(Ctx, usize), usize>>> = Mutex::new(None);

fn ctx_or_current(ctx: Ctx) -> Result<Ctx, CUresult> {
    let c = if ctx == 0 {
        CURRENT.with(|c| c.get())
    } else {
        ctx
    };
    if c == 0 {
        Err(CUDA_ERROR_INVALID_CONTEXT)
    } else {
        Ok(c)
    }
}

unsafe extern "C" fn cls_put(
    ctx: Ctx,
    key: *mut c_void,
    value: *mut c_void,
    _dtor: Dtor,
) -> CUresult {
    guard(|| match ctx_or_current(ctx) {
        Ok(c) => {
            let mut m = CLS.lock().unwrap_or_else(|e| e.into_inner());
            m.get_or_insert_with(HashMap::new)
                .insert((c, key as usize), value as usize);
            CUDA_SUCCESS
        }
        Err(e) => e,
    })
}

unsafe extern "C" fn cls_delete(ctx: Ctx, key: *mut c_void) -> CUresult {
    guard(|| match ctx_or_current(ctx) {
        Ok(c) => {
            let mut m = CLS.lock().unwrap_or_else(|e| e.into_inner());
            m.get_or_insert_with(HashMap::new)
                .remove(&(c, key as usize));
            CUDA_SUCCESS
        }
        Err(e) => e,
    })
}

unsafe extern "C" fn cls_get(value: *mut *mut c_void, ctx: Ctx, key: *mut c_void) -> CUresult {
    guard(|| {
        let c = match ctx_or_current(ctx) {
            Ok(c) => c,
            Err(e) => return e,
        };
        let m = CLS.lock().unwrap_or_else(|e| e.into_inner());
        match m.as_ref().and_then(|m| m.get(&(c, key as usize))) {
            // SAFETY: put refuses a null `value`; otherwise it is the runtime's out-slot.
            Some(v) => unsafe { put(value, *v as *mut c_void) },
            None => CUDA_ERROR_INVALID_HANDLE,
        }
    })
}

unsafe extern "C" fn load_module_from_wrapper(
    module: *mut usize,
    wrapper: *const c_void,
) -> CUresult {
    // SAFETY: the runtime's out-slot and image, passed on unchanged (null-checked there).
    unsafe { crate::exec::cuModuleLoadData(module, wrapper) }
}

unsafe extern "C" fn load_module_from_wrapper_ext(
    module: *mut usize,
    wrapper: *const c_void,
    _a3: *mut c_void,
    _a4: *mut c_void,
    _a5: c_uint,
) -> CUresult {
    // SAFETY: as load_module_from_wrapper.
    unsafe { crate::exec::cuModuleLoadData(module, wrapper) }
}

unsafe extern "C" fn load_module_from_header(
    header: *const c_void,
    module: *mut usize,
    _a3: *mut c_void,
    _a4: *mut c_void,
    _a5: c_uint,
) -> CUresult {
    // SAFETY: as load_module_from_wrapper.
    unsafe { crate::exec::cuModuleLoadData(module, header) }
}

unsafe extern "C" fn primary_context(pctx: *mut usize, dev: c_int) -> CUresult {
    // SAFETY: the runtime's out-slot, passed on unchanged (null-checked there).
    unsafe { crate::devctx::cuDevicePrimaryCtxRetain(pctx, dev) }
}

unsafe extern "C" fn notify(_arg: usize) {}

unsafe extern "C" fn load_compilers() -> CUresult {
    CUDA_SUCCESS
}

#[repr(C)]
struct Buffer<const N: usize>(std::cell::UnsafeCell<[u32; N]>);
// SAFETY: the runtime owns the buffers' contents; the driver never reads or writes them.
unsafe impl<const N: usize> Sync for Buffer<N> {}
static HOOKS_BUFFER_1: Buffer<1024> = Buffer(std::cell::UnsafeCell::new([0; 1024]));
static HOOKS_BUFFER_2: Buffer<14> = Buffer(std::cell::UnsafeCell::new([0; 14]));

unsafe extern "C" fn hooks_buffer_1(ptr: *mut *mut c_void, size: *mut usize) {
    // SAFETY: the runtime's out-slots (checked non-null).
    unsafe {
        if !ptr.is_null() && !size.is_null() {
            *ptr = HOOKS_BUFFER_1.0.get().cast();
            *size = 1024;
        }
    }
}

unsafe extern "C" fn hooks_buffer_2(ptr: *mut *mut c_void, size: *mut usize) {
    // SAFETY: the runtime's out-slots (checked non-null).
    unsafe {
        if !ptr.is_null() && !size.is_null() {
            *ptr = HOOKS_BUFFER_2.0.get().cast();
            *size = 14;
        }
    }
}

/// Slot 2 of the tools TLS table: `(CUcontext *out) -> CUresult`, the calling thread's context.
/// The runtime fills a tool's callback record with it (and the context's id from the callback
/// hooks table); cuBLASLt 13 calls it before each GEMM heuristic query, then asks the context's id
/// (slot 4 of `21318c60-...`, `dark13.rs`) to key its per-context state; an empty slot crashed it.
unsafe extern "C" fn tools_current_context(pctx: *mut usize) -> CUresult {
    guard(|| match crate::driver::state() {
        // SAFETY: put refuses a null `pctx`; otherwise the caller's out-slot.
        Ok(_) => unsafe { put(pctx, CURRENT.with(|c| c.get())) },
        Err(e) => e,
    })
}

unsafe extern "C" fn ctx_create_bypass(pctx: *mut usize, flags: c_uint, dev: c_int) -> CUresult {
    // SAFETY: the runtime's out-slot, passed on unchanged (null-checked there).
    unsafe { crate::devctx::cuCtxCreate_v2(pctx, flags, dev) }
}

unsafe extern "C" fn heap_alloc(_rec: *mut *const c_void, _a: usize, _b: usize) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

unsafe extern "C" fn heap_free(_rec: *const c_void, _a: *mut usize) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

unsafe extern "C" fn device_attribute_ext(
    _dev: c_int,
    _attr: c_uint,
    _x: c_int,
    _out: *mut [usize; 2],
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

unsafe extern "C" fn device_flag(out: *mut u8, _dev: c_int) -> CUresult {
    // SAFETY: put refuses a null `out`; otherwise the runtime's out-slot.
    unsafe { put(out, 0) }
}

unsafe extern "C" fn integrity_check(
    version: c_uint,
    unix_seconds: u64,
    out: *mut [u64; 2],
) -> CUresult {
    guard(|| {
        let s = match crate::driver::state() {
            Ok(s) => s,
            Err(e) => return e,
        };
        let check_table = table(&INTEGRITY_CHECK).unwrap_or(0);
        let caller = integrity::Caller {
            driver_cuda_version: s.driver_version as u32,
            version,
            pid: std::process::id(),
            // SAFETY: pthread_self has no preconditions.
            thread: unsafe { libc::pthread_self() } as u32,
            runtime_table: runtime_interface() as *const Table<13> as usize,
            check_table,
            // SAFETY: the table has 3 slots; slot 1 is the check function.
            check_fn: unsafe { *(check_table as *const usize).add(1) },
            unix_seconds,
        };
        let devices: Vec<integrity::DeviceId> = s
            .devices
            .iter()
            .map(|d| integrity::DeviceId {
                uuid: d.uuid,
                pci_domain: d.pci.0,
                pci_bus: d.pci.1,
                pci_device: d.pci.2,
            })
            .collect();
        // SAFETY: put refuses a null `out`; otherwise the runtime's 16-byte out-slot.
        unsafe { put(out, integrity::answer(&caller, &devices)) }
    })
}

unsafe extern "C" fn context_check(
    _ctx: Ctx,
    bits: *mut u32,
    _other: *mut *const c_void,
) -> CUresult {
    // SAFETY: put refuses a null `bits`; otherwise the runtime's out-slot.
    unsafe { put(bits, 0) }
}

unsafe extern "C" fn check_fn() -> u32 {
    0
}

const fn size_of<const N: usize>() -> usize {
    N * std::mem::size_of::<usize>()
}

macro_rules! f {
    ($f:expr) => {
        $f as usize
    };
}

fn runtime_interface() -> &'static Table<13> {
    static T: std::sync::OnceLock<Table<13>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = [0usize; 13];
        t[0] = size_of::<13>();
        t[1] = f!(load_module_from_wrapper as unsafe extern "C" fn(_, _) -> _);
        t[2] = f!(primary_context as unsafe extern "C" fn(_, _) -> _);
        t[6] = f!(load_module_from_wrapper_ext as unsafe extern "C" fn(_, _, _, _, _) -> _);
        t[7] = f!(notify as unsafe extern "C" fn(_));
        t[8] = f!(load_module_from_header as unsafe extern "C" fn(_, _, _, _, _) -> _);
        t[12] = f!(load_compilers as unsafe extern "C" fn() -> _);
        Table(t)
    })
}

/// The table for `uuid` (its address, as the runtime expects it), if the driver has one.
fn table(uuid: &[u8; 16]) -> Option<usize> {
    macro_rules! table {
        ($n:literal, [$($i:literal => $f:expr),* $(,)?], $sized:expr) => {{
            static T: std::sync::OnceLock<Table<$n>> = std::sync::OnceLock::new();
            let t = T.get_or_init(|| {
                let mut t = [0usize; $n];
                if $sized {
                    t[0] = size_of::<$n>();
                }
                $(t[$i] = $f;)*
                Table(t)
            });
            Some(t as *const Table<$n> as usize)
        }};
    }
    type F2<A, B, R> = unsafe extern "C" fn(A, B) -> R;
    type F3<A, B, C, R> = unsafe extern "C" fn(A, B, C) -> R;
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    match hex.as_str() {
        "6bd5fb6c5bf4e74a8987d93912fd9df9" => {
            Some(runtime_interface() as *const Table<13> as usize)
        }
        "42d85a8123f6cb478298f6e78a3aecdc" => table!(4, [
            2 => f!(tools_current_context as unsafe extern "C" fn(_) -> _),
        ], true),
        "a094798c2e742e7493f20800200c0a66" => table!(7, [
            2 => f!(hooks_buffer_1 as F2<_, _, ()>),
            6 => f!(hooks_buffer_2 as F2<_, _, ()>),
        ], true),
        "c693336e1121df11a8c368f355d89593" => table!(4, [
            0 => f!(cls_put as unsafe extern "C" fn(_, _, _, _) -> _),
            1 => f!(cls_delete as F2<_, _, _>),
            2 => f!(cls_get as F3<_, _, _, _>),
        ], false),
        "0ca50b8c1004929a89a7d0df10e77286" => table!(2, [
            1 => f!(ctx_create_bypass as F3<_, _, _, _>),
        ], true),
        "195bcbf4d67d024aacc51d29cea631ae" => table!(3, [
            1 => f!(heap_alloc as F3<_, _, _, _>),
            2 => f!(heap_free as F2<_, _, _>),
        ], true),
        "b10541e1f7c7c74a9f64f223be99f1e2" => table!(26, [
            5 => f!(device_attribute_ext as unsafe extern "C" fn(_, _, _, _) -> _),
            13 => f!(device_flag as F2<_, _, _>),
        ], true),
        "d4082055bde6704b8d34ba123c66e1f2" if *uuid == INTEGRITY_CHECK => table!(3, [
            1 => f!(integrity_check as F3<_, _, _, _>),
        ], true),
        "263e88607cd2614392f6bbd5006dfa7e" => table!(4, [
            2 => f!(context_check as F3<_, _, _, _>),
            3 => f!(check_fn as unsafe extern "C" fn() -> _),
        ], true),
        _ => crate::dark13::table(uuid),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(
    out: *mut *const c_void,
    uuid: *const [u8; 16],
) -> CUresult {
    guard(|| {
        if out.is_null() || uuid.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller's 16-byte CUuuid (checked non-null).
        let id = unsafe { &*uuid };
        let t = table(id);
        trace::export_table(id, t.is_some());
        match t {
            // SAFETY: `out` checked non-null; the caller's out-slot.
            Some(p) => unsafe { put(out, p as *const c_void) },
            None => CUDA_ERROR_INVALID_VALUE,
        }
    })
}
