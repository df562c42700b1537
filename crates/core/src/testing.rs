//! Fixtures for the unit tests of this crate and of the crates above it (feature `testing`):
//! a one-GPU inventory and a node whose driver files a plan binds. Never built into a binary.

use std::path::PathBuf;

use crate::cdi::MountEdit;
use crate::inventory::{Capability, DeviceNode, DriverFile, FileKind, Gpu, Inventory};
use crate::plan::{Plan, RO_BIND};

/// The x86_64 library folder the fixtures put their libraries in.
pub const L: &str = "/usr/lib/x86_64-linux-gnu";

/// One GPU (`GPU-a`, /dev/nvidia0) and /dev/nvidiactl; also the NRI handler's fixture.
pub fn inv() -> Inventory {
    let node = |p: &str, minor| DeviceNode {
        path: p.to_string(),
        host_path: p.into(),
        kind: 'c',
        major: 195,
        minor,
    };
    Inventory {
        driver_version: "580.65.06".into(),
        cuda_driver_version: 12080,
        gpus: vec![Gpu {
            index: 0,
            minor: 0,
            uuid: "GPU-a".into(),
            name: "x".into(),
            memory_bytes: 1 << 34,
            pci_bus_id: "00000000:01:00.0".into(),
            compute_capability: (9, 0),
            mig_enabled: false,
            mig_capable: false,
            mig_devices: vec![],
            node: node("/dev/nvidia0", 0),
        }],
        control_nodes: vec![node("/dev/nvidiactl", 255)],
        driver_files: vec![],
        memory_limits: Default::default(),
    }
}

pub fn file(host: &str, container: &str, kind: FileKind, soname: Option<&str>) -> DriverFile {
    DriverFile {
        host_path: PathBuf::from(host),
        container_path: container.to_string(),
        kind,
        capability: Capability::Compute,
        soname: soname.map(str::to_string),
    }
}

pub fn bind(f: &DriverFile, opts: &[&str]) -> MountEdit {
    MountEdit {
        host_path: f.host_path.display().to_string(),
        container_path: f.container_path.clone(),
        kind: None,
        options: opts.iter().map(|s| s.to_string()).collect(),
    }
}

/// A node's driver files under `root` and a plan binding all of them (plus the shim).
pub fn folder_node(root: &str) -> (Inventory, Plan) {
    let files = vec![
        file(
            &format!("{root}/cuda"),
            &format!("{L}/libcuda.so.580"),
            FileKind::Library,
            Some("libcuda.so.1"),
        ),
        file(
            &format!("{root}/ml"),
            &format!("{L}/libnvidia-ml.so.580"),
            FileKind::Library,
            Some("libnvidia-ml.so.1"),
        ),
        file(
            &format!("{root}/json"),
            &format!("{L}/node.json"),
            FileKind::Config,
            None,
        ),
        file(
            &format!("{root}/timeline"),
            &format!("{L}/timeline"),
            FileKind::DeviceState,
            None,
        ),
        file(
            &format!("{root}/cuda32"),
            "/usr/lib/i386-linux-gnu/libcuda.so.580",
            FileKind::Library,
            Some("libcuda.so.1"),
        ),
        file(
            &format!("{root}/smi"),
            "/usr/bin/nvidia-smi",
            FileKind::Binary,
            None,
        ),
        file(
            &format!("{root}/gsp1"),
            "/lib/firmware/nvidia/580/gsp_a.bin",
            FileKind::Firmware,
            None,
        ),
        file(
            &format!("{root}/gsp2"),
            "/lib/firmware/nvidia/580/gsp_b.bin",
            FileKind::Firmware,
            None,
        ),
        file(
            &format!("{root}/sock"),
            "/run/nvidia-persistenced/socket",
            FileKind::Socket,
            None,
        ),
    ];
    let mut plan = Plan::default();
    plan.edits.mounts = files
        .iter()
        .map(|f| match f.kind {
            FileKind::DeviceState => bind(f, &crate::plan::RW_STATE_BIND),
            _ => bind(f, &RO_BIND),
        })
        .collect();
    plan.edits.mounts.insert(
        2,
        MountEdit {
            host_path: "/opt/shim.so".into(),
            container_path: "/usr/lib/gpufence/libgpufence.so".into(),
            kind: None,
            options: RO_BIND.iter().map(|s| s.to_string()).collect(),
        },
    );
    let mut inv = Inventory::empty();
    inv.driver_version = "580.65.06".into();
    inv.driver_files = files;
    (inv, plan)
}
