//! `gpufence hook memory-limits`: the driver memory limits of a container, set from a
//! createRuntime hook once runc has created its cgroup ([`crate::driverlimits`] does the work).

use std::io::Read;
use std::path::Path;

use crate::backend::DriverLimit;
use crate::config::Config;
use crate::driverlimits::{BackendError, apply, container_namespace};
use crate::exit::Exit;

/// `gpufence hook memory-limits --limit <uuid>=<bytes>…` (createRuntime; OCI state on stdin).
pub fn hook_main(
    config: Option<&Path>,
    limits: &[String],
    stdin: &mut impl Read,
) -> Result<(), Exit> {
    let st = super::state::read_oci_state(stdin)
        .map_err(|e| Exit::invalid(e.to_string()))
        .and_then(|raw| {
            super::state::parse_state(&raw).map_err(|e| Exit::invalid(e.to_string()))
        })?;
    let limits: Vec<DriverLimit> = limits
        .iter()
        .map(|a| crate::backend::parse_limit(a))
        .collect::<Result<_, _>>()
        .map_err(Exit::invalid)?;
    let cfg = Config::load(config)?;
    crate::logging::init(&cfg);
    let id = st.id.clone();
    let fail = |e: BackendError| {
        tracing::error!(container = %id, error = %e, "refused: driver memory limits not applied");
        Exit::env(format!("hook memory-limits: container {id}: {e}"))
    };
    let pid = st.pid.filter(|p| *p > 0).ok_or_else(|| {
        Exit::invalid(format!(
            "hook memory-limits: container {id}: no pid in the OCI state"
        ))
    })?;
    let (spec, _) =
        super::state::read_config(&st.bundle).map_err(|e| Exit::invalid(e.to_string()))?;
    let ns = container_namespace(pid, &spec, &id).map_err(fail)?;
    let mut lib = crate::inventory::limits::nvml::Nvml::open(&cfg.nvml_library)
        .map_err(|e| fail(e.into()))?;
    apply(&cfg, &id, &ns.display().to_string(), &limits, &mut lib).map_err(fail)
}
