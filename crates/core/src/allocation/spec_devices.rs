//! Grants that arrive as devices: the GPU device nodes the engine already put into the spec.
//!
//! kubelet hands a container its GPU as devices three ways — a device plugin's DeviceSpecs (CRI
//! `devices`), a device plugin's CDI devices and every DRA claim's CDI ids (CRI `CDIDevices`) —
//! and the engine (containerd, CRI-O) resolves them into `linux.devices` before any runtime or
//! NRI plugin sees the container; podman `--device` and docker `--gpus` do the same outside
//! Kubernetes. Every node of `linux.devices` whose type and major:minor is a GPU, a MIG
//! capability or a control node of the inventory is a *device-borne grant* ([`read`]):
//! * its GPUs and MIG devices (a MIG device: all of its capability nodes) become the `devices`
//!   dialect's part of the allocation, fenced like any other grant (exact nodes, cgroup rules,
//!   driver files, shim, quota: the whole device, narrowed by gpufence's annotations); on a CRI
//!   container each must be backed by kubelet's record ([`super::backing`]);
//! * the other nodes (control nodes, capability nodes of no whole MIG device) must be backed by
//!   a device node kubelet recorded, or — control nodes — come with a granted GPU ([`check_rest`]).
//!
//! A privileged container (its device cgroup allows every device) is no grant: it can open every
//! device of the node anyway. Pure.

use super::backing::{Recorded, Subject};
use super::container_dialects::{Facet, Part};
pub use super::device_nodes::{NodeKey, NodeOf, devices_of, node_at, node_of};
use super::devices::Resolved;
use super::input::{Inputs, SpecDevice};
use super::{AllocationError, DeviceRef};
use crate::config::{Dialect, NonCriDevices, TrustAnnotations};
use crate::inventory::Inventory;

/// The key refusals name for a device-borne grant.
pub const KEY: &str = "linux.devices";

/// The device-borne grants of one container.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Borne {
    /// The GPU-related nodes of the spec, in spec order.
    pub nodes: Vec<SpecDevice>,
    /// The GPUs and MIG devices they grant, by index.
    pub devices: Vec<Resolved>,
    /// The nodes that grant no device (control nodes, capability nodes of no whole MIG device).
    pub rest: Vec<SpecDevice>,
}

impl Borne {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The spec nodes that grant `d`, for messages.
    pub fn nodes_of(&self, inv: &Inventory, d: DeviceRef) -> Vec<&SpecDevice> {
        self.nodes
            .iter()
            .filter(|n| match (node_of(inv, (n.kind, n.major, n.minor)), d) {
                (Some(NodeOf::Gpu(i)), DeviceRef::Gpu { index }) => i == index,
                (Some(NodeOf::Gpu(i)), DeviceRef::Mig { gpu, .. }) => i == gpu,
                (Some(NodeOf::Cap { gpu: g, migs }), DeviceRef::Mig { gpu, mig }) => {
                    g == gpu && migs.contains(&mig)
                }
                _ => false,
            })
            .collect()
    }
}

/// The device-borne grants of `inputs` (none for a privileged container).
pub fn read(inputs: &Inputs, inv: &Inventory) -> Borne {
    if inputs.all_devices_allowed {
        return Borne::default();
    }
    let nodes: Vec<SpecDevice> = inputs
        .devices
        .iter()
        .filter(|d| node_of(inv, (d.kind, d.major, d.minor)).is_some())
        .cloned()
        .collect();
    let keys: Vec<NodeKey> = nodes.iter().map(|d| (d.kind, d.major, d.minor)).collect();
    let (devices, rest_keys) = devices_of(inv, &keys);
    let rest = nodes
        .iter()
        .filter(|d| rest_keys.contains(&(d.kind, d.major, d.minor)))
        .cloned()
        .collect();
    Borne {
        nodes,
        devices,
        rest,
    }
}

/// The `devices` dialect's part: the granted devices, named by their spec paths.
pub fn part(b: &Borne) -> Part {
    let mut part = Part::new(Dialect::Devices);
    if !b.devices.is_empty() {
        let paths: Vec<&str> = b.nodes.iter().map(|n| n.path.as_str()).collect();
        part.devices = Some(Facet::new(b.devices.clone(), KEY, &paths.join(",")));
    }
    part
}

/// `allocation.non-cri-devices = "refuse"`: a container outside CRI with GPU device nodes is
/// refused; and every note the device-borne grants are worth.
pub fn policy(
    s: &Subject,
    inputs: &Inputs,
    b: &Borne,
    policy: NonCriDevices,
    notes: &mut Vec<String>,
) -> Result<(), AllocationError> {
    if inputs.all_devices_allowed && !inputs.devices.is_empty() {
        notes.push(
            "privileged container (its device cgroup allows every device): device nodes in its \
             spec are not fenced"
                .to_string(),
        );
    }
    if b.is_empty() || s.cri {
        return Ok(());
    }
    if policy == NonCriDevices::Refuse {
        let first = &b.nodes[0];
        return Err(AllocationError::new(
            KEY,
            &first.path,
            format!(
                "{} in the spec of a container not created through CRI, which no kubelet \
                 record can back (allocation.non-cri-devices = \"refuse\")",
                first.shown()
            ),
        ));
    }
    notes.push(format!(
        "device nodes in the spec fenced as the container's allocation (not created through \
         CRI; allocation.non-cri-devices = \"fence\"): {}",
        b.nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(())
}

/// Every spec node that grants no device must be backed: a node kubelet recorded for the
/// container, or a control node that comes with a granted device (the plan gives it anyway).
/// On a CRI container under `trust-annotations = "kubelet"` anything else is refused.
pub fn check_rest(
    s: &Subject,
    recorded: Option<&Recorded>,
    b: &Borne,
    granted: usize,
) -> Result<(), AllocationError> {
    if !s.cri || s.mode != TrustAnnotations::Kubelet {
        return Ok(());
    }
    for n in &b.rest {
        let key = (n.kind, n.major, n.minor);
        let control = node_of(s.inventory, key) == Some(NodeOf::Control);
        let backed = recorded.is_some_and(|r| r.backing_of_node(key).is_some());
        if backed || (control && granted > 0) {
            continue;
        }
        return Err(super::backing::unbacked(
            s,
            recorded,
            &n.shown(),
            KEY,
            &n.path,
        ));
    }
    Ok(())
}
