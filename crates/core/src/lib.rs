//! gpufence-core: the decision, as plain data and pure functions — no applier, no namespace, no
//! cgroup, no engine. The crates above it (node mechanisms, appliers, binaries) import it; it
//! imports none of them, and the compiler holds that.
//!
//! Its modules sit in layers, bottom up; every import points down:
//!
//! 1. **ground** — [`config`], [`exit`], [`text`] (the `gpufence-ground` crate), [`fsutil`]
//!    (atomic writes), [`fnv`], [`logging`], [`child`] (deadlined child processes),
//!    [`real_runtime`] (which runc);
//! 2. **formats**, parsed strictly — [`cdi`] and [`kubelet`] (device-manager checkpoint, DRA
//!    state: the node's records, the `gpufence-records` crate), [`ldso`] (ld.so cache, ELF: the
//!    `gpufence-ldso` crate), [`quantity`], [`quota`] (the quota file, shared with the shim
//!    through the `gpufence-format` crate);
//! 3. **[`inventory`]** — what the node has (NVML, device nodes, driver files, driver-limit
//!    support), cached on disk;
//! 4. **[`allocation`]** — what the scheduler decided, normalised from any dialect and checked
//!    against kubelet's record;
//! 5. **plan** — [`plan`] (pure and final; its front door is [`plan::intake`]), with the quota
//!    [`backend`] and [`mps`] decisions.
//!
//! The contract (commands, annotations, config keys, quota environment) is `docs/contract.md`.

pub mod allocation;
pub mod backend;
pub use gpufence_records::cdi;
pub mod child;
pub mod config;
pub mod exit;
pub mod fnv;
pub mod fsutil;
pub mod inventory;
pub use gpufence_ldso as ldso;
pub use gpufence_records::kubelet;
pub mod logging;
pub mod mps;
pub mod plan;
pub mod quantity;
pub mod real_runtime;
pub use gpufence_format::quota;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub use gpufence_ground::text;
