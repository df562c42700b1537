//! What a plugin answers: the adjustment for a container being created (or a refusal), word of
//! containers that started or are gone, and the runtime's view at (re)connect.

use crate::api::{Container, ContainerAdjustment, ContainerUpdate, PodSandbox};

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
}

/// The runtime's side of the connection, for the calls a handler makes itself.
pub trait Runtime {
    /// NRI's `UpdateContainers`: the updates the runtime reports it could not apply.
    fn update_containers(
        &self,
        update: Vec<ContainerUpdate>,
    ) -> Result<Vec<ContainerUpdate>, String>;
}
