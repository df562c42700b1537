//! What the node supports for driver memory limits (NVML R615 `nvmlDeviceSetMemoryLimits_v1` on
//! a container's cgroup v2 directory): probed once with NVML when the inventory is taken, and
//! recorded in the inventory cache. [`nvml`] holds the calls (behind a trait with a recording
//! fake) and [`cgroup`] the cgroup layout; the plan's quota backend ([`crate::backend`]) reads
//! the support, the appliers ([`crate::driverlimits`]) make the calls.

use crate::config::Config;
use crate::inventory::Inventory;

pub mod cgroup;
pub mod nvml;
pub mod support;

pub use cgroup::CgroupMode;
pub use support::DriverSupport;

/// Inventory probe (NVML initialised): the cgroup layout and, per GPU, whether NVML accepts
/// memory limits. Never fails: what cannot be probed is unsupported.
pub fn probe(cfg: &Config, inv: &Inventory) -> DriverSupport {
    let (cgroup, root) = cgroup::mode();
    let mut s = DriverSupport {
        cgroup,
        ..DriverSupport::default()
    };
    let Ok(mut lib) = nvml::Nvml::open(&cfg.nvml_library) else {
        return s;
    };
    s.nvml_exports = true;
    let ns = root.unwrap_or_else(|| std::path::PathBuf::from("/sys/fs/cgroup"));
    for g in inv.gpus.iter().filter(|g| !g.mig_enabled) {
        use nvml::MemoryLimits;
        match lib.get(&g.uuid, &ns.display().to_string()) {
            Ok(_) => s.gpus.push(g.uuid.clone()),
            Err(e) => tracing::debug!(gpu = %g.uuid, error = %e, "no NVML memory limits"),
        }
    }
    s
}
