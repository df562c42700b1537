//! glibc's `dlsym` and `dlvsym`: an application that `dlopen`s the driver and looks its functions
//! up by name gets the shim's export for every function the shim wraps (`interpose::hook_by_name`);
//! everything else, and every lookup without a quota, goes on to glibc's own. On x86_64 both are
//! tail-calling trampolines, so glibc still sees the caller's return address (`RTLD_NEXT` is
//! relative to it).

use std::ffi::{CStr, c_char};

use crate::ffi::Ptr;
use crate::interpose::hook_by_name;
use crate::{real, state};

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
