//! Private export tables (`cuGetExportTable`, see `dark.rs`) that newer NVIDIA libraries ask the
//! driver for, beyond what CUDA 13.2's runtime needs:
//!
//! | table | asked by | without it | slots used |
//! |---|---|---|---|
//! | `21318c60-9714-3248-8ca6-41ff7324c8f2` | the CUDA 13.5 runtime (`nvidia-cuda-runtime` 13.5, what `jax[cuda13]` installs) | every device call fails with `cudaErrorInvalidValue` (JAX: "no supported devices found for platform CUDA") | none seen: the runtime only checks that the driver has it |
//! | `7cb63f9b-9ca4-8e42-a484-beb66e6aed7f` | CUPTI (`libcupti.so.13`), at its first call | CUPTI 13.5: `cuptiGetVersion` fails (error 1) and JAX's start-up check reports "Unable to load cuPTI"; CUPTI 13.2: endless recursion between its initialisation and `cuptiGetResultString` until the stack overflows (SIGSEGV) | CUPTI 13.5: none; CUPTI 13.2: slot 67 (registers a table of its own callbacks; refused here, see below) |
//!
//! What the slots of these tables mean is not documented; the simulated driver only proves that
//! the tables are there. Every slot answers `CUDA_ERROR_NOT_SUPPORTED` and, under
//! `GPUFENCE_MOCK_CUDA_TRACE=1`, names itself ("export table <uuid> slot <n>"), which is how a
//! library version that calls one shows up. CUPTI 13.2 calls slot 67 and does not survive its
//! refusal (nor an accepted registration without the driver then doing what CUPTI expects), so
//! JAX runs over the simulated node with the CUDA 13.5 wheels its own install picks
//! (`scripts/frameworks.sh`, docs/frameworks-jax.md).

use std::ffi::c_void;
use std::sync::OnceLock;

use crate::driver::{CUDA_ERROR_NOT_SUPPORTED, CUresult};
use crate::trace;

/// Slots per table (slot 0 holds the table's size in bytes): room for any slot these
/// libraries index.
const SLOTS: usize = 128;

const TABLES: [&str; 2] = [
    "21318c60971432488ca641ff7324c8f2",
    "7cb63f9b9ca48e42a484beb66e6aed7f",
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
    Table(t)
}

/// The table for `uuid` if it is one of this file's.
pub(crate) fn table(uuid: &[u8; 16]) -> Option<usize> {
    static CONTEXT: OnceLock<Table> = OnceLock::new();
    static CUPTI: OnceLock<Table> = OnceLock::new();
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    let t = match TABLES.iter().position(|name| *name == hex)? {
        0 => CONTEXT.get_or_init(build::<0>),
        _ => CUPTI.get_or_init(build::<1>),
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
                // SAFETY: every slot holds an `unknown_slot` instantiation, which takes no
                // arguments.
                let f: extern "C" fn() -> CUresult = unsafe { std::mem::transmute(*s) };
                assert_eq!(f(), CUDA_ERROR_NOT_SUPPORTED);
            }
        }
        assert_eq!(table(&[0; 16]), None);
    }
}
