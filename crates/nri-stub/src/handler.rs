//! What a plugin answers: the adjustment for a container being created (or a refusal), word of
//! containers that started or are gone, and the runtime's view at (re)connect.

use crate::api::{
    Container, ContainerAdjustment, ContainerUpdate, PodSandbox, ValidateContainerAdjustmentRequest,
};

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

    /// Container `ctr` started (its init pid in `ctr.pid`). Default: nothing to do.
    fn container_started(&self, _pod: &PodSandbox, _ctr: &Container) {}

    /// The runtime's pods and containers when the plugin (re)connects (all Synchronize parts
    /// together). Default: nothing to do.
    fn synchronize(&self, _pods: &[PodSandbox], _containers: &[Container]) {}

    /// After the fact: container `ctr` (created or running; listed at Synchronize, or just
    /// started) may have been created without the plugin. Called off the runtime's request
    /// path, with `rt` to call the runtime back. Default: nothing to do.
    fn after_the_fact(&self, _rt: &dyn Runtime, _pod: &PodSandbox, _ctr: &Container) {}

    /// Whether the plugin validates the merged adjustment of every plugin (NRI's
    /// `ValidateContainerAdjustment`, NRI ≥ v0.10: containerd ≥ 2.2, CRI-O ≥ 1.34) where the
    /// runtime offers it. Default: no.
    fn validates(&self) -> bool {
        false
    }

    /// Said at each Configure: whether this runtime will ask [`Handler::validate_adjustment`]
    /// (the plugin subscribed to it). Default: nothing to do.
    fn validation_offered(&self, _offered: bool) {}

    /// NRI's validation of a container's creation: `req` holds the container as the runtime
    /// made it, the adjustment every plugin's answers merged into, and which plugin owns each
    /// part; `me` is this plugin as NRI names owners (`<index>-<name>`). `Err(reason)` (one
    /// line) rejects the adjustment, and the runtime fails the creation with it. Default: accept.
    fn validate_adjustment(
        &self,
        _req: &ValidateContainerAdjustmentRequest,
        _me: &str,
    ) -> Result<(), String> {
        Ok(())
    }
}

/// The runtime's side of the connection, for the calls a handler makes itself.
pub trait Runtime {
    /// NRI's `UpdateContainers`: the updates the runtime reports it could not apply.
    fn update_containers(
        &self,
        update: Vec<ContainerUpdate>,
    ) -> Result<Vec<ContainerUpdate>, String>;
}
