//! What the plugin asks of gpufence: the adjustment for a container being created (or a
//! refusal), and word of containers that are gone. [`from_config`] builds the handler
//! `gpufence nri` runs.

use super::api::{Container, ContainerAdjustment, PodSandbox, ValidateContainerAdjustmentRequest};
use super::facts::NodeFacts;
use super::validate::{Decided, Node};
use std::collections::BTreeSet;

use crate::config::Config;
use crate::exit::Reason;
use crate::inventory::Inventory;
pub use gpufence_nri_stub::{Gone, Handler, Runtime};

/// The handler `gpufence nri` runs, from gpufence's configuration. The inventory cache is
/// warmed here (NVML is initialised, if at all, at start — not on a container's create path).
pub fn from_config(cfg: Config) -> PlanHandler {
    let inventory = crate::inventory::Memo::default();
    match inventory.load(&cfg) {
        Ok(inv) => {
            tracing::info!(gpus = inv.gpus.len(), driver = %inv.driver_version, "NRI: inventory ready")
        }
        Err(e) => {
            tracing::warn!(error = %e, "NRI: inventory unavailable; GPU containers will be refused until it is")
        }
    }
    PlanHandler {
        cfg,
        load_inventory: None,
        inventory,
        majors: std::sync::RwLock::new(None),
        decisions: Decisions::default(),
        validate: true,
    }
}

/// Most decisions kept for their validation. NRI validates a creation right after its
/// CreateContainer, under the same lock: a few are pending at most; the rest are creations
/// that failed before validation (another plugin refused, a conflict), dropped oldest first.
pub const MAX_PENDING_VALIDATIONS: usize = 256;

/// What gpufence decided for each container, from CreateContainer to its validation (kept only
/// where the runtime validates), with the inventory it decided on: the validation judges what
/// other plugins added against the node as the decision saw it, without loading it again.
#[derive(Debug, Default)]
pub struct Decisions {
    validating: std::sync::atomic::AtomicBool,
    pending: std::sync::Mutex<std::collections::VecDeque<(String, Decided, Option<Inventory>)>>,
}

impl Decisions {
    fn validating(&self) -> bool {
        self.validating.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn keep(&self, id: &str, d: Decided, inventory: Option<Inventory>) {
        if !self.validating() {
            return;
        }
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.retain(|(i, _, _)| i != id);
        if p.len() >= MAX_PENDING_VALIDATIONS {
            p.pop_front();
        }
        p.push_back((id.to_string(), d, inventory));
    }

    fn take(&self, id: &str) -> Option<(Decided, Option<Inventory>)> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let i = p.iter().position(|(c, _, _)| c == id)?;
        p.remove(i).map(|(_, d, inv)| (d, inv))
    }
}

/// In a container's state directory: gpufence nri decided for it (its record was written by the
/// plugin, not by the runtime handler or the hook).
pub const NRI_MARKER: &str = "nri-decided";

/// How the handler reads the node's inventory.
pub type InventoryLoader = fn(&Config) -> Result<Inventory, String>;

/// The plan's front door ([`crate::plan::intake`]) for each container, rendered as the
/// adjustment ([`super::adjust`]).
#[derive(Debug)]
pub struct PlanHandler {
    cfg: Config,
    /// Another source of the inventory than the cache (tests).
    load_inventory: Option<InventoryLoader>,
    /// The cache under `state-dir`, as the runtime reads it (warmed at start), its parse kept
    /// while the node and the file are unchanged.
    inventory: crate::inventory::Memo,
    /// The GPU-class majors the after-the-fact fence looks for (read again at each Synchronize).
    majors: std::sync::RwLock<Option<Vec<u32>>>,
    /// Decisions awaiting the runtime's validation.
    decisions: Decisions,
    /// Validate the merged adjustment where the runtime offers it (`gpufence nri
    /// --no-validation`: no).
    validate: bool,
}

/// A refusal: how it is counted, and the one line the runtime reports.
type Refusal = (Reason, String);

impl PlanHandler {
    /// Whether to validate the merged adjustment of every plugin where the runtime offers it.
    pub fn validating(mut self, validate: bool) -> PlanHandler {
        self.validate = validate;
        self
    }

    /// The node's inventory ([`from_config`]: the cache's).
    fn inventory(&self) -> Result<Inventory, String> {
        match self.load_inventory {
            Some(load) => load(&self.cfg),
            None => self.inventory.load(&self.cfg).map_err(|e| e.to_string()),
        }
    }

    /// The decision for one container: the request from NRI's message, the plan, its
    /// adjustment, and (when the plan grants anything) its host files and status record —
    /// written before the answer, so the container never starts without its quota. With it,
    /// the inventory it was made on.
    fn decide(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<(ContainerAdjustment, Decided, Option<Inventory>), Refusal> {
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
        let mut intake = crate::plan::intake::intake_request(
            &self.cfg,
            request,
            id,
            |_: &Config| self.inventory(),
            &crate::plan::intake::CdiSource::of(&self.cfg),
            None,
        )
        .map_err(|e| (e.reason(), e.to_string()))?;
        if intake.sandbox.is_some() {
            return Ok((Default::default(), Default::default(), None));
        }
        crate::driverfolders::settle_intake(
            &self.cfg,
            &mut intake,
            crate::driverfolders::Mode::Prepare,
        );
        let plan = &intake.plan;
        crate::plan::log_decision(id, plan);
        let sets_ld_preload = (plan.edits.env.iter().chain(&plan.env_overrides))
            .any(|e| e.starts_with("LD_PRELOAD="));
        if let Some(r) = super::validate::koordlet_hami_core(&pod.labels, &ctr.env, sets_ld_preload)
        {
            return Err((Reason::Spec, format!("container {id}: gpufence nri: {r}")));
        }
        let mut decided = Decided {
            devices: plan
                .allocation
                .iter()
                .flat_map(|a| a.devices.iter().map(|d| d.uuid.clone()))
                .collect(),
            allocation: plan.allocation.clone(),
            ..Default::default()
        };
        // The inventory decided on (none where it could not be loaded: the validation then
        // tries again, as it would without a kept one).
        let decided_on = intake
            .inventory_error
            .is_none()
            .then(|| std::mem::replace(&mut intake.inventory, Inventory::empty()));
        let facts = self.node_facts(decided_on);
        // A variable the container has once as planned is left to whoever set it.
        let agrees = |k: &str, planned: &str, present: &str| {
            use crate::allocation::container_dialects::{
                NVIDIA_VISIBLE_DEVICES, nvd_requests_nothing,
            };
            planned == present
                || facts.env_agrees(k, present, &decided) == Some(true)
                || (k == NVIDIA_VISIBLE_DEVICES
                    && !nvd_requests_nothing(present)
                    && super::validate::visibility_agrees(k, present, &decided, &facts))
        };
        let (adjustment, env) = super::adjust::render_decided(&self.cfg, plan, ctr, &agrees)
            .map_err(|e| (Reason::Spec, format!("container {id}: gpufence nri: {e}")))?;
        decided.answer = adjustment.clone();
        decided.env = env;
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
            // The record alone does not say the runtime applied this answer: NRI drops a plugin
            // that answers late and creates the container without it (the after-the-fact check
            // then looks for the container's own state among its mounts).
            let marker = self.cfg.container_state_dir(id).join(NRI_MARKER);
            let opts = crate::fsutil::Options {
                mode: 0o600,
                owner: None,
                sync: false,
            };
            crate::fsutil::write_atomic(&marker, b"", opts).map_err(|e| {
                (
                    Reason::Host,
                    format!("container {id}: {}: {e}", marker.display()),
                )
            })?;
        }
        Ok((adjustment, decided, facts.inventory))
    }

    /// The verdict on the merged adjustment of container `req.container` (see
    /// [`super::validate`]), counted and logged as a refusal when it is one.
    fn validate(&self, req: &ValidateContainerAdjustmentRequest, me: &str) -> Result<(), String> {
        let t = std::time::Instant::now();
        let id = req.container.as_ref().map_or("", |c| c.id.as_str());
        let (pod, namespace) = req
            .pod
            .as_ref()
            .map_or(("", ""), |p| (p.name.as_str(), p.namespace.as_str()));
        let (decided, inventory) = self.decisions.take(id).unzip();
        let inventory = match inventory.flatten() {
            Some(inv) => Some(inv),
            None if decided.is_some() => self.inventory().ok(),
            None => None,
        };
        let facts = self.node_facts(inventory);
        let verdict = super::validate::validate(req, me, decided.as_ref(), &facts);
        let validation_us = t.elapsed().as_micros() as u64;
        match verdict {
            Ok(()) => {
                tracing::info!(container = %id, pod = %pod, namespace = %namespace, validation_us,
                    "NRI: merged adjustment validated");
                Ok(())
            }
            Err(r) => {
                crate::state::refusals::count(&self.cfg.state_dir, Reason::Spec);
                let line = format!("container {}: gpufence nri: {r}", crate::text::short(id));
                tracing::error!(container = %id, pod = %pod, namespace = %namespace, validation_us, error = %line,
                    "NRI: merged adjustment refused");
                Err(line)
            }
        }
    }
}

impl PlanHandler {
    /// The node's facts for a decision or a validation, with the scheduler dialects that vouch
    /// for other plugins' variables.
    fn node_facts(&self, inventory: Option<crate::inventory::Inventory>) -> NodeFacts {
        let mut facts = NodeFacts::new(&self.cfg, self.gpu_majors(false), inventory);
        // koordlet's env (NVIDIA_VISIBLE_DEVICES=<minors>, the unindexed HAMi-core limits)
        // for what Koordinator granted.
        facts
            .dialects
            .push(crate::allocation::koordinator::koordlet_env_agrees);
        facts
    }

    /// The GPU-class majors: 195 and every `nvidia*` of `/proc/devices`, with the inventory's
    /// nodes' (cached; `refresh` reads them again).
    fn gpu_majors(&self, refresh: bool) -> Vec<u32> {
        if !refresh && let Some(m) = self.majors.read().ok().and_then(|m| m.clone()) {
            return m;
        }
        let proc_devices = std::fs::read_to_string("/proc/devices").unwrap_or_default();
        let inventory = self
            .inventory()
            .map(|i| i.device_majors())
            .unwrap_or_default();
        let m = crate::cgroup::gated_majors(&proc_devices, inventory);
        if let Ok(mut w) = self.majors.write() {
            *w = Some(m.clone());
        }
        m
    }

    /// The (major, minor) of every node container `id`'s gpufence record accounts for: its
    /// devices' nodes (a MIG device's parent and capabilities) and the control nodes; or why
    /// there is no record.
    fn granted_nodes(&self, id: &str) -> Result<BTreeSet<(u32, u32)>, String> {
        if !crate::hostfiles::has_container_state(&self.cfg, id) {
            return Err("no gpufence state for it".into());
        }
        let path = self
            .cfg
            .container_state_dir(id)
            .join(crate::state::meta::FILE_NAME);
        let bytes = std::fs::read(&path).map_err(|e| {
            format!(
                "gpufence state without its record ({}: {e})",
                path.display()
            )
        })?;
        let meta = crate::state::meta::Meta::parse(&bytes)
            .map_err(|e| format!("gpufence record {}: {e}", path.display()))?;
        let inv = self
            .inventory()
            .map_err(|e| format!("its record cannot be checked, inventory unavailable: {e}"))?;
        let mut set: BTreeSet<(u32, u32)> = inv
            .control_nodes
            .iter()
            .map(|n| (n.major, n.minor))
            .collect();
        for d in &meta.devices {
            let (gpu, mig) = match d.index.split_once(':') {
                Some((g, m)) => (g, Some(m)),
                None => (d.index.as_str(), None),
            };
            let Some(g) = gpu.parse().ok().and_then(|i| inv.gpu_by_index(i)) else {
                continue;
            };
            set.insert((g.node.major, g.node.minor));
            for m in g
                .mig_devices
                .iter()
                .filter(|m| Some(m.index.to_string().as_str()) == mig)
            {
                set.extend(m.caps.iter().map(|c| (c.major, c.minor)));
            }
        }
        Ok(set)
    }

    /// For a container gpufence nri decided for: whether the runtime applied the answer (the
    /// container mounts its own state directory's files, as the adjustment says). Containers
    /// the runtime handler or the hook fenced have no marker: their appliers refuse rather than
    /// leave them unfenced.
    fn delivered(&self, ctr: &Container) -> Result<(), String> {
        let dir = self.cfg.container_state_dir(&ctr.id);
        if std::fs::symlink_metadata(dir.join(NRI_MARKER)).is_err()
            || ctr
                .mounts
                .iter()
                .any(|m| std::path::Path::new(&m.source).starts_with(&dir))
        {
            return Ok(());
        }
        Err(
            "gpufence decided for it, but the runtime created it without that adjustment \
             (NRI dropped the plugin)"
                .into(),
        )
    }

    /// Fence an unfenced running container: NRI's device-cgroup update, read back; where it is
    /// not in force, its processes stopped. How it went, one phrase.
    fn fence(&self, rt: &dyn Runtime, ctr: &Container, majors: &[u32]) -> Result<String, String> {
        use super::fence;
        let update = rt.update_containers(vec![fence::deny_update(&ctr.id, majors)]);
        let still = fence::v1_allows_live(ctr.pid, majors);
        let not_applied = match (&update, &still) {
            (Ok(failed), Ok(None)) if failed.is_empty() => {
                return Ok("fenced: the runtime applied the device-cgroup update".into());
            }
            (Err(e), _) => format!("device-cgroup update failed: {e}"),
            (Ok(failed), _) if !failed.is_empty() => {
                "the runtime could not apply the device-cgroup update".to_string()
            }
            (_, Ok(Some(line))) => {
                format!("device-cgroup update not applied (devices.list still has {line:?})")
            }
            (_, Err(e)) => format!("device-cgroup update not verifiable: {e}"),
            (_, Ok(None)) => unreachable!("handled above"),
        };
        let n = fence::kill_container(ctr.pid, &ctr.id)
            .map_err(|e| format!("{not_applied}; not stopped: {e}"))?;
        Ok(format!("stopped ({n} process(es) killed); {not_applied}"))
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
            Ok((adjustment, decided, inventory)) => {
                self.decisions.keep(&ctr.id, decided, inventory);
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

    fn validates(&self) -> bool {
        self.validate
    }

    fn validation_offered(&self, offered: bool) {
        self.decisions
            .validating
            .store(offered, std::sync::atomic::Ordering::SeqCst);
        // Also in `gpufence nri`'s own output, not only its log file.
        use gpufence_nri_stub::service::{VALIDATION_OFF, VALIDATION_ON};
        eprintln!(
            "gpufence nri: {}",
            if offered {
                VALIDATION_ON
            } else {
                VALIDATION_OFF
            }
        );
    }

    fn validate_adjustment(
        &self,
        req: &ValidateContainerAdjustmentRequest,
        me: &str,
    ) -> Result<(), String> {
        self.validate(req, me)
    }

    fn container_started(&self, _pod: &PodSandbox, ctr: &Container) {
        if self.decisions.take(&ctr.id).is_some() {
            // Kept for a validation that never came: this runtime does not validate after all.
            tracing::warn!(container = %ctr.id, "NRI: container started without the runtime \
                asking gpufence to validate its merged adjustment; the after-the-fact fence stays");
        }
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

    fn synchronize(&self, _pods: &[PodSandbox], _containers: &[Container]) {
        // A reloaded driver may have new dynamic majors.
        self.gpu_majors(true);
    }

    fn after_the_fact(&self, rt: &dyn Runtime, pod: &PodSandbox, ctr: &Container) {
        if !super::service::is_live(ctr) {
            return;
        }
        let majors = self.gpu_majors(false);
        let reach = super::fence::gpu_reach(ctr, &majors);
        if reach.is_empty() {
            return;
        }
        let granted = self
            .granted_nodes(&ctr.id)
            .and_then(|g| self.delivered(ctr).map(|()| g));
        let Some(why) = super::fence::unfenced(&reach, granted.as_ref().map_err(String::as_str))
        else {
            return;
        };
        if ctr.pid <= 1 {
            tracing::warn!(container = %ctr.id, pod = %pod.name, namespace = %pod.namespace, why = %why,
                "NRI: unfenced GPU container not started yet; fenced when it starts");
            return;
        }
        let t = std::time::Instant::now();
        let outcome = self.fence(rt, ctr, &majors);
        crate::state::refusals::count(&self.cfg.state_dir, Reason::Unfenced);
        let fence_us = t.elapsed().as_micros() as u64;
        match outcome {
            Ok(how) => {
                tracing::warn!(container = %ctr.id, pod = %pod.name, namespace = %pod.namespace,
                pid = ctr.pid, why = %why, fence_us, "NRI: unfenced GPU container {how}")
            }
            Err(e) => {
                tracing::error!(container = %ctr.id, pod = %pod.name, namespace = %pod.namespace,
                pid = ctr.pid, why = %why, fence_us, error = %e, "NRI: unfenced GPU container not fenced")
            }
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
            load_inventory: Some(load_inventory),
            inventory: Default::default(),
            majors: std::sync::RwLock::new(None),
            decisions: Decisions::default(),
            validate: true,
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

    /// NRI's validation request for `adj` (gpufence's, as `90-gpufence`) merged with what
    /// another plugin (`10-injector`, `00-koordlet`) added.
    fn validation(
        id: &str,
        adj: &ContainerAdjustment,
        other: ContainerAdjustment,
        owned: &[(crate::api::Field, &str, &str)],
    ) -> ValidateContainerAdjustmentRequest {
        let d = Decided {
            answer: adj.clone(),
            ..Default::default()
        };
        crate::validate::tests::request_for(id, &d, other, owned)
    }

    #[test]
    fn an_agreeing_variable_is_left_to_its_plugin_and_a_gpu_added_by_another_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let h = handler(dir.path(), one_gpu);
        h.validation_offered(true);
        let p = pod(&[("gpufence.dev/devices", "0")]);
        // koordlet (index 00) set NVIDIA_VISIBLE_DEVICES to the granted GPU's index: gpufence
        // does not set the key again (NRI would refuse two plugins setting it).
        let adj = h
            .create_container(&p, &ctr(&[], &["NVIDIA_VISIBLE_DEVICES=0"]))
            .unwrap();
        assert!(
            !adj.env.iter().any(|e| e.key == "NVIDIA_VISIBLE_DEVICES"),
            "{adj:?}"
        );
        use crate::api::Field;
        use crate::validate::tests::{dev, with_devices, with_env};
        let koordlet = with_env(&[("NVIDIA_VISIBLE_DEVICES", "0")]);
        let owned = [(Field::Env, "NVIDIA_VISIBLE_DEVICES", "00-koordlet")];
        let req = validation("c1", &adj, koordlet, &owned);
        h.validate_adjustment(&req, "90-gpufence").unwrap();
        // Another container of the pod, to which a plugin adds a GPU node on top.
        let c2 = Container {
            id: "c2".into(),
            ..ctr(&[], &[])
        };
        let adj = h.create_container(&p, &c2).unwrap();
        assert!(adj.env.iter().any(|e| e.key == "NVIDIA_VISIBLE_DEVICES"));
        let gpu = with_devices(vec![dev("/dev/nvidia7", 195, 7)]);
        let owned = [(Field::Devices, "/dev/nvidia7", "10-injector")];
        let req = validation("c2", &adj, gpu, &owned);
        let err = h.validate_adjustment(&req, "90-gpufence").unwrap_err();
        assert_eq!(
            err,
            "container c2: gpufence nri: plugin \"10-injector\" added device node /dev/nvidia7 \
             (c 195:7), which gpufence did not plan for this container"
        );
        // Validated once: the decision is gone; a container never decided here is refused.
        let err = h.validate_adjustment(&req, "90-gpufence").unwrap_err();
        assert!(err.contains("no decision of this gpufence"), "{err}");
        // A runtime that does not validate: nothing kept, nothing left behind.
        h.validation_offered(false);
        h.create_container(&p, &ctr(&[], &[])).unwrap();
        assert!(h.decisions.take("c1").is_none());
    }

    #[test]
    fn a_dialect_vouches_with_the_allocation_gpufence_planned() {
        let dir = tempfile::tempdir().unwrap();
        let h = handler(dir.path(), one_gpu);
        h.validation_offered(true);
        let p = pod(&[("gpufence.dev/devices", "0")]);
        h.create_container(&p, &ctr(&[], &[])).unwrap();
        let (decided, inventory) = h.decisions.take("c1").unwrap();
        assert_eq!(decided.devices, ["GPU-a"]);
        // Kept with the inventory the decision was made on, live device numbers included.
        let inventory = inventory.unwrap();
        assert_eq!(inventory.gpus[0].uuid, "GPU-a");
        assert_eq!(
            (inventory.gpus[0].node.major, inventory.gpus[0].node.minor),
            (1, 3)
        );
        let mut facts = NodeFacts::new(&h.cfg, vec![195], Some(inventory));
        assert_eq!(facts.env_agrees("K", "minor-0", &decided), None);
        facts.dialects.push(|alloc, inv, key, value| {
            key == "K"
                && value == format!("minor-{}", inv.gpus[0].minor)
                && alloc.devices.len() == 1
        });
        assert_eq!(facts.env_agrees("K", "minor-0", &decided), Some(true));
        assert_eq!(facts.env_agrees("K", "minor-1", &decided), None);
        let no_gpu = Decided::default();
        assert_eq!(facts.env_agrees("K", "minor-0", &no_gpu), None);
    }

    static LOADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn one_gpu_counted(cfg: &Config) -> Result<Inventory, String> {
        LOADS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        one_gpu(cfg)
    }

    #[test]
    fn a_validation_judges_on_the_decisions_inventory_without_loading_it_again() {
        use crate::api::Field;
        use crate::validate::tests::with_env;
        let dir = tempfile::tempdir().unwrap();
        let h = handler(dir.path(), one_gpu_counted);
        h.validation_offered(true);
        let p = pod(&[("gpufence.dev/devices", "0")]);
        // Another plugin names GPU 0 by its index, then by its UUID: whichever is not gpufence's
        // own value resolves through the inventory the decision kept.
        for (id, value) in [("c1", "0"), ("c2", "GPU-a")] {
            let env = format!("NVIDIA_VISIBLE_DEVICES={value}");
            let c = Container {
                id: id.into(),
                ..ctr(&[], &[env.as_str()])
            };
            let adj = h.create_container(&p, &c).unwrap();
            let loads = LOADS.load(std::sync::atomic::Ordering::SeqCst);
            let other = with_env(&[("NVIDIA_VISIBLE_DEVICES", value)]);
            let owned = [(Field::Env, "NVIDIA_VISIBLE_DEVICES", "00-koordlet")];
            let req = validation(id, &adj, other, &owned);
            h.validate_adjustment(&req, "90-gpufence").unwrap();
            assert_eq!(
                LOADS.load(std::sync::atomic::Ordering::SeqCst),
                loads,
                "{id}"
            );
        }
    }

    static FAILING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
    static TRIES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn unavailable_at_first(cfg: &Config) -> Result<Inventory, String> {
        TRIES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if FAILING.load(std::sync::atomic::Ordering::SeqCst) {
            return Err("no cache, no NVML".into());
        }
        one_gpu(cfg)
    }

    #[test]
    fn a_decision_made_without_the_inventory_has_its_validation_load_it() {
        let dir = tempfile::tempdir().unwrap();
        let h = handler(dir.path(), unavailable_at_first);
        h.validation_offered(true);
        // No GPU asked: decided (nothing granted) although the inventory is unavailable.
        let adj = h.create_container(&pod(&[]), &ctr(&[], &[])).unwrap();
        let (decided, inventory) = h.decisions.take("c1").unwrap();
        assert!(inventory.is_none(), "an empty inventory kept as the node's");
        h.decisions.keep("c1", decided, None);
        FAILING.store(false, std::sync::atomic::Ordering::SeqCst);
        let tries = TRIES.load(std::sync::atomic::Ordering::SeqCst);
        let req = validation("c1", &adj, ContainerAdjustment::default(), &[]);
        h.validate_adjustment(&req, "90-gpufence").unwrap();
        assert_eq!(TRIES.load(std::sync::atomic::Ordering::SeqCst), tries + 1);
    }

    /// One GPU (index 0) whose device minor is 3: koordlet's `NVIDIA_VISIBLE_DEVICES=3` names it,
    /// an index reading of `3` names nothing.
    fn one_gpu_minor_3(cfg: &Config) -> Result<Inventory, String> {
        let mut inv = one_gpu(cfg)?;
        inv.gpus[0].minor = 3;
        Ok(inv)
    }

    #[test]
    fn koordlets_visible_devices_for_koordinators_grant_pass_creation_and_validation() {
        let dir = tempfile::tempdir().unwrap();
        let h = handler(dir.path(), one_gpu_minor_3);
        h.validation_offered(true);
        let koord = r#"{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-memory":"1Gi","koordinator.sh/gpu-core":50}}]}"#;
        let p = pod(&[(crate::allocation::koordinator::ALLOCATED, koord)]);
        // koordlet's plugin (index 00) set the GPU's minor before gpufence: gpufence leaves it.
        let adj = h
            .create_container(&p, &ctr(&[], &["NVIDIA_VISIBLE_DEVICES=3"]))
            .unwrap();
        assert!(
            !adj.env.iter().any(|e| e.key == "NVIDIA_VISIBLE_DEVICES"),
            "{adj:?}"
        );
        assert!(
            adj.env
                .iter()
                .any(|e| e.key == "GPUFENCE_MEMORY_LIMIT_0" && e.value == (1u64 << 30).to_string()),
            "{adj:?}"
        );
        use crate::api::Field;
        use crate::validate::tests::with_env;
        let koordlet = with_env(&[
            ("NVIDIA_VISIBLE_DEVICES", "3"),
            ("CUDA_DEVICE_MEMORY_LIMIT", &(1u64 << 30).to_string()),
            ("CUDA_DEVICE_SM_LIMIT", "50"),
        ]);
        let owned = [
            (Field::Env, "NVIDIA_VISIBLE_DEVICES", "00-koordlet"),
            (Field::Env, "CUDA_DEVICE_MEMORY_LIMIT", "00-koordlet"),
            (Field::Env, "CUDA_DEVICE_SM_LIMIT", "00-koordlet"),
        ];
        let req = validation("c1", &adj, koordlet, &owned);
        h.validate_adjustment(&req, "90-gpufence").unwrap();
    }

    #[test]
    fn koordlets_hami_core_preload_is_refused_at_creation_naming_the_label() {
        let dir = tempfile::tempdir().unwrap();
        let h = handler(dir.path(), one_gpu_minor_3);
        let koord = r#"{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-memory":"1Gi"}}]}"#;
        let annotations = [(crate::allocation::koordinator::ALLOCATED, koord)];
        let env = [
            "NVIDIA_VISIBLE_DEVICES=3",
            "LD_PRELOAD=/usr/local/vgpu/libvgpu.so",
        ];
        // koordlet's injection (the pod's label): gpufence setting LD_PRELOAD again would collide
        // with koordlet's plugin; refused here in the validation's words.
        let mut p = pod(&annotations);
        p.labels.insert(
            "koordinator.sh/gpu-isolation-provider".into(),
            "HAMi-core".into(),
        );
        let err = h.create_container(&p, &ctr(&[], &env)).unwrap_err();
        assert_eq!(
            err,
            "container c1: gpufence nri: koordlet (pod label \
             koordinator.sh/gpu-isolation-provider=HAMi-core) added env \
             LD_PRELOAD=/usr/local/vgpu/libvgpu.so (HAMi-core), which gpufence replaces: turn off \
             Koordinator's HAMi-core isolation for this pod (remove its label \
             koordinator.sh/gpu-isolation-provider=HAMi-core): gpufence's shim enforces the \
             quota in its place"
        );
        assert!(!dir.path().join("state/c1").exists());
        // Without the label the preload is the image's: replaced by gpufence's value.
        let adj = h
            .create_container(&pod(&annotations), &ctr(&[], &env))
            .unwrap();
        let preload = adj.env.iter().find(|e| e.key == "LD_PRELOAD").unwrap();
        assert!(!preload.value.contains("libvgpu"), "{adj:?}");
        // The label on a pod whose env preloads no HAMi-core: nothing to replace, nothing refused.
        h.create_container(&p, &ctr(&[], &env[..1])).unwrap();
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

    /// Records the updates asked of the runtime; applies none.
    #[derive(Default)]
    struct Rt(std::sync::Mutex<Vec<crate::api::ContainerUpdate>>);

    impl Runtime for Rt {
        fn update_containers(
            &self,
            update: Vec<crate::api::ContainerUpdate>,
        ) -> Result<Vec<crate::api::ContainerUpdate>, String> {
            self.0.lock().unwrap().extend(update);
            Ok(Vec::new())
        }
    }

    /// A running container holding the test inventory's GPU 0 node (195:0).
    fn holding_gpu0(id: &str, pid: u32) -> Container {
        use crate::api::{ContainerState, LinuxContainer, LinuxDevice};
        Container {
            id: id.into(),
            name: "app".into(),
            pid,
            state: ContainerState::ContainerRunning as i32,
            linux: Some(LinuxContainer {
                devices: vec![LinuxDevice {
                    path: "/dev/nvidia0".into(),
                    r#type: "c".into(),
                    major: 195,
                    minor: 0,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn unfenced_count(dir: &std::path::Path) -> u64 {
        crate::state::refusals::read(&dir.join("state"))
            .into_iter()
            .find(|(r, _)| r.as_str() == "unfenced")
            .map_or(0, |(_, n)| n)
    }

    #[test]
    fn after_the_fact_a_gpu_container_without_its_fence_is_found_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let h = handler(dir.path(), one_gpu);
        let rt = Rt::default();
        let p = pod(&[]);
        // Not started yet (no pid): left for PostStartContainer, not counted.
        h.after_the_fact(&rt, &p, &holding_gpu0("c1", 0));
        assert_eq!(
            (rt.0.lock().unwrap().len(), unfenced_count(dir.path())),
            (0, 0)
        );
        // Running with no gpufence state: the deny update is asked for (the inventory's major
        // among those denied), then the container is stopped — here its pid is not in a
        // container cgroup, so nothing is signalled — and it is counted either way.
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut child = scopeguard(child);
        h.after_the_fact(&rt, &p, &holding_gpu0("c1", child.0.id()));
        let asked = rt.0.lock().unwrap().clone();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].container_id, "c1");
        let denied: Vec<i64> = asked[0]
            .linux
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .devices
            .iter()
            .map(|d| d.major.as_ref().unwrap().value)
            .collect();
        assert!(denied.contains(&195), "{denied:?}");
        assert_eq!(unfenced_count(dir.path()), 1);
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "a process outside the container was killed"
        );
        // A container without GPU, and one gpufence fenced through NRI: nothing to do.
        let plain = Container {
            linux: None,
            ..holding_gpu0("c2", child.0.id())
        };
        h.after_the_fact(&rt, &p, &plain);
        let gpu = pod(&[
            ("gpufence.dev/devices", "0"),
            ("gpufence.dev/memory", "1Gi"),
        ]);
        let c = ctr(&[], &["PATH=/bin"]);
        let adj = h.create_container(&gpu, &c).unwrap();
        let fenced = Container {
            mounts: adj.mounts.clone(),
            ..holding_gpu0("c1", child.0.id())
        };
        h.after_the_fact(&rt, &gpu, &fenced);
        assert_eq!(
            (rt.0.lock().unwrap().len(), unfenced_count(dir.path())),
            (1, 1)
        );
        // Decided, but created without the answer (NRI dropped the plugin): unfenced.
        h.after_the_fact(&rt, &gpu, &holding_gpu0("c1", child.0.id()));
        assert_eq!(unfenced_count(dir.path()), 2);
        // The record does not grant what it reaches (another GPU's node): unfenced.
        let granted = h.granted_nodes("c1").unwrap();
        assert!(
            granted.contains(&(195, 0)) && granted.contains(&(195, 255)),
            "{granted:?}"
        );
        let mut beyond = fenced;
        beyond.linux.as_mut().unwrap().devices[0].minor = 1;
        h.after_the_fact(&rt, &gpu, &beyond);
        assert_eq!(unfenced_count(dir.path()), 3);
        assert!(
            h.granted_nodes("c9")
                .unwrap_err()
                .contains("no gpufence state")
        );
        assert!(child.0.try_wait().unwrap().is_none());
    }

    /// Kills the child when dropped.
    struct Guard(std::process::Child);
    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    fn scopeguard(c: std::process::Child) -> Guard {
        Guard(c)
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
