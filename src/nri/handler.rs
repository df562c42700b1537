//! What the plugin asks of gpufence: the adjustment for a container being created (or a
//! refusal), and word of containers that are gone. [`from_config`] builds the handler
//! `gpufence nri` runs.

use super::api::{Container, ContainerAdjustment, PodSandbox};
use crate::config::Config;

/// Why a container is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// StopContainer: its processes were stopped; it may still be removed later.
    Stopped,
    /// RemoveContainer: it no longer exists (what `gpufence-runtime delete` sees).
    Removed,
}

/// The plugin's decisions. Called from one thread per request, concurrently.
pub trait Handler: Send + Sync {
    /// The adjustment for container `ctr` of pod `pod` being created; `Err(reason)` refuses the
    /// container: the CreateContainer call fails with `reason` (one line), which the runtime
    /// reports to its CRI client.
    fn create_container(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<ContainerAdjustment, String>;

    /// Container `id` stopped or was removed (clean what creating it left behind).
    fn container_gone(&self, id: &str, why: Gone);

    /// The runtime's pods and containers when the plugin (re)connects (all Synchronize parts
    /// together). Default: nothing to do.
    fn synchronize(&self, _pods: &[PodSandbox], _containers: &[Container]) {}
}

/// The handler `gpufence nri` runs, from gpufence's configuration.
pub fn from_config(cfg: Config) -> PlanHandler {
    PlanHandler { cfg }
}

/// The plan's front door ([`crate::plan::intake`]) for each container.
#[derive(Debug)]
pub struct PlanHandler {
    cfg: Config,
}

impl Handler for PlanHandler {
    fn create_container(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<ContainerAdjustment, String> {
        let spec = spec_view(pod, ctr);
        let intake = crate::plan::intake::intake(
            &self.cfg,
            &spec,
            &ctr.id,
            |cfg| crate::inventory::load(cfg).map_err(|e| e.to_string()),
            &crate::plan::intake::CdiSource::default(),
            None,
        )
        .map_err(|e| e.to_string())?;
        let untouched = intake.sandbox.is_some()
            || (intake.plan.grants_nothing()
                && intake.plan.env_overrides.is_empty()
                && !names_devices(ctr));
        if untouched {
            tracing::info!(container = %ctr.id, pod = %pod.name, "NRI: no GPU: container untouched");
            return Ok(ContainerAdjustment::default());
        }
        // TODO(phase 2): render the plan (device nodes, cgroup rules, mounts, env, hooks) as the
        // adjustment and write its host files; until then a container the plan touches is refused.
        let why = format!(
            "container {}: gpufence nri: plan rendering not built yet (this container asks for a GPU)",
            ctr.id
        );
        tracing::warn!(container = %ctr.id, pod = %pod.name, "NRI: refused: {why}");
        Err(why)
    }

    fn container_gone(&self, id: &str, why: Gone) {
        // Nothing is created on the host for a container until the plan is rendered.
        tracing::debug!(container = id, ?why, "NRI: container gone");
    }
}

/// Whether the container names devices the plan did not grant: CDI devices, or device nodes
/// (kubelet's device plugins hand GPUs over this way).
fn names_devices(ctr: &Container) -> bool {
    !ctr.cdi_devices.is_empty() || ctr.linux.as_ref().is_some_and(|l| !l.devices.is_empty())
}

/// The parts of an OCI `config.json` the allocation reads (annotations, process env, mounts),
/// built from what NRI says of the container: the pod's annotations overlaid by the
/// container's own (which carry the engine's container-type key).
pub fn spec_view(pod: &PodSandbox, ctr: &Container) -> serde_json::Value {
    let mut annotations = serde_json::Map::new();
    for (k, v) in pod.annotations.iter().chain(ctr.annotations.iter()) {
        annotations.insert(k.clone(), serde_json::Value::String(v.clone()));
    }
    let mounts: Vec<serde_json::Value> = ctr
        .mounts
        .iter()
        .map(|m| serde_json::json!({"destination": m.destination, "source": m.source, "type": m.r#type}))
        .collect();
    serde_json::json!({
        "annotations": annotations,
        "process": {"env": ctr.env},
        "mounts": mounts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nri::api::{CdiDevice, Mount};

    fn cfg(dir: &std::path::Path) -> Config {
        Config {
            state_dir: dir.join("state"),
            dev_root: dir.join("dev-root"),
            driver_root: dir.join("driver-root"),
            nvml_library: dir.join("no-nvml.so").display().to_string(),
            ..Config::default()
        }
    }

    fn ctr(annotations: &[(&str, &str)], env: &[&str]) -> Container {
        Container {
            id: "c1".into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            env: env.iter().map(|e| e.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn spec_view_overlays_container_annotations_on_the_pod_s() {
        let pod = PodSandbox {
            annotations: [("a", "pod"), ("b", "pod")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        let mut c = ctr(&[("b", "ctr")], &["K=V"]);
        c.mounts.push(Mount {
            destination: "/d".into(),
            source: "/s".into(),
            ..Default::default()
        });
        let v = spec_view(&pod, &c);
        assert_eq!(
            v["annotations"],
            serde_json::json!({"a": "pod", "b": "ctr"})
        );
        assert_eq!(v["process"]["env"], serde_json::json!(["K=V"]));
        assert_eq!(v["mounts"][0]["destination"], "/d");
        assert_eq!(v["mounts"][0]["source"], "/s");
    }

    #[test]
    fn no_gpu_is_untouched_and_a_gpu_request_is_refused_until_rendering_exists() {
        let dir = tempfile::tempdir().unwrap();
        let h = from_config(cfg(dir.path()));
        let pod = PodSandbox::default();
        let adj = h.create_container(&pod, &ctr(&[], &["PATH=/bin"])).unwrap();
        assert_eq!(adj, ContainerAdjustment::default());
        // A GPU asked for in a pod annotation (no inventory here: refused either way, never
        // created with a GPU and never untouched).
        let pod_gpu = PodSandbox {
            annotations: [("gpufence.dev/devices".to_string(), "0".to_string())].into(),
            ..Default::default()
        };
        let err = h.create_container(&pod_gpu, &ctr(&[], &[])).unwrap_err();
        assert!(err.contains("c1"), "{err}");
        // CDI devices or device nodes the plan did not grant: refused.
        let mut c = ctr(&[], &[]);
        c.cdi_devices.push(CdiDevice {
            name: "nvidia.com/gpu=0".into(),
        });
        let err = h.create_container(&pod, &c).unwrap_err();
        assert!(err.contains("plan rendering not built yet"), "{err}");
    }

    #[test]
    fn a_pod_sandbox_is_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let h = from_config(cfg(dir.path()));
        let c = ctr(
            &[
                ("io.kubernetes.cri.container-type", "sandbox"),
                ("gpufence.dev/devices", "all"),
            ],
            &[],
        );
        assert_eq!(
            h.create_container(&PodSandbox::default(), &c).unwrap(),
            ContainerAdjustment::default()
        );
    }
}
