//! The one front door to a plan, used by `gpufence-runtime`, `gpufence hook`, `gpufence nri` and
//! `gpufence plan`: the request parsed once ([`Inputs`]), the pod-sandbox check, the inventory
//! (or none), the CDI specs, kubelet's record, [`super::plan_request`], and what the plan needs
//! of the host to be final (the MPS daemon's answer) — so the plan that leaves here is what every
//! applier renders, and none changes it. One step is left to the node, explicitly: the driver
//! folders' directory is named from the driver files' identities and made on the host
//! (`gpufence_node::driverfolders::settle_intake`, which sets `plan.driver_folders`); this
//! module stats no driver file.
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
use crate::allocation::input::Inputs;
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
    /// The container's GPUs are shared through MPS but the control daemon does not answer.
    #[error("container {id}: {error}")]
    Mps { id: String, error: String },
}

impl IntakeError {
    /// How a refusal for this error is counted ([`crate::status::refusals`]).
    pub fn reason(&self) -> crate::exit::Reason {
        use crate::exit::Reason;
        match self {
            IntakeError::Allocation { .. } => Reason::Allocation,
            IntakeError::Inventory { .. } => Reason::Inventory,
            IntakeError::Mps { .. } => Reason::Host,
        }
    }
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

impl CdiSource {
    /// The node's CDI directories (`cdi.spec-dirs`), read only when needed.
    pub fn of(cfg: &Config) -> CdiSource {
        CdiSource {
            dirs: cfg.cdi.dirs(),
            always: false,
        }
    }
}

/// What the front door found.
#[derive(Debug)]
pub struct Intake {
    /// The request, parsed once: what the appliers read of the container besides the plan.
    pub request: Inputs,
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
/// numbers are refreshed from `dev-root` here) and kubelet's record of the container
/// (`kubelet_checkpoint` overrides the `kubelet.checkpoint` key: `gpufence plan`).
pub fn intake(
    cfg: &Config,
    spec: &serde_json::Value,
    id: &str,
    load_inventory: impl FnOnce(&Config) -> Result<Inventory, String>,
    cdi: &CdiSource,
    kubelet_checkpoint: Option<&std::path::Path>,
) -> Result<Intake, IntakeError> {
    let request = Inputs::from_spec(spec).map_err(|error| IntakeError::Allocation {
        id: id.to_string(),
        error,
        inventory: None,
    })?;
    intake_request(cfg, request, id, load_inventory, cdi, kubelet_checkpoint)
}

/// [`intake`] for a request parsed elsewhere (the NRI plugin builds it from its own message).
pub fn intake_request(
    cfg: &Config,
    request: Inputs,
    id: &str,
    load_inventory: impl FnOnce(&Config) -> Result<Inventory, String>,
    cdi: &CdiSource,
    kubelet_checkpoint: Option<&std::path::Path>,
) -> Result<Intake, IntakeError> {
    let mut out = Intake {
        plan: Plan {
            container_id: id.to_string(),
            ..Plan::default()
        },
        inventory: Inventory::empty(),
        sandbox: request.sandbox_kind(),
        request,
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
    // GPU device nodes in the spec: kubelet's CDI devices are resolved through the specs.
    let gpu_nodes = out.request.devices.iter().any(|d| {
        crate::allocation::spec_devices::node_of(&out.inventory, (d.kind, d.major, d.minor))
            .is_some()
    });
    let specs = if cdi.always || out.request.wants_cdi() || gpu_nodes {
        let (specs, errors) = crate::cdi::load_spec_dirs(&cdi.dirs);
        for e in &errors {
            tracing::warn!(container = id, error = %e, "CDI spec skipped");
        }
        out.cdi_errors = errors;
        specs
    } else {
        Vec::<LoadedSpec>::new()
    };
    // What kubelet recorded for this container (trust-env = "kubelet"; a small file read).
    let kubelet = crate::allocation::record::load(cfg, &out.request, kubelet_checkpoint);
    let planned = super::plan_request(&out.request, id, &out.inventory, cfg, &specs, &kubelet);
    out.plan = planned.map_err(|error| IntakeError::Allocation {
        id: id.to_string(),
        error,
        inventory: out.inventory_error.clone(),
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
    // MPS: the daemon must be up; its defaults join the plan's notes (crate::mps).
    if let Some(m) = out.plan.mps.as_mut() {
        let notes = crate::mps::probe(cfg, m).map_err(|e| IntakeError::Mps {
            id: id.to_string(),
            error: e.to_string(),
        })?;
        out.plan.notes.extend(notes);
    }
    Ok(out)
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
            None,
        )
        .unwrap();
        assert_eq!(i.sandbox, Some("containerd"));
        assert!(i.plan.grants_nothing());
    }

    #[test]
    fn another_engines_sandbox_key_does_not_make_a_container_a_sandbox() {
        let kind = |s: &serde_json::Value| Inputs::from_spec(s).unwrap().sandbox_kind();
        // CRI-O passes pod annotations: a tenant can add containerd's key.
        let spec = json!({"annotations": {"io.kubernetes.cri.container-type": "sandbox",
                                          "io.kubernetes.cri-o.ContainerType": "container"}});
        assert_eq!(kind(&spec), None);
        let spec = json!({"annotations": {"io.kubernetes.cri.container-type": "container",
                                          "io.kubernetes.cri-o.ContainerType": "sandbox"}});
        assert_eq!(kind(&spec), None);
        let spec = json!({"annotations": {"io.kubernetes.cri-o.ContainerType": "sandbox",
                                          "io.kubernetes.docker.type": "sandbox"}});
        assert_eq!(kind(&spec), None);
        let spec = json!({"annotations": {"io.kubernetes.cri-o.ContainerType": "sandbox"}});
        assert_eq!(kind(&spec), Some("cri-o"));
        let spec = json!({"annotations": {"io.kubernetes.cri.container-type": "sandbox",
                                          "io.kubernetes.cri-o.ContainerType": "sandbox"}});
        assert_eq!(kind(&spec), Some("containerd"));
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
            None,
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
            None,
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
        let i = intake(
            &cfg(),
            &spec,
            "c1",
            |_| Ok(Inventory::empty()),
            &missing,
            None,
        )
        .unwrap();
        assert!(i.cdi_errors.is_empty());
    }
}
