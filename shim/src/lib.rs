//! libgpufence.so — holds every process of a container to the container's GPU memory quota and
//! compute share.
//!
//! Preloaded into every process (`/etc/ld.so.preload` or `LD_PRELOAD`). Applications reach the
//! driver three ways and all land here:
//! - direct linking against `libcuda.so.1`: the preloaded exports (`exports/`) come first in the
//!   global scope;
//! - `dlopen` + `dlsym`: `dlsym` is overridden (`exports/dl.rs`: a tail-calling trampoline on
//!   x86_64, so glibc still sees the caller's return address for `RTLD_NEXT`) and hands out our
//!   exports for the functions we wrap;
//! - `cuGetProcAddress(_v2)`: wrapped (`interpose.rs`); any returned driver function we wrap is
//!   swapped for ours, including `cuGetProcAddress` itself.
//!
//! Kernel launches (every launch form, graph replays included) are paced to the container's
//! compute share (`cores`): see `cores.rs`.
//!
//! Design rules: no constructor at all (everything is lazy, on the first CUDA/NVML call), no
//! lock anywhere (atomics, publish-once pointers), no lock held across a driver call, no panic
//! across the FFI boundary (`catch_unwind` in every export), fork-safe (the `pthread_atfork`
//! child handler only stores atomics). Without a quota every export is a plain forward (one
//! atomic load), and `dlsym`/`cuGetProcAddress` hand out the driver's own functions.
//!
//! The files, each importing only those listed before it (`scripts/import_cycles.py`, run by
//! `make lint`, finds any loop):
//! - `ffi`: the CUDA and NVML C types and codes;
//! - `elfsym`, `real`: finding the real driver (and glibc) functions behind our exports;
//! - `table`, `state`, `explain`, `cores`: the per-process handle table, the quota and the
//!   accounting region, the refusal's one line, the compute-share pacing;
//! - `poolmem`: what stream-ordered memory pools keep after a free (charged until a
//!   synchronization above the release threshold, a trim or the pool's end);
//! - `enforce`: holding one driver call to the quota (charge, call, record or roll back);
//! - `vmmmem`: how long VMM memory lives (charged while its handle, a mapping or a retained
//!   reference keeps it; an imported handle's mappings charged);
//! - `graphmem`: the memory CUDA graphs hold (charged at a graph's first launch, released by a
//!   trim after its instantiation is destroyed);
//! - `exports/`: the exports, one file per API (`cuda_memory`, `cuda_launch`, `nvml`);
//! - `interpose`: which export stands for which driver function, and `cuGetProcAddress`;
//! - `exports/dl`: `dlsym`/`dlvsym`, handing out the exports by name through `interpose`.
#![allow(non_snake_case, clippy::missing_safety_doc)]

// the quota file, the accounting region and byte counts, shared with the host side
use gpufence_format::{human, quota, region};

mod cores;
mod elfsym;
mod enforce;
mod explain;
mod exports;
mod ffi;
mod graphmem;
mod interpose;
mod poolmem;
mod real;
mod state;
mod table;
mod vmmmem;
