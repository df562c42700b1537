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
/// MIG capability), which the v2 gate keeps to the granted ones.
pub fn plan(
    cfg: &Config,
    spec: &serde_json::Value,
    id: &str,
) -> Result<(Plan, Vec<u32>), HookError> {
    let mut inv = inventory(cfg, id)?;
    crate::inventory::refresh_device_numbers(&mut inv, cfg)
        .map_err(|e| HookError::Inventory(e.to_string()))?;
    let specs = cdi_specs(id);
    let plan = crate::plan::plan(spec, id, &inv, cfg, &specs)?;
    Ok((plan, inventory_majors(&inv)))
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

/// CDI specs of the host (a broken file only costs the devices it defines).
fn cdi_specs(id: &str) -> Vec<crate::cdi::LoadedSpec> {
    let (specs, errors) =
        crate::cdi::parse::load_spec_dirs(&crate::cdi::parse::default_spec_dirs());
    for e in errors {
        warn!(container = id, error = %e, "CDI spec skipped");
    }
    specs
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
