//! The Plugin service (NRI's `service Plugin`): each request decoded, handed to the
//! [`Handler`], its answer encoded. Pure of I/O: [`crate::conn`] calls [`Service::call`] on a
//! thread of its own for each request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use prost::Message;

use crate::api;
use crate::conn::Status;
use crate::handler::{Gone, Handler};
use crate::ttrpc::code;

/// NRI's container states a plugin may still have to act on: created (started later, its pid
/// then known) and running.
pub fn is_live(ctr: &api::Container) -> bool {
    use api::ContainerState;
    ctr.state == ContainerState::ContainerCreated as i32
        || ctr.state == ContainerState::ContainerRunning as i32
}

/// The ttrpc service name of NRI's Plugin service.
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// The ttrpc service name of NRI's Runtime service.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";

/// The events gpufence subscribes to: CreateContainer, PostStartContainer (the init pid, for
/// `gpufence ps`), StopContainer, RemoveContainer (NRI's `EventMask`: bit `event - 1`).
pub fn event_mask() -> i32 {
    [
        api::Event::CreateContainer,
        api::Event::PostStartContainer,
        api::Event::StopContainer,
        api::Event::RemoveContainer,
    ]
    .iter()
    .fold(0, |m, e| m | 1 << (*e as i32 - 1))
}

/// NRI's event bit for ValidateContainerAdjustment (event 14). Only subscribed where the
/// runtime knows it ([`validation_offered`]): NRI before v0.10 refuses a plugin whose Configure
/// answer names an event it does not know (`invalid plugin events`), and would never register it.
pub fn validate_bit() -> i32 {
    1 << (api::Event::ValidateContainerAdjustment as i32 - 1)
}

/// What a validating plugin says when the runtime offers validation.
pub const VALIDATION_ON: &str = "NRI: validating the merged adjustment of every plugin \
    (ValidateContainerAdjustment): a container another plugin hands a GPU gpufence did not plan \
    is refused at creation";
/// What it says when the runtime does not.
pub const VALIDATION_OFF: &str = "NRI: this runtime offers no adjustment validation (NRI < \
    v0.10: containerd < 2.2, CRI-O < 1.34): what other plugins add is not checked at creation; \
    the after-the-fact fence stays";

/// `vX.Y.Z`, `X.Y.Z`, `X.Y.Z-rc.1`, `X.Y` → (X, Y, Z); `None` for anything else.
fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let v = v.trim();
    let v = v.strip_prefix('v').unwrap_or(v);
    let core = v.split(['-', '+', ' ']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = match parts.next() {
        Some(p) => p.parse().ok()?,
        None => 0,
    };
    Some((major, minor, patch))
}

/// Whether the runtime that sent Configure calls ValidateContainerAdjustment (NRI ≥ v0.10):
/// from the NRI version it names (sent from NRI v0.12), else from what vendors it — containerd
/// ≥ 2.2 (NRI v0.10), CRI-O ≥ 1.34 (NRI v0.11). Unknown runtimes and versions: no (subscribing
/// to an event the runtime does not know would keep the plugin from registering at all).
pub fn validation_offered(runtime: &str, version: &str, nri_version: &str) -> bool {
    if let Some(nri) = parse_version(nri_version) {
        return nri >= (0, 10, 0);
    }
    let Some(v) = parse_version(version) else {
        return false;
    };
    match runtime.trim() {
        "containerd" => v >= (2, 2, 0),
        "cri-o" | "crio" | "CRI-O" => v >= (1, 34, 0),
        _ => false,
    }
}

/// Most pods, and most containers, kept from a Synchronize split over several messages.
pub const MAX_SYNC_OBJECTS: usize = 1 << 16;

/// NRI's default `plugin_request_timeout`, until Configure says otherwise.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 2000;

/// The share of the runtime's request timeout the handler gets for CreateContainer. A plugin
/// that does not answer in time is dropped by NRI and the container created without its
/// adjustment — and NRI's default validator lets that through (docs/nri.md) — so gpufence
/// answers a refusal itself before the runtime gives up.
pub fn decision_deadline(request_timeout_ms: u64) -> Duration {
    Duration::from_millis(request_timeout_ms.saturating_mul(3) / 4)
}

/// The Plugin service over one handler.
pub struct Service {
    handler: Arc<dyn Handler>,
    /// The runtime's request timeout (Configure), in milliseconds.
    request_timeout_ms: AtomicU64,
    /// Synchronize parts received so far (the runtime splits large states, `more` = true).
    sync: Mutex<(Vec<api::PodSandbox>, Vec<api::Container>)>,
    /// The current connection's after-the-fact queue ([`Handler::after_the_fact`], served by
    /// the plugin off the request path).
    fence: Mutex<Option<mpsc::Sender<Check>>>,
    /// This plugin as NRI names the owner of an adjustment (`<index>-<name>`; empty when not
    /// registered through [`crate::Plugin`]).
    me: String,
    /// The threads decisions and validations run on, against their deadline.
    workers: Arc<crate::workers::Workers>,
}

/// A container to check after the fact, with its pod.
pub type Check = (api::PodSandbox, api::Container);

fn decode<M: Message + Default>(method: &str, payload: &[u8]) -> Result<M, Status> {
    M::decode(payload).map_err(|e| {
        tracing::warn!(method, error = %e, "NRI: malformed request refused");
        (
            code::INVALID_ARGUMENT,
            format!("gpufence nri: malformed {method} request: {e}"),
        )
    })
}

impl Service {
    pub fn new(handler: Arc<dyn Handler>) -> Service {
        Service {
            handler,
            request_timeout_ms: AtomicU64::new(DEFAULT_REQUEST_TIMEOUT_MS),
            sync: Mutex::new((Vec::new(), Vec::new())),
            fence: Mutex::new(None),
            me: String::new(),
            workers: crate::workers::Workers::new("nri-decide"),
        }
    }

    /// The service of the plugin registered as `name` with `index` (NRI names it
    /// `<index>-<name>` as the owner of what it adjusts).
    pub fn named(mut self, index: &str, name: &str) -> Service {
        self.me = format!("{index}-{name}");
        self
    }

    pub fn handler(&self) -> &Arc<dyn Handler> {
        &self.handler
    }

    /// Where this connection's after-the-fact checks go (`None`: the connection ended).
    pub fn set_fence_queue(&self, queue: Option<mpsc::Sender<Check>>) {
        match self.fence.lock() {
            Ok(mut q) => *q = queue,
            Err(p) => *p.into_inner() = queue,
        }
    }

    /// Queue containers for the after-the-fact check (nothing when no connection serves it).
    fn check_after(&self, checks: impl IntoIterator<Item = Check>) {
        let q = match self.fence.lock() {
            Ok(q) => q,
            Err(p) => p.into_inner(),
        };
        if let Some(q) = q.as_ref() {
            for c in checks {
                let _ = q.send(c);
            }
        }
    }

    /// Serve one request of `service`/`method` with protobuf `payload`.
    pub fn call(&self, service: &str, method: &str, payload: &[u8]) -> Result<Vec<u8>, Status> {
        if service != PLUGIN_SERVICE {
            return Err(unimplemented(service, method));
        }
        match method {
            "Configure" => {
                let req: api::ConfigureRequest = decode(method, payload)?;
                if let Ok(ms @ 1..) = u64::try_from(req.request_timeout) {
                    self.request_timeout_ms.store(ms, Ordering::SeqCst);
                }
                tracing::info!(
                    runtime = %req.runtime_name,
                    version = %req.runtime_version,
                    nri = %req.nri_version,
                    request_timeout_ms = req.request_timeout,
                    "NRI: configured; subscribed to CreateContainer, StopContainer, RemoveContainer"
                );
                Ok(api::ConfigureResponse {
                    events: self.subscribe_validation(&req),
                }
                .encode_to_vec())
            }
            "Synchronize" => {
                let req: api::SynchronizeRequest = decode(method, payload)?;
                Ok(self.synchronize(req).encode_to_vec())
            }
            "Shutdown" => {
                tracing::info!("NRI: the runtime is shutting down");
                Ok(api::Empty {}.encode_to_vec())
            }
            "CreateContainer" => {
                let req: api::CreateContainerRequest = decode(method, payload)?;
                self.create(req).map(|r| r.encode_to_vec())
            }
            "PostStartContainer" => {
                let req: api::PostStartContainerRequest = decode(method, payload)?;
                self.started(req.pod, req.container);
                Ok(api::PostStartContainerResponse::default().encode_to_vec())
            }
            "StopContainer" => {
                let req: api::StopContainerRequest = decode(method, payload)?;
                self.gone(req.container.as_ref(), Gone::Stopped);
                Ok(api::StopContainerResponse::default().encode_to_vec())
            }
            "RemoveContainer" => {
                let req: api::RemoveContainerRequest = decode(method, payload)?;
                self.gone(req.container.as_ref(), Gone::Removed);
                Ok(api::RemoveContainerResponse::default().encode_to_vec())
            }
            "ValidateContainerAdjustment" => {
                let req: api::ValidateContainerAdjustmentRequest = decode(method, payload)?;
                Ok(self.validate(req).encode_to_vec())
            }
            // Runtimes fall back to StateChange for plugins without the dedicated calls.
            "StateChange" => {
                let req: api::StateChangeEvent = decode(method, payload)?;
                if req.event == api::Event::RemoveContainer as i32 {
                    self.gone(req.container.as_ref(), Gone::Removed);
                } else if req.event == api::Event::PostStartContainer as i32 {
                    self.started(req.pod, req.container);
                }
                Ok(api::Empty {}.encode_to_vec())
            }
            _ => Err(unimplemented(service, method)),
        }
    }

    /// The events to subscribe to: [`event_mask`], and ValidateContainerAdjustment where the
    /// handler validates and the runtime offers it. Either way one line says which, and the
    /// handler is told.
    fn subscribe_validation(&self, req: &api::ConfigureRequest) -> i32 {
        if !self.handler.validates() {
            return event_mask();
        }
        let offered = validation_offered(&req.runtime_name, &req.runtime_version, &req.nri_version);
        self.handler.validation_offered(offered);
        if offered {
            tracing::info!(
                runtime = %req.runtime_name,
                version = %req.runtime_version,
                "{VALIDATION_ON}"
            );
            event_mask() | validate_bit()
        } else {
            tracing::warn!(
                runtime = %req.runtime_name,
                version = %req.runtime_version,
                nri = %req.nri_version,
                "{VALIDATION_OFF}"
            );
            event_mask()
        }
    }

    /// ValidateContainerAdjustment: the handler's verdict, bounded as a decision is; a handler
    /// that fails, panics or runs late rejects (fail closed).
    fn validate(
        &self,
        req: api::ValidateContainerAdjustmentRequest,
    ) -> api::ValidateContainerAdjustmentResponse {
        let id = req
            .container
            .as_ref()
            .map(|c| c.id.clone())
            .unwrap_or_default();
        let handler = Arc::clone(&self.handler);
        let me = self.me.clone();
        let verdict = self.bounded("validating", &id, move || {
            handler.validate_adjustment(&req, &me)
        });
        match verdict {
            Ok(()) => api::ValidateContainerAdjustmentResponse::default(),
            Err(reason) => api::ValidateContainerAdjustmentResponse {
                reject: true,
                reason,
            },
        }
    }

    fn synchronize(&self, req: api::SynchronizeRequest) -> api::SynchronizeResponse {
        let mut sync = match self.sync.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        let room = MAX_SYNC_OBJECTS.saturating_sub(sync.0.len());
        sync.0.extend(req.pods.into_iter().take(room));
        let room = MAX_SYNC_OBJECTS.saturating_sub(sync.1.len());
        sync.1.extend(req.containers.into_iter().take(room));
        if !req.more {
            let (pods, containers) = std::mem::take(&mut *sync);
            drop(sync);
            tracing::info!(
                pods = pods.len(),
                containers = containers.len(),
                "NRI: synchronized"
            );
            self.handler.synchronize(&pods, &containers);
            // Every live container, checked after this answer (NRI holds its lock until then).
            let checks: Vec<Check> = containers
                .into_iter()
                .filter(is_live)
                .map(|c| {
                    let pod = pods.iter().find(|p| p.id == c.pod_sandbox_id);
                    (pod.cloned().unwrap_or_default(), c)
                })
                .collect();
            self.check_after(checks);
        }
        // A split part must be answered with the same `more` and no updates.
        api::SynchronizeResponse {
            update: Vec::new(),
            more: req.more,
        }
    }

    fn create(
        &self,
        req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, Status> {
        let Some(ctr) = req.container else {
            return Err((
                code::INVALID_ARGUMENT,
                "gpufence nri: CreateContainer without a container".into(),
            ));
        };
        let pod = req.pod.unwrap_or_default();
        match self.decide(pod, ctr) {
            Ok(adjust) => Ok(api::CreateContainerResponse {
                adjust: Some(adjust),
                update: Vec::new(),
                evict: Vec::new(),
            }),
            // A plain error (code Unknown): the runtime fails the creation with the reason and
            // keeps the plugin (a timeout or a closed connection would drop it instead).
            Err(reason) => Err((code::UNKNOWN, reason)),
        }
    }

    /// The handler's decision, or a refusal when it takes longer than [`decision_deadline`]
    /// (the handler's thread is left to finish; its late answer is dropped).
    fn decide(
        &self,
        pod: api::PodSandbox,
        ctr: api::Container,
    ) -> Result<api::ContainerAdjustment, String> {
        let handler = Arc::clone(&self.handler);
        let id = ctr.id.clone();
        self.bounded("deciding", &id, move || {
            handler.create_container(&pod, &ctr)
        })
    }

    /// `work` on a thread of its own, its answer or a refusal when it panics or takes longer
    /// than [`decision_deadline`] (`doing`: what it does, for the refusal's line).
    fn bounded<T: Send + 'static>(
        &self,
        doing: &str,
        id: &str,
        work: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let deadline = decision_deadline(self.request_timeout_ms.load(Ordering::SeqCst));
        let (tx, rx) = mpsc::channel();
        let spawned = self.workers.run(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            let _ = tx.send(r);
        });
        if let Err(e) = spawned {
            return Err(format!(
                "container {id}: gpufence nri: cannot start a thread: {e}"
            ));
        }
        match rx.recv_timeout(deadline) {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(format!(
                "container {id}: gpufence nri: internal error {doing}"
            )),
            Err(_) => {
                let why = format!(
                    "container {id}: gpufence nri: no decision within {deadline:?} (3/4 of the \
                     runtime's request timeout); refused rather than left unfenced"
                );
                tracing::warn!(container = %id, "NRI: refused: {why}");
                Err(why)
            }
        }
    }

    /// PostStartContainer: the status record learns the pid, and the container is checked
    /// after the fact (one created while the plugin was away is first seen here with a pid).
    fn started(&self, pod: Option<api::PodSandbox>, ctr: Option<api::Container>) {
        let Some(c) = ctr else {
            return;
        };
        let pod = pod.unwrap_or_default();
        self.handler.container_started(&pod, &c);
        self.check_after([(pod, c)]);
    }

    fn gone(&self, ctr: Option<&api::Container>, why: Gone) {
        match ctr {
            Some(c) => self.handler.container_gone(&c.id, why),
            None => tracing::warn!(?why, "NRI: container event without a container ignored"),
        }
    }
}

fn unimplemented(service: &str, method: &str) -> Status {
    (
        code::UNIMPLEMENTED,
        format!("gpufence nri: {service}/{method} not implemented"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records what it was asked; refuses containers named "refuse".
    #[derive(Default)]
    struct Recorder {
        gone: Mutex<Vec<(String, Gone)>>,
        synced: Mutex<Vec<(usize, usize)>>,
        offered: Mutex<Vec<bool>>,
    }

    impl Handler for Recorder {
        fn create_container(
            &self,
            pod: &api::PodSandbox,
            ctr: &api::Container,
        ) -> Result<api::ContainerAdjustment, String> {
            if ctr.name == "slow" {
                std::thread::sleep(Duration::from_millis(400));
            }
            if ctr.name == "panic" {
                panic!("handler bug");
            }
            if ctr.name == "refuse" {
                return Err(format!("container {}: no GPU for pod {}", ctr.id, pod.name));
            }
            Ok(api::ContainerAdjustment {
                env: vec![api::KeyValue {
                    key: "SEEN".into(),
                    value: ctr.id.clone(),
                }],
                ..Default::default()
            })
        }
        fn container_gone(&self, id: &str, why: Gone) {
            self.gone.lock().unwrap().push((id.to_string(), why));
        }
        fn synchronize(&self, pods: &[api::PodSandbox], containers: &[api::Container]) {
            self.synced
                .lock()
                .unwrap()
                .push((pods.len(), containers.len()));
        }
        fn validates(&self) -> bool {
            true
        }
        fn validation_offered(&self, offered: bool) {
            self.offered.lock().unwrap().push(offered);
        }
        fn validate_adjustment(
            &self,
            req: &api::ValidateContainerAdjustmentRequest,
            me: &str,
        ) -> Result<(), String> {
            let name = req.container.as_ref().map_or("", |c| c.name.as_str());
            match name {
                "panic" => panic!("validator bug"),
                "slow" => std::thread::sleep(Duration::from_millis(400)),
                "refuse" => return Err(format!("{me}: plugin \"10-x\" added /dev/nvidia0")),
                _ => {}
            }
            Ok(())
        }
    }

    fn service() -> (Arc<Recorder>, Service) {
        let r = Arc::new(Recorder::default());
        (r.clone(), Service::new(r))
    }

    fn create(name: &str) -> Vec<u8> {
        api::CreateContainerRequest {
            pod: Some(api::PodSandbox {
                name: "p".into(),
                ..Default::default()
            }),
            container: Some(api::Container {
                id: "c1".into(),
                name: name.into(),
                ..Default::default()
            }),
        }
        .encode_to_vec()
    }

    #[test]
    fn mask_is_create_post_start_stop_remove() {
        // Event numbers 4, 7, 10, 11 → bits 3, 6, 9, 10.
        assert_eq!(event_mask(), (1 << 3) | (1 << 6) | (1 << 9) | (1 << 10));
        let (_, s) = service();
        let out = s.call(
            PLUGIN_SERVICE,
            "Configure",
            &api::ConfigureRequest::default().encode_to_vec(),
        );
        let resp = api::ConfigureResponse::decode(out.unwrap().as_slice()).unwrap();
        assert_eq!(resp.events, event_mask());
    }

    #[test]
    fn validation_is_offered_from_nri_0_10_only() {
        for (rt, v, nri, offered) in [
            ("containerd", "v2.3.4", "v0.12.0", true),
            ("containerd", "v2.3.4", "", true),
            ("containerd", "v2.2.0", "", true),
            ("containerd", "v2.2.0-rc.1", "", true),
            ("containerd", "v2.1.6", "", false),
            ("containerd", "1.7.30", "", false),
            ("cri-o", "1.36.3", "", true),
            ("cri-o", "1.34.0", "", true),
            ("cri-o", "1.33.4", "", false),
            ("other", "9.9.9", "", false),
            ("other", "9.9.9", "v0.10.0", true),
            ("containerd", "v2.3.4", "v0.9.0", false),
            ("containerd", "garbage", "", false),
            ("containerd", "v2.3.4", "unknown", true),
        ] {
            assert_eq!(
                validation_offered(rt, v, nri),
                offered,
                "{rt} {v} nri={nri}"
            );
        }
    }

    #[test]
    fn configure_subscribes_validation_where_offered_and_it_rejects_or_accepts() {
        let (r, s) = service();
        let s = s.named("90", "gpufence");
        let configure = |rt: &str, v: &str| {
            let req = api::ConfigureRequest {
                runtime_name: rt.into(),
                runtime_version: v.into(),
                ..Default::default()
            };
            let out = s.call(PLUGIN_SERVICE, "Configure", &req.encode_to_vec());
            api::ConfigureResponse::decode(out.unwrap().as_slice())
                .unwrap()
                .events
        };
        assert_eq!(configure("containerd", "v2.1.0"), event_mask());
        assert_eq!(configure("containerd", "v2.3.4"), event_mask() | (1 << 13));
        assert_eq!(*r.offered.lock().unwrap(), [false, true]);
        let validate = |name: &str| {
            let req = api::ValidateContainerAdjustmentRequest {
                container: Some(api::Container {
                    id: "c1".into(),
                    name: name.into(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let out = s.call(
                PLUGIN_SERVICE,
                "ValidateContainerAdjustment",
                &req.encode_to_vec(),
            );
            api::ValidateContainerAdjustmentResponse::decode(out.unwrap().as_slice()).unwrap()
        };
        assert!(!validate("app").reject);
        let refused = validate("refuse");
        assert!(refused.reject);
        assert_eq!(
            refused.reason,
            "90-gpufence: plugin \"10-x\" added /dev/nvidia0"
        );
        // A validator that panics or runs late rejects (fail closed).
        let panicked = validate("panic");
        assert!(panicked.reject && panicked.reason.contains("internal error validating"));
        let cfg = api::ConfigureRequest {
            request_timeout: 200,
            runtime_name: "containerd".into(),
            runtime_version: "v2.3.4".into(),
            ..Default::default()
        };
        s.call(PLUGIN_SERVICE, "Configure", &cfg.encode_to_vec())
            .unwrap();
        let late = validate("slow");
        assert!(
            late.reject && late.reason.contains("no decision within 150ms"),
            "{late:?}"
        );
        // Garbage is an error answer, which NRI turns into a failed creation.
        let e = s
            .call(PLUGIN_SERVICE, "ValidateContainerAdjustment", &[0xff, 0xff])
            .unwrap_err();
        assert_eq!(e.0, code::INVALID_ARGUMENT);
    }

    #[test]
    fn create_returns_the_adjustment_or_the_reason() {
        let (_, s) = service();
        let out = s
            .call(PLUGIN_SERVICE, "CreateContainer", &create("app"))
            .unwrap();
        let resp = api::CreateContainerResponse::decode(out.as_slice()).unwrap();
        assert_eq!(resp.adjust.unwrap().env[0].value, "c1");
        assert_eq!(
            s.call(PLUGIN_SERVICE, "CreateContainer", &create("refuse")),
            Err((code::UNKNOWN, "container c1: no GPU for pod p".into()))
        );
        // No container: refused, not a default adjustment.
        let empty = api::CreateContainerRequest::default().encode_to_vec();
        assert_eq!(
            s.call(PLUGIN_SERVICE, "CreateContainer", &empty)
                .unwrap_err()
                .0,
            code::INVALID_ARGUMENT
        );
    }

    #[test]
    fn a_slow_decision_is_a_refusal_before_the_runtime_s_timeout() {
        let (_, s) = service();
        // Configure: request timeout 200 ms → 150 ms for the decision.
        let cfg = api::ConfigureRequest {
            request_timeout: 200,
            ..Default::default()
        };
        s.call(PLUGIN_SERVICE, "Configure", &cfg.encode_to_vec())
            .unwrap();
        let t = std::time::Instant::now();
        let (code, why) = s
            .call(PLUGIN_SERVICE, "CreateContainer", &create("slow"))
            .unwrap_err();
        assert!(
            t.elapsed() < Duration::from_millis(190),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(code, code::UNKNOWN);
        assert!(
            why.contains("container c1: gpufence nri: no decision within 150ms"),
            "{why}"
        );
        // A handler panic is a refusal too (under NRI's default timeout again: with
        // RUST_BACKTRACE set, the panic's backtrace alone can take longer than 150 ms).
        let cfg = api::ConfigureRequest {
            request_timeout: 2000,
            ..Default::default()
        };
        s.call(PLUGIN_SERVICE, "Configure", &cfg.encode_to_vec())
            .unwrap();
        let (code, why) = s
            .call(PLUGIN_SERVICE, "CreateContainer", &create("panic"))
            .unwrap_err();
        assert_eq!(
            (code, why.contains("internal error")),
            (code::UNKNOWN, true)
        );
        assert!(
            s.call(PLUGIN_SERVICE, "CreateContainer", &create("app"))
                .is_ok()
        );
        assert_eq!(decision_deadline(2000), Duration::from_millis(1500));
    }

    #[test]
    fn malformed_and_unknown_requests_are_answered_not_fatal() {
        let (_, s) = service();
        for bad in [
            &[0xffu8, 0xff][..],
            &[0x0a, 0x80][..],
            &[0x12, 0x05, 0x01][..],
        ] {
            let e = s.call(PLUGIN_SERVICE, "CreateContainer", bad).unwrap_err();
            assert_eq!(e.0, code::INVALID_ARGUMENT, "{bad:?}");
            assert!(e.1.contains("malformed CreateContainer"), "{}", e.1);
        }
        assert_eq!(
            s.call(PLUGIN_SERVICE, "RunPodSandbox", &[]).unwrap_err().0,
            code::UNIMPLEMENTED
        );
        assert_eq!(
            s.call("other.Service", "Configure", &[]).unwrap_err().0,
            code::UNIMPLEMENTED
        );
        // Still serving.
        assert!(
            s.call(PLUGIN_SERVICE, "CreateContainer", &create("app"))
                .is_ok()
        );
    }

    #[test]
    fn stop_remove_and_state_change_reach_the_handler() {
        let (r, s) = service();
        let ctr = Some(api::Container {
            id: "c9".into(),
            ..Default::default()
        });
        let stop = api::StopContainerRequest {
            pod: None,
            container: ctr.clone(),
        };
        s.call(PLUGIN_SERVICE, "StopContainer", &stop.encode_to_vec())
            .unwrap();
        let rm = api::RemoveContainerRequest {
            pod: None,
            container: ctr.clone(),
        };
        s.call(PLUGIN_SERVICE, "RemoveContainer", &rm.encode_to_vec())
            .unwrap();
        let ev = api::StateChangeEvent {
            event: api::Event::RemoveContainer as i32,
            pod: None,
            container: ctr.clone(),
        };
        s.call(PLUGIN_SERVICE, "StateChange", &ev.encode_to_vec())
            .unwrap();
        let ev = api::StateChangeEvent {
            event: api::Event::StartContainer as i32,
            pod: None,
            container: ctr,
        };
        s.call(PLUGIN_SERVICE, "StateChange", &ev.encode_to_vec())
            .unwrap();
        assert_eq!(
            *r.gone.lock().unwrap(),
            [
                ("c9".to_string(), Gone::Stopped),
                ("c9".to_string(), Gone::Removed),
                ("c9".to_string(), Gone::Removed)
            ]
        );
    }

    #[test]
    fn split_synchronize_is_gathered_and_echoes_more() {
        let (r, s) = service();
        let part = |n: usize, more: bool| {
            api::SynchronizeRequest {
                pods: vec![api::PodSandbox::default(); n],
                containers: vec![api::Container::default(); n * 2],
                more,
            }
            .encode_to_vec()
        };
        for (n, more) in [(2, true), (3, true), (1, false)] {
            let out = s
                .call(PLUGIN_SERVICE, "Synchronize", &part(n, more))
                .unwrap();
            let resp = api::SynchronizeResponse::decode(out.as_slice()).unwrap();
            assert_eq!(resp.more, more);
            assert!(resp.update.is_empty());
        }
        assert_eq!(*r.synced.lock().unwrap(), [(6, 12)]);
        // A later full sync starts afresh.
        s.call(PLUGIN_SERVICE, "Synchronize", &part(1, false))
            .unwrap();
        assert_eq!(r.synced.lock().unwrap()[1], (1, 2));
    }

    proptest::proptest! {
        /// Whatever bytes arrive for any method, the service answers (a payload or a status)
        /// and goes on serving.
        #[test]
        fn any_payload_for_any_method_is_answered(
            method in proptest::sample::select(vec![
                "Configure", "Synchronize", "Shutdown", "CreateContainer", "StopContainer",
                "RemoveContainer", "StateChange", "UpdateContainer", "ValidateContainerAdjustment", "",
            ]),
            payload in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
        ) {
            let (_, s) = service();
            if let Err((code, msg)) = s.call(PLUGIN_SERVICE, method, &payload) {
                proptest::prop_assert!(code != code::OK);
                proptest::prop_assert!(!msg.is_empty());
            }
            proptest::prop_assert!(s.call(PLUGIN_SERVICE, "CreateContainer", &create("app")).is_ok());
        }
    }
}
