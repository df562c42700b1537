//! What the plugin asks of gpufence: the adjustment for a container being created (or a
//! refusal), and word of containers that are gone. [`from_config`] builds the handler
//! `gpufence nri` runs.

use super::api::{Container, ContainerAdjustment, PodSandbox};
use crate::config::Config;
use crate::exit::Reason;
pub use gpufence_nri_stub::{Gone, Handler};

/// The handler `gpufence nri` runs, from gpufence's configuration. The inventory cache is
/// warmed here (NVML is initialised, if at all, at start — not on a container's create path).
pub fn from_config(cfg: Config) -> PlanHandler {
    match crate::inventory::load(&cfg) {
        Ok(inv) => {
            tracing::info!(gpus = inv.gpus.len(), driver = %inv.driver_version, "NRI: inventory ready")
        }
        Err(e) => {
            tracing::warn!(error = %e, "NRI: inventory unavailable; GPU containers will be refused until it is")
        }
    }
    PlanHandler {
        cfg,
        load_inventory: |cfg| crate::inventory::load(cfg).map_err(|e| e.to_string()),
    }
}

/// How the handler reads the node's inventory.
pub type InventoryLoader = fn(&Config) -> Result<crate::inventory::Inventory, String>;

/// The plan's front door ([`crate::plan::intake`]) for each container, rendered as the
/// adjustment ([`super::adjust`]).
#[derive(Debug)]
pub struct PlanHandler {
    cfg: Config,
    /// The cache under `state-dir`, as the runtime reads it (warmed at start).
    load_inventory: InventoryLoader,
}

/// A refusal: how it is counted, and the one line the runtime reports.
type Refusal = (Reason, String);

impl PlanHandler {
    /// The decision for one container: the request from NRI's message, the plan, its
    /// adjustment, and (when the plan grants anything) its host files and status record —
    /// written before the answer, so the container never starts without its quota.
    fn decide(&self, pod: &PodSandbox, ctr: &Container) -> Result<ContainerAdjustment, Refusal> {
        let id = ctr.id.as_str();
        if !crate::text::valid_container_id(id) {
            let short = crate::text::short(id);
            return Err((
                Reason::Spec,
                format!("container id {short:?}: not a valid container id"),
            ));
        }
        let request = super::request::inputs(pod, ctr)
            .map_err(|e| (Reason::Allocation, format!("container {id}: {e}")))?;
        let intake = crate::plan::intake::intake_request(
            &self.cfg,
            request,
            id,
            self.load_inventory,
            &crate::plan::intake::CdiSource::of(&self.cfg),
            None,
        )
        .map_err(|e| (e.reason(), e.to_string()))?;
        if intake.sandbox.is_some() {
            return Ok(ContainerAdjustment::default());
        }
        let plan = &intake.plan;
        crate::plan::log_decision(id, plan);
        let adjustment = super::adjust::render(&self.cfg, plan, ctr)
            .map_err(|e| (Reason::Spec, format!("container {id}: gpufence nri: {e}")))?;
        if plan.state_dir.is_some() || !plan.host_files.is_empty() {
            crate::hostfiles::write_host_files(&self.cfg, id, plan).map_err(|e| {
                let reason = if e.code() == 1 {
                    Reason::Spec
                } else {
                    Reason::Host
                };
                (reason, e.to_string())
            })?;
            crate::state::meta::record(
                plan,
                &intake.request.annotations,
                crate::state::meta::Locator::default(),
            );
        }
        Ok(adjustment)
    }
}

impl Handler for PlanHandler {
    fn create_container(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<ContainerAdjustment, String> {
        let t = std::time::Instant::now();
        match self.decide(pod, ctr) {
            Ok(adjustment) => {
                let decision_us = t.elapsed().as_micros() as u64;
                let untouched = adjustment == ContainerAdjustment::default();
                tracing::info!(
                    container = %ctr.id,
                    pod = %pod.name,
                    namespace = %pod.namespace,
                    untouched,
                    devices = adjustment.linux.as_ref().map_or(0, |l| l.devices.len()),
                    mounts = adjustment.mounts.len(),
                    env = adjustment.env.len(),
                    decision_us,
                    "NRI: adjustment decided in {:.3} ms",
                    decision_us as f64 / 1000.0
                );
                Ok(adjustment)
            }
            Err((reason, line)) => {
                crate::state::refusals::count(&self.cfg.state_dir, reason);
                tracing::error!(
                    container = %ctr.id,
                    pod = %pod.name,
                    namespace = %pod.namespace,
                    reason = reason.as_str(),
                    decision_us = t.elapsed().as_micros() as u64,
                    error = %line,
                    "refused"
                );
                Err(line)
            }
        }
    }

    fn container_started(&self, _pod: &PodSandbox, ctr: &Container) {
        // NRI gives no pid at create: the status record learns it now, so `gpufence ps` can
        // reach the container's accounting region (the hook mode records its pid the same way).
        let id = ctr.id.as_str();
        if ctr.pid <= 1 || !crate::text::valid_container_id(id) {
            return;
        }
        let dir = self.cfg.container_state_dir(id);
        let Ok(bytes) = std::fs::read(dir.join(crate::state::meta::FILE_NAME)) else {
            return; // no GPU (nothing recorded)
        };
        let recorded = crate::state::meta::Meta::parse(&bytes).and_then(|mut m| {
            m.locator.pid = Some(ctr.pid);
            crate::state::meta::write(&dir, &m).map_err(|e| e.to_string())
        });
        if let Err(e) = recorded {
            tracing::warn!(container = id, error = %e, "NRI: init pid not recorded; gpufence ps will not show the container");
        }
    }

    fn container_gone(&self, id: &str, why: Gone) {
        // As `gpufence-runtime delete` does once the runtime let go of the container: its
        // processes are gone at StopContainer (the runtime handler cleans at the task's
        // delete, which follows the exit); RemoveContainer cleans again (idempotent) for a
        // container whose stop was not seen.
        if !crate::hostfiles::has_container_state(&self.cfg, id) {
            tracing::debug!(
                container = id,
                ?why,
                "NRI: container gone, nothing to clean"
            );
            return;
        }
        match crate::hostfiles::remove_container_state(&self.cfg, id) {
            Ok(()) => tracing::info!(container = id, ?why, "NRI: container state removed"),
            Err(e) => {
                tracing::warn!(container = id, ?why, error = %e, "NRI: container state not removed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Inventory;
    use std::collections::BTreeMap;

    /// Annotations believed (`trust-annotations = true`): these tests are about rendering; the
    /// trust model has its own (and one below sets "kubelet").
    fn cfg(dir: &std::path::Path) -> Config {
        let mut c = Config {
            state_dir: dir.join("state"),
            dev_root: dir.join("dev-root"),
            driver_root: dir.join("driver-root"),
            nvml_library: dir.join("no-nvml.so").display().to_string(),
            ..Config::default()
        };
        c.allocation.trust_annotations = crate::config::TrustAnnotations::Believed;
        c
    }

    /// One GPU whose device nodes are the host's /dev/null (real numbers for the restat).
    fn one_gpu(_: &Config) -> Result<Inventory, String> {
        let mut inv = gpufence_core::testing::inv();
        for n in inv
            .gpus
            .iter_mut()
            .map(|g| &mut g.node)
            .chain(inv.control_nodes.iter_mut())
        {
            n.host_path = "/dev/null".into();
        }
        Ok(inv)
    }

    fn handler(dir: &std::path::Path, load_inventory: InventoryLoader) -> PlanHandler {
        PlanHandler {
            cfg: cfg(dir),
            load_inventory,
        }
    }

    fn ctr(annotations: &[(&str, &str)], env: &[&str]) -> Container {
        Container {
            id: "c1".into(),
            name: "app".into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            env: env.iter().map(|e| e.to_string()).collect(),
            ..Default::default()
        }
    }

    /// A pod as NRI names it (its UID, name, namespace).
    fn pod(annotations: &[(&str, &str)]) -> PodSandbox {
        PodSandbox {
            uid: "uid-1".into(),
            name: "p".into(),
            namespace: "ns".into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            ..Default::default()
        }
    }

    #[test]
    fn no_gpu_is_untouched_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let h = handler(dir.path(), one_gpu);
        let adj = h
            .create_container(&pod(&[]), &ctr(&[], &["PATH=/bin"]))
            .unwrap();
        assert_eq!(adj, ContainerAdjustment::default());
        assert!(!dir.path().join("state/c1").exists());
    }

    #[test]
    fn a_gpu_pod_gets_its_adjustment_host_files_and_record_and_removal_cleans_them() {
        let dir = tempfile::tempdir().unwrap();
        let h = handler(dir.path(), one_gpu);
        let p = pod(&[
            ("gpufence.dev/devices", "0"),
            ("gpufence.dev/memory", "1Gi"),
        ]);
        let adj = h.create_container(&p, &ctr(&[], &["PATH=/bin"])).unwrap();
        let linux = adj.linux.as_ref().unwrap();
        let paths: Vec<&str> = linux.devices.iter().map(|d| d.path.as_str()).collect();
        assert!(paths.contains(&"/dev/nvidia0"), "{paths:?}");
        assert!(paths.contains(&"/dev/nvidiactl"), "{paths:?}");
        // The numbers are the live ones of the host node (/dev/null is 1:3).
        assert!(linux.devices.iter().all(|d| (d.major, d.minor) == (1, 3)));
        assert!(
            adj.env
                .iter()
                .any(|e| e.key == "GPUFENCE_MEMORY_LIMIT_0" && e.value == (1u64 << 30).to_string())
        );
        assert!(
            adj.mounts
                .iter()
                .any(|m| m.destination == "/run/gpufence/quota")
        );
        let state = dir.path().join("state/c1");
        let quota = std::fs::read_to_string(state.join("quota")).unwrap();
        assert!(quota.contains("device.0.uuid=GPU-a"), "{quota}");
        let meta =
            crate::state::meta::Meta::parse(&std::fs::read(state.join("status.json")).unwrap())
                .unwrap();
        assert_eq!(
            (meta.namespace.as_deref(), meta.pod.as_deref()),
            (Some("ns"), Some("p"))
        );
        // The container's name from NRI's identity.
        assert_eq!(meta.container.as_deref(), Some("app"));
        // Started: the init pid joins the record.
        let started = Container {
            pid: 4242,
            ..ctr(&[], &[])
        };
        h.container_started(&p, &started);
        let meta =
            crate::state::meta::Meta::parse(&std::fs::read(state.join("status.json")).unwrap())
                .unwrap();
        assert_eq!(meta.locator.pid, Some(4242));
        // Stop, then remove: the state goes (as `gpufence-runtime delete` removes it).
        h.container_gone("c1", Gone::Stopped);
        assert!(!state.exists());
        h.container_gone("c1", Gone::Removed);
        h.container_gone("../etc", Gone::Removed);
    }

    #[test]
    fn a_refusal_is_one_line_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let h = handler(dir.path(), one_gpu);
        let p = pod(&[("gpufence.dev/devices", "5")]);
        let err = h.create_container(&p, &ctr(&[], &[])).unwrap_err();
        assert!(err.starts_with("container c1: "), "{err}");
        assert!(err.contains("gpufence.dev/devices"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        // No inventory: a GPU request is refused, never planned against a guess.
        let h2 = handler(dir.path(), |_| Err("no cache".into()));
        let p = pod(&[("gpufence.dev/devices", "0")]);
        let err = h2.create_container(&p, &ctr(&[], &[])).unwrap_err();
        assert!(err.contains("no cache"), "{err}");
        // A forged identity annotation.
        let mut c = ctr(&[(crate::kubelet::CONTAINERD_POD_UID, "victim")], &[]);
        c.name = "app".into();
        let err = h.create_container(&pod(&[]), &c).unwrap_err();
        assert!(err.contains("victim"), "{err}");
        let counts: BTreeMap<&str, u64> = crate::state::refusals::read(&dir.path().join("state"))
            .into_iter()
            .map(|(r, n)| (r.as_str(), n))
            .collect();
        assert_eq!(counts.get("allocation"), Some(&3), "{counts:?}");
        assert!(!dir.path().join("state/c1").exists());
    }

    /// Attack: a CRI container whose annotations carry podman's marker (a pod annotation the
    /// engine copied into the spec) was taken for a podman container — not CRI, so its grants
    /// were "trusted" without kubelet's record: a pod's own /dev/null volume at the device
    /// plugin's mount directory got GPU 0 under trust-annotations = "kubelet".
    #[test]
    fn a_podman_marker_does_not_make_a_cri_container_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = handler(dir.path(), one_gpu);
        let plugins = dir.path().join("device-plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        let cp = plugins.join("kubelet_internal_checkpoint");
        std::fs::write(&cp, crate::kubelet::checkpoint_json(vec![])).unwrap();
        h.cfg.kubelet.checkpoint = cp;
        h.cfg.kubelet.dra_checkpoint = dir.path().join("dra_manager_state");
        h.cfg.allocation.trust_annotations = crate::config::TrustAnnotations::Kubelet;
        let p = PodSandbox {
            uid: "uid-1".into(),
            ..pod(&[])
        };
        for marker in [
            ("io.container.manager", "libpod"),
            ("io.podman.annotations.autoremove", "FALSE"),
        ] {
            let mut c = ctr(&[marker], &[]);
            c.mounts = vec![crate::api::Mount {
                destination: "/var/run/nvidia-container-devices/0".into(),
                source: "/dev/null".into(),
                r#type: "bind".into(),
                options: vec!["bind".into()],
            }];
            let err = h.create_container(&p, &c).unwrap_err();
            assert!(err.contains("kubelet"), "{marker:?}: {err}");
            assert!(!dir.path().join("state/c1").exists());
        }
    }

    #[test]
    fn a_pod_sandbox_is_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let h = handler(dir.path(), |_| panic!("inventory read for a sandbox"));
        let c = ctr(
            &[
                ("io.kubernetes.cri.container-type", "sandbox"),
                ("gpufence.dev/devices", "all"),
            ],
            &[],
        );
        assert_eq!(
            h.create_container(&pod(&[]), &c).unwrap(),
            ContainerAdjustment::default()
        );
    }
}
