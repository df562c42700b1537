//! gpufence: the node-side enforcement point for shared GPUs — the binaries (`gpufence`,
//! `gpufence-runtime`, `gpufence-sim`, one file per subcommand in [`commands`]) and a facade that
//! re-exports the layers under the paths they have always had (`gpufence::plan`, …).
//!
//! The layers are crates, so the compiler refuses an import that points up or sideways
//! (docs/architecture.md):
//!
//! 1. `gpufence-core` — the decision: ground (config, exit, text, atomic writes, logging, child
//!    processes), formats (CDI, ld.so cache, kubelet's records, quantities, the quota file),
//!    inventory, allocation and the plan (pure and final; front door `plan::intake`);
//! 2. `gpufence-node` — the privileged mechanisms the appliers share: namespaces and in-rootfs
//!    paths, device cgroups, a plan's host files, NVML driver limits, the state writer;
//! 3. `gpufence-nri-stub` — the NRI wire, apart from the plugin's logic;
//!    `gpufence-engines` — engine configuration and install;
//! 4. one crate per applier and reader, none importing another: `gpufence-runc-wrapper` (the
//!    spec, `gpufence-runtime`), `gpufence-hook` (the namespace, hooks.d), `gpufence-nri` (an NRI
//!    adjustment), `gpufence-cdigen` (CDI specs), `gpufence-status` (`ps`, exporter),
//!    `gpufence-simnode` (the simulated node);
//! 5. this crate: the binaries.
//!
//! The contract (commands, annotations, config keys, quota environment) is docs/contract.md.

// The decision (crates/core), re-exported so that every module keeps its path.
pub use gpufence_core::{
    allocation, backend, cdi, child, config, exit, fnv, fsutil, inventory, kubelet, ldso, logging,
    mps, plan, quantity, quota, real_runtime, text,
};

// The node mechanisms (crates/node), likewise.
pub use gpufence_node::{cgroup, driverfolders, driverlimits, enter, hostfiles, state};

// Engine configuration and install (crates/engines), and the appliers and readers.
pub use gpufence_cdigen as cdigen;
pub use gpufence_engines as engines;
pub use gpufence_hook as hook;
pub use gpufence_nri as nri;
pub use gpufence_runc_wrapper as runtime;
pub use gpufence_simnode as sim;
pub use gpufence_status as status;

pub mod commands;
