//! gpufence: the node-side enforcement point for shared GPUs.
//!
//! The crate is a pipeline of plain data — inventory → allocation → plan → appliers — and its
//! modules sit in layers; every import points down (`scripts/layers.py`, run by `make lint`,
//! checks it):
//!
//! 1. **ground** — [`config`], [`exit`], [`text`], [`fsutil`] (atomic writes), [`fnv`],
//!    [`logging`], [`child`] (deadlined child processes);
//! 2. **formats**, parsed strictly — [`cdi`], [`ldso`] (ld.so cache, ELF), [`kubelet`]
//!    (device-manager checkpoint), [`quantity`], [`quota`] (the quota file, shared with the shim
//!    through the `gpufence-format` crate);
//! 3. **[`inventory`]** — what the node has (NVML, device nodes, driver files, driver-limit
//!    support), cached on disk;
//! 4. **[`allocation`]** — what the scheduler decided, normalised from any dialect and checked
//!    against kubelet's record;
//! 5. **plan** — [`plan`] (pure and final), with the quota [`backend`] and [`mps`] decisions;
//! 6. **applier support** — [`enter`] (namespaces, in-rootfs paths), [`cgroup`] (device rules),
//!    [`hostfiles`] (a plan's host files), [`driverlimits`] (NVML limits on a cgroup);
//! 7. **appliers and readers** — [`runtime`] (the spec, `gpufence-runtime`), [`hook`] (the
//!    namespace, hooks.d), [`nri`] (an NRI adjustment), [`cdigen`] (CDI specs), [`status`]
//!    (`ps`, exporter), [`install`],
//!    [`sim`] (the simulated node).
//!
//! The contract (commands, annotations, config keys, quota environment) is docs/contract.md;
//! side effects live at the edges, the middle is unit-testable.

pub mod cdigen;
pub mod hook;
pub mod nri;
pub mod runtime;
pub mod sim;
pub mod status;

// The decision (crates/core), re-exported so that every module keeps its path.
pub use gpufence_core::{
    allocation, backend, cdi, child, config, exit, fnv, fsutil, inventory, kubelet, ldso, logging,
    mps, plan, quantity, quota, real_runtime, text,
};

// The node mechanisms (crates/node), likewise.
pub use gpufence_node::{cgroup, driverlimits, enter, hostfiles, state};

// Engine configuration and install (crates/engines).
pub use gpufence_engines as engines;

pub mod commands;
