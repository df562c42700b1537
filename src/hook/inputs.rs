//! The hook's plan: the same inputs and the same `plan()` as the runtime.
//!
//! The inventory comes from the on-disk cache. NVML is never initialised in the hook process (its
//! threads would make `setns` impossible): when the cache is stale, `gpufence inventory --json`
//! runs as a child process (it rescans and rewrites the cache) and its output is used. Device
//! numbers are then refreshed from `dev-root`, CDI specs are read from the CDI directories.

use std::path::Path;
use std::process::{Command, Stdio};

use tracing::{info, warn};

use super::HookError;
use crate::config::Config;
use crate::inventory::Inventory;
use crate::plan::Plan;

/// Largest inventory JSON accepted from the child.
const MAX_INVENTORY_BYTES: usize = 16 << 20;

/// The plan for this container and the majors of every device node of the node (GPU, control,
/// MIG capability), which the v2 gate keeps to the granted ones. Same decisions as
/// gpufence-runtime: a pod sandbox (pause) container never gets a GPU; an unavailable inventory
/// only matters when the container has an allocation.
pub fn plan(
    cfg: &Config,
    spec: &serde_json::Value,
    id: &str,
) -> Result<(Plan, Vec<u32>), HookError> {
    let nothing = || Plan {
        container_id: id.to_string(),
        ..Plan::default()
    };
    if let Some(kind) = crate::runtime::sandbox_kind(spec) {
        info!(container = id, kind, "pod sandbox: no GPU");
        return Ok((nothing(), Vec::new()));
    }
    let (inv, inventory_error) = match inventory(cfg, id).and_then(|mut inv| {
        crate::inventory::refresh_device_numbers(&mut inv, cfg)
            .map_err(|e| HookError::Inventory(e.to_string()))?;
        Ok(inv)
    }) {
        Ok(inv) => (inv, None),
        Err(e) => (empty_inventory(), Some(e)),
    };
    let specs = crate::runtime::load_cdi_specs(spec);
    let kubelet = crate::kubelet::load(cfg, spec, None);
    let plan = match crate::plan::plan_with(spec, id, &inv, cfg, &specs, &kubelet) {
        Ok(p) => p,
        Err(e) => {
            return Err(match inventory_error {
                Some(inv) => HookError::Plan(format!("{e} ({inv})")),
                None => HookError::Allocation(e),
            });
        }
    };
    if let Some(e) = inventory_error {
        if !plan.grants_nothing() {
            return Err(e);
        }
        warn!(container = id, error = %e, "inventory unavailable; container has no allocation");
    }
    Ok((plan, inventory_majors(&inv)))
}

fn empty_inventory() -> Inventory {
    Inventory {
        driver_version: String::new(),
        cuda_driver_version: 0,
        gpus: Vec::new(),
        control_nodes: Vec::new(),
        driver_files: Vec::new(),
    }
}

fn inventory(cfg: &Config, id: &str) -> Result<Inventory, HookError> {
    if let Some(inv) =
        crate::inventory::cached(cfg).map_err(|e| HookError::Inventory(e.to_string()))?
    {
        return Ok(inv);
    }
    info!(
        container = id,
        "inventory cache stale: rescanning in a child process"
    );
    let exe = std::env::current_exe()
        .map_err(|e| HookError::Inventory(format!("locating gpufence: {e}")))?;
    scan_in_child(&exe, cfg.source.as_deref())
}

/// `gpufence [--config C] inventory --json` with a clean env.
fn scan_in_child(exe: &Path, config: Option<&Path>) -> Result<Inventory, HookError> {
    let mut cmd = Command::new(exe);
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    let out = cmd
        .args(["inventory", "--json"])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| HookError::Inventory(format!("running {} inventory: {e}", exe.display())))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(HookError::Inventory(
            err.lines()
                .last()
                .unwrap_or("scan failed")
                .trim()
                .to_string(),
        ));
    }
    if out.stdout.len() > MAX_INVENTORY_BYTES {
        return Err(HookError::Inventory("inventory output too large".into()));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| HookError::Inventory(format!("inventory output: {e}")))
}

/// Majors of all device nodes the inventory knows.
pub fn inventory_majors(inv: &Inventory) -> Vec<u32> {
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
