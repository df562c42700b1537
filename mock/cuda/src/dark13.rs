//! Private export tables (`cuGetExportTable`, see `dark.rs`) that newer NVIDIA libraries ask the
//! driver for, beyond what CUDA 13.2's runtime needs:
//!
//! | table | asked by | without it | slots used |
//! |---|---|---|---|
//! | `21318c60-9714-3248-8ca6-41ff7324c8f2` | the CUDA 13.5 runtime (`nvidia-cuda-runtime` 13.5, what `jax[cuda13]` installs) | every device call fails with `cudaErrorInvalidValue` (JAX: "no supported devices found for platform CUDA") | none seen: the runtime only checks that the driver has it |
//! | `6e163fbe-b958-444d-835c-e182aff1991e` | cuFFT (`libcufft.so.12` of CUDA 13), at `cufftCreate` | `CUFFT_INTERNAL_ERROR` (error 5) | slot 7, after each `cuModuleLoadData`: a kernel of that module, handed to a callback (`fft_module_function`) |
//! | `7cb63f9b-9ca4-8e42-a484-beb66e6aed7f` | CUPTI (`libcupti.so.13`), at its first call | CUPTI 13.5: `cuptiGetVersion` fails (error 1) and JAX's start-up check reports "Unable to load cuPTI"; CUPTI 13.2: endless recursion between its initialisation and `cuptiGetResultString` until the stack overflows (SIGSEGV) | CUPTI 13.5: none; CUPTI 13.2: slot 67 (registers a table of its own callbacks; refused here, see below) |
//!
//! What the slots of these tables mean is not documented; the simulated driver only proves that
//! the tables are there. Every slot but cuFFT's slot 7 answers `CUDA_ERROR_NOT_SUPPORTED` and,
//! under `GPUFENCE_MOCK_CUDA_TRACE=1`, names itself ("export table <uuid> slot <n>"), which is how a
//! library version that calls one shows up. CUPTI 13.2 calls slot 67 and does not survive its
//! refusal (nor an accepted registration without the driver then doing what CUPTI expects), so
//! JAX runs over the simulated node with the CUDA 13.5 wheels its own install picks
//! (`scripts/frameworks.sh`, docs/frameworks-jax.md).

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use crate::driver::{CUDA_ERROR_NOT_SUPPORTED, CUresult};
use crate::trace;

/// Slots per table (slot 0 holds the table's size in bytes): room for any slot these
/// libraries index.
const SLOTS: usize = 128;

const TABLES: [&str; 3] = [
    "21318c60971432488ca641ff7324c8f2",
    "7cb63f9b9ca48e42a484beb66e6aed7f",
    "6e163fbeb958444d835ce182aff1991e",
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
    Table(t)
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
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    let t = match TABLES.iter().position(|name| *name == hex)? {
        0 => CONTEXT.get_or_init(build::<0>),
        1 => CUPTI.get_or_init(build::<1>),
        _ => FFT.get_or_init(build::<2>),
    };
    Some(t as *const Table as *const c_void as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

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
                if *name == FFT_TABLE && k == 7 {
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
