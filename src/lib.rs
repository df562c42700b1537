//! gpufence: the node-side enforcement point for shared GPUs.
//!
//! The crate is a pipeline of plain data (see `DESIGN.md`):
//!
//! * [`inventory`] — what the node has (NVML + device nodes + driver files), cached on disk;
//! * [`allocation`] — what the scheduler decided, normalised from any dialect;
//! * [`plan`] — the container edits, a pure function of (config.json, inventory, config);
//! * apply — to the OCI spec ([`runtime`]), inside the container's namespaces ([`hook`]) or as
//!   an NRI adjustment ([`nri`]);
//! * [`cdi`] — the same edits emitted as a CDI spec.
//!
//! Side effects live at the edges; the middle is unit-testable.

pub mod allocation;
pub mod backend;
pub mod cdi;
pub mod cdigen;
pub mod cgroup;
pub mod child;
pub mod config;
pub mod enter;
pub mod exit;
pub mod fnv;
pub mod hook;
pub mod hostfiles;
pub mod install;
pub mod inventory;
pub mod kubelet;
pub mod ldso;
pub mod logging;
pub mod mps;
pub mod nri;
pub mod plan;
pub mod quantity;
pub mod quota;
pub mod runtime;
pub mod sim;
pub mod status;
