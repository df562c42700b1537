//! The hook's plan: the same inputs and the same `plan()` as the runtime.
//!
//! The inventory comes from the on-disk cache. NVML is never initialised in the hook process (its
//! threads would make `setns` impossible): when the cache is stale, `gpufence inventory --json`
//! runs as a child process (it rescans and rewrites the cache) and its output is used. Device
//! numbers are then refreshed from `dev-root`, CDI specs are read from the CDI directories.

use std::path::Path;
use std::process::Command;

use tracing::info;

use crate::allocation::input::Inputs;
use crate::config::Config;
use crate::error::HookError;
use crate::inventory::Inventory;
use crate::plan::Plan;
use crate::plan::intake::{CdiSource, IntakeError, intake};

/// Largest inventory JSON accepted from the child.
const MAX_INVENTORY_BYTES: usize = 16 << 20;

/// The plan for this container and the majors of every device node of the node (GPU, control,
/// MIG capability), which the v2 gate keeps to the granted ones: the same front door as
/// gpufence-runtime ([`crate::plan::intake`]), with the inventory from the cache or a child scan.
pub fn plan(
    cfg: &Config,
    spec: &serde_json::Value,
    id: &str,
) -> Result<(Plan, Vec<u32>, Inputs), HookError> {
    let load = |cfg: &Config| {
        inventory(cfg, id).map_err(|e| match e {
            HookError::Inventory(s) => s,
            other => other.to_string(),
        })
    };
    match intake(cfg, spec, id, load, &CdiSource::of(cfg), None) {
        Ok(mut i) => {
            // The driver folders, named and (once per driver) made on the host side.
            crate::driverfolders::settle_intake(cfg, &mut i, crate::driverfolders::Mode::Prepare);
            Ok((i.plan, i.inventory.device_majors(), i.request))
        }
        Err(IntakeError::Allocation {
            error,
            inventory: None,
            ..
        }) => Err(HookError::Allocation(error)),
        Err(IntakeError::Allocation {
            error,
            inventory: Some(inv),
            ..
        }) => Err(HookError::Plan(format!("{error} (inventory: {inv})"))),
        Err(IntakeError::Inventory { error, .. }) => Err(HookError::Inventory(error)),
        Err(IntakeError::Mps { error, .. }) => Err(HookError::Plan(error)),
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
    scan_in_child(&exe, cfg.source.as_deref(), cfg.timeouts.inventory())
}

/// `gpufence [--config C] inventory --json` with a clean env, killed past `deadline`
/// (`timeouts.inventory`).
fn scan_in_child(
    exe: &Path,
    config: Option<&Path>,
    deadline: std::time::Duration,
) -> Result<Inventory, HookError> {
    let mut cmd = Command::new(exe);
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    cmd.args(["inventory", "--json"])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    let what = format!("{} inventory", exe.display());
    let out =
        crate::child::output_with_deadline(&what, &mut cmd, deadline, MAX_INVENTORY_BYTES + 1)
            .map_err(|e| HookError::Inventory(e.to_string()))?;
    if !out.success() {
        let err = String::from_utf8_lossy(&out.err);
        return Err(HookError::Inventory(
            err.lines()
                .last()
                .unwrap_or("scan failed")
                .trim()
                .to_string(),
        ));
    }
    if out.out.len() > MAX_INVENTORY_BYTES {
        return Err(HookError::Inventory("inventory output too large".into()));
    }
    serde_json::from_slice(&out.out)
        .map_err(|e| HookError::Inventory(format!("inventory output: {e}")))
}
