//! The hook's plan: the same inputs and the same `plan()` as the runtime.
//!
//! Inventory comes from the on-disk cache (NVML is never initialised on this path: it would start
//! threads before `setns`), device numbers are refreshed from `dev-root`, CDI specs are read from
//! the CDI directories.

use super::HookError;
use crate::plan::Plan;

/// The plan for this container and the majors of every device node of the node (GPU, control,
/// MIG capability), which the v2 gate keeps to the granted ones.
pub fn plan(
    cfg: &crate::config::Config,
    spec: &serde_json::Value,
    id: &str,
) -> Result<(Plan, Vec<u32>), HookError> {
    let _ = (cfg, spec, id);
    Err(HookError::Inventory(
        "inventory cache loader not available in this build".into(),
    ))
}

/// Majors of all device nodes the inventory knows.
pub fn inventory_majors(inv: &crate::inventory::Inventory) -> Vec<u32> {
    let mut v: Vec<u32> = inv
        .gpus
        .iter()
        .flat_map(|g| {
            std::iter::once(g.node.major).chain(
                g.mig_devices
                    .iter()
                    .flat_map(|m| m.caps.iter().map(|c| c.major)),
            )
        })
        .chain(inv.control_nodes.iter().map(|n| n.major))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}
