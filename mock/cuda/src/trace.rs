//! `GPUFENCE_MOCK_CUDA_TRACE=1`: one line on stderr per entry point a program resolves through
//! `cuGetProcAddress` and per private table it asks for (`cuGetExportTable`), found or not. How to
//! see what a runtime (NVIDIA's libcudart, a framework) needs of the driver.

use std::sync::OnceLock;

fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("GPUFENCE_MOCK_CUDA_TRACE").is_some_and(|v| v != "0"))
}

pub(crate) fn proc_address(name: &str, version: i32, flags: u64, found: bool) {
    if on() {
        let what = if found { "found" } else { "MISSING" };
        eprintln!("mock cuda: cuGetProcAddress {name} version {version} flags {flags}: {what}");
    }
}

pub(crate) fn export_table(uuid: &[u8; 16], found: bool) {
    if on() {
        let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
        let what = if found { "found" } else { "MISSING" };
        eprintln!("mock cuda: cuGetExportTable {hex}: {what}");
    }
}

/// A program called an entry point of a feature the simulation lacks (`unsupported.rs`).
pub(crate) fn unsupported(name: &str) {
    if on() {
        eprintln!("mock cuda: {name}: not supported by the simulated driver");
    }
}
