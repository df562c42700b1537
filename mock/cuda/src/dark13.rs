//! Private export tables (`cuGetExportTable`, see `dark.rs`) that newer NVIDIA libraries ask the
//! driver for, beyond what CUDA 13.2's runtime needs:
//!
//! | table | asked by | without it | slots used |
//! |---|---|---|---|
//! | `21318c60-9714-3248-8ca6-41ff7324c8f2` | the CUDA 13.5 runtime (`nvidia-cuda-runtime` 13.5, what `jax[cuda13]` installs) | every device call fails with `cudaErrorInvalidValue` (JAX: "no supported devices found for platform CUDA") | the runtime checks that the driver has it; cuBLAS/cuBLASLt 13 and cuFFT 13 call slots with the context from slot 2 of the tools TLS table (`dark.rs`): 4 before each GEMM (refused: `CUBLAS_STATUS_NOT_SUPPORTED`; cuFFT asks it too and runs without it), 51 then 39 for a complex GEMM's workspace (refused: `CUBLAS_STATUS_INTERNAL_ERROR`) | 4: the context's id (`context_id`); 51: a stream of the context (`context_stream`); 39: the stream's id (`stream_id`) |
//! | `6e163fbe-b958-444d-835c-e182aff1991e` | cuFFT (`libcufft.so.12` of CUDA 13), at `cufftCreate` | `CUFFT_INTERNAL_ERROR` (error 5) | slot 7, after each `cuModuleLoadData`: a kernel of that module, handed to a callback (`fft_module_function`) |
//! | `1734dc26-800d-4745-8726-c0f1e7dd8bca` | cuBLASLt 13, for a half-precision GEMM's heuristics (`cublasLtHSHMatmulAlgoGetHeuristic`) | SIGSEGV: cuBLASLt calls slot 4 of the table without checking it got one | slot 4 `(void **bytes, size_t *n) -> CUresult`, a byte per unit of the device that cuBLASLt counts by value (refused here: cuBLASLt then takes its defaults, the path it takes when its own key says not to ask) |
//! | `7cb63f9b-9ca4-8e42-a484-beb66e6aed7f` | CUPTI (`libcupti.so.13`), at its first call | CUPTI 13.5: `cuptiGetVersion` fails (error 1) and JAX's start-up check reports "Unable to load cuPTI"; CUPTI 13.2: endless recursion between its initialisation and `cuptiGetResultString` until the stack overflows (SIGSEGV) | CUPTI 13.5: none; CUPTI 13.2: slot 67 (registers a table of its own callbacks; refused here, see below) |
//!
//! What the slots of these tables mean is not documented; the simulated driver only proves that
//! the tables are there. Every slot but those named above answers `CUDA_ERROR_NOT_SUPPORTED` and,
//! under `GPUFENCE_MOCK_CUDA_TRACE=1`, names itself ("export table <uuid> slot <n>"), which is how a
//! library version that calls one shows up. CUPTI 13.2 calls slot 67 and does not survive its
//! refusal (nor an accepted registration without the driver then doing what CUPTI expects), so
//! JAX runs over the simulated node with the CUDA 13.5 wheels its own install picks
//! (`scripts/frameworks.sh`, docs/frameworks-jax.md).

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use crate::driver::{CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_NOT_SUPPORTED, CUDA_SUCCESS, CUresult};
use crate::trace;

/// Slots per table (slot 0 holds the table's size in bytes): room for any slot these
/// libraries index.
const SLOTS: usize = 128;

const TABLES: [&str; 4] = [
    "21318c60971432488ca641ff7324c8f2",
    "7cb63f9b9ca48e42a484beb66e6aed7f",
    "6e163fbeb958444d835ce182aff1991e",
    "1734dc26800d47458726c0f1e7dd8bca",
];

#[repr(C)]
struct Table([usize; SLOTS]);

/// Slot `SLOT` of table `TABLE` (index into `TABLES`).
extern "C" fn unknown_slot<const TABLE: usize, const SLOT: usize>() -> CUresult {
    trace::unsupported(&format!("export table {} slot {SLOT}", TABLES[TABLE]));
    CUDA_ERROR_NOT_SUPPORTED
}

/// `t[16 * $hi + lo] = unknown_slot::<TABLE, 16 * $hi + lo>` for lo in 0..16.
macro_rules! sixteen {
    ($t:ident, $table:ident, $hi:literal) => {
        sixteen!(@ $t, $table, $hi, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@ $t:ident, $table:ident, $hi:literal, $($lo:literal)*) => {
        $($t[16 * $hi + $lo] =
            unknown_slot::<$table, { 16 * $hi + $lo }> as extern "C" fn() -> CUresult as usize;)*
    };
}

fn build<const TABLE: usize>() -> Table {
    let mut t = [0usize; SLOTS];
    macro_rules! all {
        ($($hi:literal)*) => { $(sixteen!(t, TABLE, $hi);)* };
    }
    all!(0 1 2 3 4 5 6 7);
    t[0] = SLOTS * std::mem::size_of::<usize>();
    if TABLES[TABLE] == FFT_TABLE {
        t[7] = fft_module_function as FftLookup as usize;
    }
    if TABLES[TABLE] == CONTEXT_TABLE {
        t[4] = context_id as ContextId as usize;
        t[39] = stream_id as StreamId as usize;
        t[51] = context_stream as ContextStream as usize;
    }
    Table(t)
}

/// The table of the CUDA 13.5 runtime, cuBLASLt 13 and cuFFT 13.
const CONTEXT_TABLE: &str = "21318c60971432488ca641ff7324c8f2";

type ContextId = unsafe extern "C" fn(usize, *mut u64) -> CUresult;

/// Slot 4 of `21318c60-...`: `(CUcontext ctx, unsigned long long *id)`, the id of `ctx` (0: the
/// current one), what `cuCtxGetId` answers. The real driver's tools callback hooks answer the
/// same pair (context, id) for a tool's callback record. cuBLASLt 13 keys per-context state by it
/// before each GEMM and, refused, fails the GEMM with `CUBLAS_STATUS_NOT_SUPPORTED`; cuFFT 13 asks
/// it before a launch and runs without it.
unsafe extern "C" fn context_id(ctx: usize, id: *mut u64) -> CUresult {
    // SAFETY: the caller's out-slot, passed on unchanged (null-checked there).
    unsafe { crate::devctx::cuCtxGetId(ctx, id) }
}

/// `CU_STREAM_PER_THREAD`.
const PER_THREAD_STREAM: usize = 2;

type ContextStream = unsafe extern "C" fn(usize, usize, *mut usize, c_int) -> CUresult;

/// Slot 51 of `21318c60-...`: `(CUcontext ctx, CUstream s, CUstream *out, int per_thread)`,
/// the driver's stream for the handle `s` (`per_thread`: `s` is `CU_STREAM_PER_THREAD`, as
/// cuBLAS passes it). cuBLAS 13 asks it, then the stream's id (slot 39), to find the workspace it
/// keeps per stream for complex GEMMs. The simulated driver's stream handles are its streams: a
/// handle of the context is answered unchanged, an unknown one refused, as `cuStreamGetId` does.
unsafe extern "C" fn context_stream(
    ctx: usize,
    stream: usize,
    out: *mut usize,
    per_thread: c_int,
) -> CUresult {
    crate::driver::guard(|| {
        let mut owner = 0usize;
        let r = if per_thread != 0 || stream == PER_THREAD_STREAM {
            crate::streams::cuStreamGetCtx_ptsz(stream, &mut owner)
        } else {
            crate::streams::cuStreamGetCtx(stream, &mut owner)
        };
        if r != CUDA_SUCCESS {
            return r;
        }
        if ctx != 0 && ctx != owner {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        // SAFETY: put refuses a null `out`; otherwise the caller's out-slot.
        unsafe { crate::driver::put(out, stream) }
    })
}

type StreamId = unsafe extern "C" fn(usize, usize, *mut u64) -> CUresult;

/// Slot 39 of `21318c60-...`: `(CUcontext ctx, CUstream s, unsigned long long *id)`, the id of a
/// stream slot 51 answered, what `cuStreamGetId` gives (one id per stream for the process's
/// life); cuBLAS compares it with the ids its workspaces were made for.
unsafe extern "C" fn stream_id(_ctx: usize, stream: usize, id: *mut u64) -> CUresult {
    crate::streams::cuStreamGetId(stream, id)
}

/// The table cuFFT (`libcufft.so.12`, CUDA 13) asks for when a plan is created.
const FFT_TABLE: &str = "6e163fbeb958444d835ce182aff1991e";

/// How slot 7 of cuFFT's table hands back what it found: `found(user, function)`.
type FftFound = Option<unsafe extern "C" fn(*mut c_void, usize)>;
type FftLookup = unsafe extern "C" fn(usize, usize, FftFound, *mut c_void) -> c_int;

/// Slot 7 of cuFFT's table: right after loading one of its modules (`cuModuleLoadData`), cuFFT
/// asks for a kernel of that module by a key of its own (not a name), giving a callback that
/// stores the `CUfunction` found in `user`; it counts the answer 1 as found and anything else as
/// `CUFFT_INTERNAL_ERROR`. Kernels compute nothing here, so any kernel of the module will do: a
/// new kernel handle (as `cuModuleGetFunction` makes, no simulated time) is handed to the callback.
unsafe extern "C" fn fft_module_function(
    _key: usize,
    module: usize,
    found: FftFound,
    user: *mut c_void,
) -> c_int {
    let Some(found) = found else {
        return 0;
    };
    if module == 0 {
        return 0;
    }
    let Ok(f) = crate::exec::new_kernel(c"cufft_kernel".as_ptr()) else {
        return 0;
    };
    // SAFETY: cuFFT's own callback and the `user` it gave with it, called as it expects.
    unsafe { found(user, f) };
    1
}

/// The table for `uuid` if it is one of this file's.
pub(crate) fn table(uuid: &[u8; 16]) -> Option<usize> {
    static CONTEXT: OnceLock<Table> = OnceLock::new();
    static CUPTI: OnceLock<Table> = OnceLock::new();
    static FFT: OnceLock<Table> = OnceLock::new();
    static BLAS_LT: OnceLock<Table> = OnceLock::new();
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    let t = match TABLES.iter().position(|name| *name == hex)? {
        0 => CONTEXT.get_or_init(build::<0>),
        1 => CUPTI.get_or_init(build::<1>),
        2 => FFT.get_or_init(build::<2>),
        _ => BLAS_LT.get_or_init(build::<3>),
    };
    Some(t as *const Table as *const c_void as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slots `build` fills with more than a refusal: (table, slot).
    const IMPLEMENTED: [(&str, usize); 4] = [
        (CONTEXT_TABLE, 4),
        (CONTEXT_TABLE, 39),
        (CONTEXT_TABLE, 51),
        (FFT_TABLE, 7),
    ];

    #[test]
    fn tables_are_sized_and_every_slot_answers() {
        let mut id = [0u8; 16];
        for (i, name) in TABLES.iter().enumerate() {
            for (j, b) in id.iter_mut().enumerate() {
                *b = u8::from_str_radix(&name[2 * j..2 * j + 2], 16).unwrap();
            }
            let p = table(&id).unwrap_or_else(|| panic!("table {i} missing"));
            // SAFETY: `table` returns the address of a static `Table`.
            let slots = unsafe { &(*(p as *const Table)).0 };
            assert_eq!(slots[0], SLOTS * 8);
            for (k, s) in slots.iter().enumerate().skip(1) {
                assert_ne!(*s, 0, "table {i} slot {k} empty");
                if IMPLEMENTED.contains(&(*name, k)) {
                    continue;
                }
                // SAFETY: every slot holds an `unknown_slot` instantiation, which takes no
                // arguments.
                let f: extern "C" fn() -> CUresult = unsafe { std::mem::transmute(*s) };
                assert_eq!(f(), CUDA_ERROR_NOT_SUPPORTED);
            }
        }
        assert_eq!(table(&[0; 16]), None);
    }

    unsafe extern "C" fn store(user: *mut c_void, f: usize) {
        // SAFETY: the test's own `usize` slot.
        unsafe { *(user as *mut usize) = f };
    }

    #[test]
    fn fft_slot_7_hands_a_kernel_to_the_callback() {
        let mut got = 0usize;
        let user = (&mut got as *mut usize).cast();
        // SAFETY: the callback and its slot are the test's own.
        let found = unsafe { fft_module_function(0xc7c0000, 0x10, Some(store), user) };
        assert_eq!(found, 1);
        assert_ne!(got, 0);
        assert!(crate::exec::kernel_ns(got as *mut c_void).is_ok());
        // SAFETY: as above; no callback or no module: nothing found.
        assert_eq!(unsafe { fft_module_function(0, 0x10, None, user) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { fft_module_function(0, 0, Some(store), user) }, 0);
    }
}
