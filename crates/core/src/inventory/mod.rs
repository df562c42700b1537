//! What the node has: GPUs and MIG devices (from NVML), control device nodes (under `dev-root`),
//! and driver files by capability (under `driver-root`).
//!
//! The inventory is cached under `state-dir` so the container-create path never initialises NVML.
//! Its types are plain data shared by every stage ([`types`]); the NVML and filesystem scanners
//! live in submodules.

use crate::config::Config;

mod cache;
pub mod error;
pub mod files;
mod gpus;
pub mod limits;
pub mod types;

pub use cache::{CACHE_FILE, CacheKey, Memo, cache_key};
pub use error::InventoryError;
pub use types::{Capability, DeviceNode, DriverFile, FileKind, Gpu, Inventory, MigDevice};

/// A fresh inventory: NVML for GPUs and MIG devices, `dev-root` for device nodes, `proc-root` for
/// MIG capability minors, `driver-root` for driver files. Initialises NVML.
pub fn scan(cfg: &Config) -> Result<Inventory, InventoryError> {
    let mut inv = gpus::scan(cfg)?;
    inv.control_nodes = files::control_nodes(cfg)?;
    inv.driver_files = files::driver_files(cfg, &inv.driver_version);
    inv.memory_limits = limits::probe(cfg, &inv);
    Ok(inv)
}

/// The inventory from the cache under `state-dir` when it is still valid (no NVML), else a fresh
/// [`scan`] that is written back to the cache. The cache is invalid when the driver version line
/// (`proc-root/proc/driver/nvidia/version`), the set of `/dev/nvidia*` nodes under `dev-root`
/// with their device numbers, or the configured roots changed. A cache that cannot be written is
/// logged and otherwise ignored.
pub fn load(cfg: &Config) -> Result<Inventory, InventoryError> {
    let key = cache::cache_key(cfg)?;
    if let Some(inv) = cache::read(cfg, &key) {
        tracing::debug!(cache = %cache::path(cfg).display(), "inventory from cache");
        return Ok(inv);
    }
    scan_and_cache(cfg, &key)
}

impl Memo {
    /// The inventory, as [`load`] gives it, the cache's parse kept between calls (see [`Memo`]).
    pub fn load(&self, cfg: &Config) -> Result<Inventory, InventoryError> {
        match self.cached(cfg)? {
            Ok(inv) => Ok(inv),
            Err(key) => scan_and_cache(cfg, &key),
        }
    }
}

/// A fresh [`scan`], written back to the cache under `key`.
fn scan_and_cache(cfg: &Config, key: &CacheKey) -> Result<Inventory, InventoryError> {
    let inv = scan(cfg)?;
    match cache::write(cfg, key, &inv) {
        Ok(()) => tracing::info!(
            cache = %cache::path(cfg).display(),
            gpus = inv.gpus.len(),
            driver = %inv.driver_version,
            "inventory scanned and cached"
        ),
        Err(e) => tracing::warn!(error = %e, "inventory cache not written"),
    }
    Ok(inv)
}

/// The cached inventory when it is still valid, else `None`. Never initialises NVML (the OCI
/// hook must stay single-threaded until it has joined the container's mount namespace).
pub fn cached(cfg: &Config) -> Result<Option<Inventory>, InventoryError> {
    let key = cache::cache_key(cfg)?;
    Ok(cache::read(cfg, &key))
}

/// Re-read the device numbers of every device node (GPUs, MIG capabilities, control nodes) from
/// `dev-root` now: the create path uses live numbers, never cached ones.
pub fn refresh_device_numbers(inv: &mut Inventory, cfg: &Config) -> Result<(), InventoryError> {
    let _ = cfg;
    for g in &mut inv.gpus {
        files::restat(&mut g.node)?;
        for m in &mut g.mig_devices {
            for c in &mut m.caps {
                files::restat(c)?;
            }
        }
    }
    for n in &mut inv.control_nodes {
        files::restat(n)?;
    }
    Ok(())
}
