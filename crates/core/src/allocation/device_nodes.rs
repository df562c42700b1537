//! What a device node of this node is — a GPU's, a MIG capability's, a control node — and the
//! GPUs and MIG devices a set of nodes grants: read by the device-borne grants
//! ([`super::spec_devices`]) and by what kubelet recorded ([`super::backing`]). Pure.

use super::DeviceRef;
use super::devices::Resolved;
use crate::inventory::Inventory;

/// A device node as the cgroup names it: type, major, minor.
pub type NodeKey = (char, u32, u32);

/// What one device node of the node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeOf {
    /// The node of the GPU with this index.
    Gpu(u32),
    /// A MIG capability node (`nvidia-caps`) of these MIG devices of GPU `gpu`.
    Cap { gpu: u32, migs: Vec<u32> },
    /// A control node (`nvidiactl`, `nvidia-uvm`, …).
    Control,
}

/// What the inventory says a node is; `None`: not a GPU-related node of this node.
pub fn node_of(inv: &Inventory, key: NodeKey) -> Option<NodeOf> {
    let is = |n: &crate::inventory::DeviceNode| (n.kind, n.major, n.minor) == key;
    if let Some(g) = inv.gpus.iter().find(|g| is(&g.node)) {
        return Some(NodeOf::Gpu(g.index));
    }
    for g in &inv.gpus {
        let migs: Vec<u32> = g
            .mig_devices
            .iter()
            .filter(|m| m.caps.iter().any(is))
            .map(|m| m.index)
            .collect();
        if !migs.is_empty() {
            return Some(NodeOf::Cap { gpu: g.index, migs });
        }
    }
    inv.control_nodes.iter().any(is).then_some(NodeOf::Control)
}

/// The inventory node at a host or container path (a device plugin's DeviceSpec host path).
pub fn node_at(inv: &Inventory, path: &str) -> Option<NodeKey> {
    let p = std::path::Path::new(path);
    inv.gpus
        .iter()
        .map(|g| &g.node)
        .chain(
            inv.gpus
                .iter()
                .flat_map(|g| g.mig_devices.iter().flat_map(|m| &m.caps)),
        )
        .chain(&inv.control_nodes)
        .find(|n| n.host_path == p || n.path == path)
        .map(|n| (n.kind, n.major, n.minor))
}

/// The GPUs and MIG devices a set of nodes grants, and the nodes that name none. A GPU with MIG
/// enabled whose node comes with every capability node of some of its MIG devices grants those
/// MIG devices; else the whole GPU. A MIG device whose capability nodes are all there is granted
/// even without its GPU's node (the plan adds it).
pub fn devices_of(inv: &Inventory, keys: &[NodeKey]) -> (Vec<Resolved>, Vec<NodeKey>) {
    let has = |n: &crate::inventory::DeviceNode| keys.contains(&(n.kind, n.major, n.minor));
    let mut devices: Vec<Resolved> = Vec::new();
    let mut used: Vec<NodeKey> = Vec::new();
    let mut gpus: Vec<&crate::inventory::Gpu> = inv.gpus.iter().collect();
    gpus.sort_by_key(|g| g.index);
    for g in gpus {
        let whole_migs: Vec<&crate::inventory::MigDevice> = g
            .mig_devices
            .iter()
            .filter(|m| g.mig_enabled && !m.caps.is_empty() && m.caps.iter().all(has))
            .collect();
        for m in &whole_migs {
            devices.push(Resolved {
                device: DeviceRef::Mig {
                    gpu: g.index,
                    mig: m.index,
                },
                uuid: m.uuid.clone(),
                memory_bytes: m.memory_bytes,
            });
            used.extend(m.caps.iter().map(|c| (c.kind, c.major, c.minor)));
        }
        if has(&g.node) {
            if whole_migs.is_empty() {
                devices.push(Resolved {
                    device: DeviceRef::Gpu { index: g.index },
                    uuid: g.uuid.clone(),
                    memory_bytes: g.memory_bytes,
                });
            }
            used.push((g.node.kind, g.node.major, g.node.minor));
        }
    }
    let rest = keys
        .iter()
        .filter(|k| !used.contains(k) && node_of(inv, **k).is_some())
        .copied()
        .collect();
    (devices, rest)
}
