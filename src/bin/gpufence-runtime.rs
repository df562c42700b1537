//! `gpufence-runtime`: a drop-in for runc that enforces the plan on `create`/`run`.
//!
//! A container engine starts it for every runc call, so its own start-up is on every call's
//! path. This binary is only the entry: built static (`make build`: `-C
//! target-feature=+crt-static` for this binary alone), it has no dynamic loader's work to do.
//! A pass-through call (`start`, `state`, `kill`, … with a fresh record) execs the real runtime
//! at once; everything else — `create`, `run`, `delete`, a record missing or stale — execs the
//! wrapper, `gpufence-runtime-wrapper` beside this one (its own directory, never PATH;
//! `crates/runc-wrapper/src/passthrough.rs`). `#![no_main]`: the C
//! `main` below replaces std's start-up (a read of `/proc/self/maps`, a signal stack), none of
//! which an exec-only program needs; what the real runtime must inherit (fds 0–2, SIGPIPE at
//! its default) is set on the way out.
// Under `cargo test` the harness brings its own `main`; the binary has no unit tests.
#![cfg_attr(not(test), no_main)]

// SAFETY: the one C `main` of this binary (`#![no_main]`); nothing else defines the symbol.
#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(argc: std::ffi::c_int, argv: *const *const std::ffi::c_char) -> std::ffi::c_int {
    let argc = argc.max(0) as usize;
    // SAFETY: C's own argv (argc strings, then null), and no thread exists.
    unsafe { gpufence::runtime::passthrough::exec_unless_wrapped(argc, argv) };
    // SAFETY: the same argv, and still no thread.
    unsafe { gpufence::runtime::passthrough::exec_wrapper(argc, argv) }
}
