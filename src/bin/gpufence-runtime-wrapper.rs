//! `gpufence-runtime-wrapper`: the wrapper behind the static entry `gpufence-runtime`, which
//! execs it (from its own directory, `argv[0]` `gpufence-runtime`) for `create`, `run`,
//! `delete` and a pass-through call without a fresh record: plans, edits the spec, execs the real
//! runtime (`crates/runc-wrapper/`).
//!
//! `#![no_main]`: the C `main` below replaces std's start-up, which reads and parses
//! `/proc/self/maps` (glibc's `pthread_getattr_np` for the main thread's stack guard) and maps a
//! signal stack for stack-overflow reports before `main` runs. What of it matters here is kept
//! by [`gpufence::exit::start_like_std`] (fds 0–2, SIGPIPE); a panic still prints its message
//! and exits 101; `std::env::args_os` works as before (glibc passes argv to std's init array).
// Under `cargo test` the harness brings its own `main`; the binary has no unit tests.
#![cfg_attr(not(test), no_main)]

// SAFETY: the one C `main` of this binary (`#![no_main]`); nothing else defines the symbol.
#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    gpufence::exit::start_like_std();
    std::panic::catch_unwind(|| -> std::ffi::c_int {
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        gpufence::exit::finish("gpufence-runtime", gpufence::runtime::main(args))
    })
    .unwrap_or(101)
}
