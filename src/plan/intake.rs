//! The one front door to a plan, used by `gpufence-runtime`, `gpufence hook` and `gpufence plan`:
//! the pod-sandbox check, the inventory (or none), the CDI specs, and [`super::plan`].
//!
//! The same decisions everywhere: a pod sandbox (pause) container never gets a GPU (pod
//! annotations reach it too); an unavailable inventory only matters when the container has an
//! allocation (then it is refused — never planned against a guess); CDI directories are read only
//! when the container names CDI devices, so the common create path reads no directories.
//!
//! How the inventory is obtained differs by caller (the runtime may initialise NVML when the
//! cache is stale; the hook must not — its threads would make `setns` impossible — and scans in a
//! child process), so the caller passes its loader.

use std::path::PathBuf;

use crate::allocation::AllocationError;
use crate::cdi::{CdiError, LoadedSpec};
use crate::config::Config;
use crate::inventory::Inventory;

use super::Plan;

/// Why no plan could be made. One line each, naming the container.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    /// The allocation is invalid (the inventory's own failure, if any, is named too: it may be
    /// why a device was not found).
    #[error("container {id}: {error}{}", inventory.as_ref().map(|i| format!(" (inventory unavailable: {i})")).unwrap_or_default())]
    Allocation {
        id: String,
        error: AllocationError,
        inventory: Option<String>,
    },
    /// The container has an allocation but the node's inventory could not be read.
    #[error("container {id}: inventory: {error}")]
    Inventory { id: String, error: String },
}

/// Where CDI specs come from.
#[derive(Debug, Clone)]
pub struct CdiSource {
    /// Directories with their priority (later wins).
    pub dirs: Vec<(PathBuf, u8)>,
    /// Read them even when the container names no CDI device (`gpufence plan` shows problems
    /// with the node's specs).
    pub always: bool,
}

impl Default for CdiSource {
    /// `/etc/cdi` then `/var/run/cdi`, read only when needed.
    fn default() -> CdiSource {
        CdiSource {
            dirs: crate::cdi::parse::default_spec_dirs(),
            always: false,
        }
    }
}

/// What the front door found.
#[derive(Debug)]
pub struct Intake {
    pub plan: Plan,
    /// The inventory the plan was made against (empty for a sandbox or when unavailable).
    pub inventory: Inventory,
    /// `Some(engine)` when the container is a pod sandbox (the plan is then empty).
    pub sandbox: Option<&'static str>,
    /// The inventory's failure, when the container had no allocation and so could run.
    pub inventory_error: Option<String>,
    /// CDI spec files that were skipped, with why.
    pub cdi_errors: Vec<CdiError>,
}

/// The plan for container `id` of `spec`, with the inventory from `load_inventory` (device
/// numbers are refreshed from `dev-root` here).
pub fn intake(
    cfg: &Config,
    spec: &serde_json::Value,
    id: &str,
    load_inventory: impl FnOnce(&Config) -> Result<Inventory, String>,
    cdi: &CdiSource,
) -> Result<Intake, IntakeError> {
    let mut out = Intake {
        plan: Plan {
            container_id: id.to_string(),
            ..Plan::default()
        },
        inventory: Inventory::empty(),
        sandbox: sandbox_kind(spec),
        inventory_error: None,
        cdi_errors: Vec::new(),
    };
    if let Some(kind) = out.sandbox {
        tracing::info!(container = id, kind, "pod sandbox: no GPU, spec untouched");
        return Ok(out);
    }
    let loaded = load_inventory(cfg).and_then(|mut inv| {
        crate::inventory::refresh_device_numbers(&mut inv, cfg).map_err(|e| e.to_string())?;
        Ok(inv)
    });
    match loaded {
        Ok(inv) => out.inventory = inv,
        Err(e) => out.inventory_error = Some(e),
    }
    let specs = if cdi.always || wants_cdi(spec) {
        let (specs, errors) = crate::cdi::load_spec_dirs(&cdi.dirs);
        for e in &errors {
            tracing::warn!(container = id, error = %e, "CDI spec skipped");
        }
        out.cdi_errors = errors;
        specs
    } else {
        Vec::<LoadedSpec>::new()
    };
    out.plan = super::plan(spec, id, &out.inventory, cfg, &specs).map_err(|error| {
        IntakeError::Allocation {
            id: id.to_string(),
            error,
            inventory: out.inventory_error.clone(),
        }
    })?;
    if let Some(e) = &out.inventory_error {
        if !out.plan.grants_nothing() {
            return Err(IntakeError::Inventory {
                id: id.to_string(),
                error: e.clone(),
            });
        }
        tracing::warn!(container = id, error = %e, "inventory unavailable; container has no allocation");
    }
    Ok(out)
}

/// Whether the spec names CDI devices (`cdi.k8s.io/*` annotations).
fn wants_cdi(spec: &serde_json::Value) -> bool {
    spec.get("annotations")
        .and_then(|a| a.as_object())
        .is_some_and(|a| {
            a.keys()
                .any(|k| k.starts_with(crate::cdi::parse::ANNOTATION_PREFIX))
        })
}

/// The CRI annotation marking a pod sandbox (pause) container, if this is one.
pub fn sandbox_kind(spec: &serde_json::Value) -> Option<&'static str> {
    let ann = spec.get("annotations")?;
    let is = |k: &str, v: &str| ann.get(k).and_then(|x| x.as_str()) == Some(v);
    if is("io.kubernetes.cri.container-type", "sandbox") {
        Some("containerd")
    } else if is("io.kubernetes.cri-o.ContainerType", "sandbox") {
        Some("cri-o")
    } else if is("io.kubernetes.docker.type", "podsandbox") {
        Some("dockershim")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg() -> Config {
        Config::default()
    }

    #[test]
    fn sandbox_gets_nothing_and_reads_no_inventory() {
        let spec = json!({"annotations": {"io.kubernetes.cri.container-type": "sandbox",
                                          "gpufence.dev/devices": "all"}});
        let i = intake(
            &cfg(),
            &spec,
            "c1",
            |_| panic!("inventory read"),
            &CdiSource::default(),
        )
        .unwrap();
        assert_eq!(i.sandbox, Some("containerd"));
        assert!(i.plan.grants_nothing());
    }

    #[test]
    fn unavailable_inventory_refuses_an_allocation() {
        let spec = json!({"annotations": {"gpufence.dev/devices": "0"}});
        let e = intake(
            &cfg(),
            &spec,
            "c1",
            |_| Err("no cache".into()),
            &CdiSource::default(),
        )
        .unwrap_err();
        let line = e.to_string();
        assert!(line.starts_with("container c1: "), "{line}");
        assert!(line.contains("inventory unavailable: no cache"), "{line}");
    }

    #[test]
    fn unavailable_inventory_lets_a_gpu_less_container_run() {
        let spec = json!({"process": {"env": ["PATH=/bin"]}});
        let i = intake(
            &cfg(),
            &spec,
            "c1",
            |_| Err("no cache".into()),
            &CdiSource::default(),
        )
        .unwrap();
        assert!(i.plan.grants_nothing());
        assert_eq!(i.inventory_error.as_deref(), Some("no cache"));
    }

    #[test]
    fn cdi_dirs_are_read_only_when_asked_for() {
        let missing = CdiSource {
            dirs: vec![(PathBuf::from("/nonexistent/gpufence-cdi"), 0)],
            always: false,
        };
        let spec = json!({});
        let i = intake(&cfg(), &spec, "c1", |_| Ok(Inventory::empty()), &missing).unwrap();
        assert!(i.cdi_errors.is_empty());
    }
}
