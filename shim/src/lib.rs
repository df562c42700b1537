//! libgpufence.so — holds every process of a container to the container's GPU memory quota and
//! compute share.
//!
//! Preloaded into every process (`/etc/ld.so.preload` or `LD_PRELOAD`). Applications reach the
//! driver three ways and all land here:
//! - direct linking against `libcuda.so.1`: the preloaded exports below come first in the
//!   global scope;
//! - `dlopen` + `dlsym`: `dlsym` is overridden (a tail-calling trampoline on x86_64, so glibc
//!   still sees the caller's return address for `RTLD_NEXT`) and hands out our exports for the
//!   functions we wrap;
//! - `cuGetProcAddress(_v2)`: wrapped; any returned driver function we wrap is swapped for ours,
//!   including `cuGetProcAddress` itself.
//!
//! Kernel launches (every launch form, graph replays included) are paced to the container's
//! compute share (`cores`): see `cores.rs`.
//!
//! Design rules: no constructor at all (everything is lazy, on the first CUDA/NVML call), no
//! lock anywhere (atomics, publish-once pointers), no lock held across a driver call, no panic
//! across the FFI boundary (`catch_unwind` in every export), fork-safe (the `pthread_atfork`
//! child handler only stores atomics). Without a quota every export is a plain forward (one
//! atomic load), and `dlsym`/`cuGetProcAddress` hand out the driver's own functions.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use gpufence_format::quota;

mod cores;
mod elfsym;
mod enforce;
mod explain;
mod exports;
mod ffi;
mod interpose;
use gpufence_format::human;
mod real;
use gpufence_format::region;
mod state;
mod table;

use std::ffi::{CStr, c_char};

use ffi::Ptr;
use interpose::hook_by_name;

// ---------------------------------------------------------------------------------------------
// dlsym

/// Our export for `name` when the application should get it, else 0 (then the trampoline
/// tail-calls the real dlsym). Always leaves the real dlsym resolved.
extern "C" fn dlsym_decide(handle: Ptr, name: *const c_char) -> usize {
    std::panic::catch_unwind(|| {
        real::real_dlsym();
        if name.is_null() {
            return 0;
        }
        // SAFETY: the caller's NUL-terminated symbol name.
        let n = unsafe { CStr::from_ptr(name) }.to_bytes();
        let Some(lib) = real::Lib::of(n) else {
            return 0;
        };
        let Some(hook) = hook_by_name(n) else {
            return 0;
        };
        let p = real::learn_handle(lib, handle, name);
        if let Some(id) = real::id_of(n) {
            real::seed(id, p);
        }
        if state::config().is_none() {
            return 0;
        }
        hook
    })
    .unwrap_or(0)
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: Ptr, name: *const c_char) -> Ptr {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "jmp qword ptr [rip + {real}]",
        decide = sym dlsym_decide,
        real = sym real::GPUFENCE_REAL_DLSYM,
    )
}

#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: Ptr, name: *const c_char) -> Ptr {
    let h = dlsym_decide(handle, name);
    if h != 0 {
        return h as Ptr;
    }
    unsafe { real::real_dlsym()(handle, name) }
}

// ---------------------------------------------------------------------------------------------
// dlvsym: glibc's `dlsym` (or `dlvsym`) fetched by version, and the driver's names, go through
// the shim like `dlsym` does.

/// Our export for `name` asked for by version, else 0 (then the trampoline tail-calls glibc's
/// dlvsym). Always leaves the real dlvsym resolved.
extern "C" fn dlvsym_decide(handle: Ptr, name: *const c_char) -> usize {
    real::real_dlvsym();
    if name.is_null() {
        return 0;
    }
    // SAFETY: the caller's NUL-terminated symbol name.
    match unsafe { CStr::from_ptr(name) }.to_bytes() {
        b"dlsym" => dlsym as unsafe extern "C" fn(Ptr, *const c_char) -> Ptr as usize,
        b"dlvsym" => {
            dlvsym as unsafe extern "C" fn(Ptr, *const c_char, *const c_char) -> Ptr as usize
        }
        _ => dlsym_decide(handle, name),
    }
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlvsym(handle: Ptr, name: *const c_char, version: *const c_char) -> Ptr {
    // Three pushes keep the stack 16-byte aligned at the call; the tail jump keeps the
    // caller's return address (RTLD_NEXT is relative to it).
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "push rdx",
        "call {decide}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "jmp qword ptr [rip + {real}]",
        decide = sym dlvsym_decide,
        real = sym real::GPUFENCE_REAL_DLVSYM,
    )
}

#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlvsym(handle: Ptr, name: *const c_char, version: *const c_char) -> Ptr {
    let h = dlvsym_decide(handle, name);
    if h != 0 {
        return h as Ptr;
    }
    // SAFETY: glibc's dlvsym with the caller's arguments.
    unsafe { real::real_dlvsym()(handle, name, version) }
}
