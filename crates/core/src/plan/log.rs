//! The plan as one log line (one line per decision, whichever applier made it).

use super::Plan;

/// One line per decision: container id, dialects, devices, quotas (the runtime's and the NRI
/// plugin's).
pub fn log_decision(id: &str, plan: &Plan) {
    match &plan.allocation {
        None => tracing::info!(
            container = id,
            env_overrides = ?plan.env_overrides,
            notes = ?plan.notes,
            neutralised = ?plan.neutralised,
            kubelet = plan.kubelet.as_ref().map_or("-", |k| k.status.as_str()),
            "no allocation: no GPU"
        ),
        Some(a) => {
            let dialects: Vec<&str> = a.dialects.iter().map(|d| d.name()).collect();
            let devices: Vec<String> = a
                .devices
                .iter()
                .map(|d| match d.device {
                    crate::allocation::DeviceRef::Gpu { index } => format!("{index}={}", d.uuid),
                    crate::allocation::DeviceRef::Mig { gpu, mig } => {
                        format!("{gpu}:{mig}={}", d.uuid)
                    }
                })
                .collect();
            let quotas: Vec<String> = a
                .devices
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    format!(
                        "{i}:mem={}:cores={}",
                        d.memory_limit.map_or("-".to_string(), |m| m.to_string()),
                        d.cores.map_or("-".to_string(), |c| c.to_string())
                    )
                })
                .collect();
            let backends: Vec<String> = plan
                .memory_backends
                .iter()
                .map(|b| format!("{}:{}", b.ordinal, b.backend.name()))
                .collect();
            tracing::info!(
                container = id,
                memory_backends = ?backends,
                mps = plan.mps.as_ref().map_or("no", |m| m.requested_by.as_str()),
                notes = ?plan.notes,
                dialects = ?dialects,
                devices = ?devices,
                quotas = ?quotas,
                cores_burst = a.cores_burst,
                oversubscribe = a.oversubscribe,
                sources = ?a
                    .sources
                    .iter()
                    .map(|s| format!("{}:{}:{:?}:{}", s.facet, s.dialect, s.origin, s.key))
                    .collect::<Vec<_>>(),
                neutralised = ?plan.neutralised,
                device_nodes = plan.edits.device_nodes.len(),
                mounts = plan.edits.mounts.len(),
                "allocation applied"
            );
        }
    }
}
