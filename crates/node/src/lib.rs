//! gpufence-node: the privileged mechanisms the appliers share, below every applier and above
//! the decision (gpufence-core): [`enter`] (namespaces, in-rootfs paths, the container's ld
//! cache), [`cgroup`] (device rules, v1 and v2), [`hostfiles`] (a plan's host files),
//! [`driverfolders`] (the driver folders a plan mounts),
//! [`driverlimits`] (NVML memory limits on a cgroup) and [`state`] (the state writer). Privileged
//! calls sit behind small traits with recording fakes (`enter::sys`, `cgroup::sys`).

pub mod cgroup;
pub mod driverfolders;
pub mod driverlimits;
pub mod enter;
pub mod hostfiles;
pub mod state;

// The decision's modules under the crate's own paths (`crate::plan`, …), as before the split.
use gpufence_core::{
    allocation, backend, config, exit, fsutil, inventory, ldso, logging, plan, quota, text,
};
