//! Plan step: the device nodes of the allocated GPUs (a MIG device's parent GPU and its
//! nvidia-caps nodes), then the control nodes; and the driver files their capabilities need.

use crate::allocation::{Allocation, AllocationError, DeviceRef};
use crate::cdi::DeviceNodeEdit;
use crate::inventory::{Capability, DeviceNode, DriverFile, Inventory};

fn push<'a>(n: &'a DeviceNode, nodes: &mut Vec<&'a DeviceNode>) {
    if !nodes.iter().any(|x| x.path == n.path) {
        nodes.push(n);
    }
}

/// Device-node edits for the allocated devices and the control nodes they need.
pub fn device_nodes(
    alloc: &Allocation,
    inventory: &Inventory,
) -> Result<Vec<DeviceNodeEdit>, AllocationError> {
    let mut nodes: Vec<&DeviceNode> = Vec::new();
    for d in &alloc.devices {
        let missing = || {
            AllocationError::new(
                "inventory",
                &d.uuid,
                "allocated device is not in the inventory",
            )
        };
        match d.device {
            DeviceRef::Gpu { index } => {
                let g = inventory.gpu_by_index(index).ok_or_else(missing)?;
                push(&g.node, &mut nodes);
            }
            DeviceRef::Mig { gpu, mig } => {
                let g = inventory.gpu_by_index(gpu).ok_or_else(missing)?;
                let m = g
                    .mig_devices
                    .iter()
                    .find(|m| m.index == mig)
                    .ok_or_else(missing)?;
                push(&g.node, &mut nodes);
                for c in &m.caps {
                    push(c, &mut nodes);
                }
            }
        }
    }
    let display = alloc
        .capabilities
        .iter()
        .any(|c| matches!(c, Capability::Graphics | Capability::Display));
    let mut control: Vec<&DeviceNode> = inventory
        .control_nodes
        .iter()
        .filter(|n| {
            let name = std::path::Path::new(&n.path)
                .file_name()
                .and_then(|f| f.to_str())
                .unwrap_or_default();
            matches!(name, "nvidiactl" | "nvidia-uvm" | "nvidia-uvm-tools")
                || (display && name == "nvidia-modeset")
        })
        .collect();
    control.sort_by(|a, b| a.path.cmp(&b.path));
    for n in control {
        push(n, &mut nodes);
    }
    Ok(nodes.iter().map(|n| device_node_edit(n)).collect())
}

/// The driver files of the allocation's capabilities, by container path, each path once.
pub fn driver_files<'a>(alloc: &'a Allocation, inventory: &'a Inventory) -> Vec<&'a DriverFile> {
    let mut files: Vec<&DriverFile> = inventory.files_for(&alloc.capabilities).collect();
    files.sort_by(|a, b| a.container_path.cmp(&b.container_path));
    files.dedup_by(|a, b| a.container_path == b.container_path);
    files
}

/// The CDI/OCI device-node edit for an inventory device node.
pub fn device_node_edit(n: &crate::inventory::DeviceNode) -> crate::cdi::DeviceNodeEdit {
    crate::cdi::DeviceNodeEdit {
        path: n.path.clone(),
        host_path: Some(n.host_path.display().to_string()),
        kind: Some(n.kind.to_string()),
        major: Some(i64::from(n.major)),
        minor: Some(i64::from(n.minor)),
        file_mode: Some(0o666),
        permissions: Some("rw".to_string()),
        uid: None,
        gid: None,
    }
}
