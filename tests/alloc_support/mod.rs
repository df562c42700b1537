//! Fixtures for the allocation/plan tests: an inventory built by hand (no NVML), config.json
//! builders, configs.
#![allow(dead_code)]

use std::path::PathBuf;

use gpufence::cdi::{LoadedSpec, Spec};
use gpufence::config::{Config, Dialect, TrustEnv};
use gpufence::inventory::{
    Capability, DeviceNode, DriverFile, FileKind, Gpu, Inventory, MigDevice,
};

pub const GIB: u64 = 1 << 30;

pub fn node(path: &str, major: u32, minor: u32) -> DeviceNode {
    DeviceNode {
        path: path.to_string(),
        host_path: PathBuf::from(format!("/sim{path}")),
        kind: 'c',
        major,
        minor,
    }
}

/// The whole GPUs a plan grants: (index, memory limit, cores), in container order.
pub fn gpu_limits(p: &gpufence::plan::Plan) -> Vec<(u32, Option<u64>, Option<u8>)> {
    p.allocation
        .as_ref()
        .map(|a| {
            a.devices
                .iter()
                .map(|d| match d.device {
                    gpufence::allocation::DeviceRef::Gpu { index } => {
                        (index, d.memory_limit, d.cores)
                    }
                    gpufence::allocation::DeviceRef::Mig { .. } => panic!("MIG"),
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn uuid(i: u32) -> String {
    format!("GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i}")
}

pub fn mig_uuid(g: u32, m: u32) -> String {
    format!("MIG-{g}{m}{g}{m}{g}{m}{g}{m}-aaaa-bbbb-cccc-dddddddddddd")
}

fn gpu(index: u32, mig: Option<bool>) -> Gpu {
    let mig_enabled = mig == Some(true);
    Gpu {
        index,
        minor: index,
        uuid: uuid(index),
        name: "NVIDIA H100 80GB HBM3".into(),
        memory_bytes: 80 * GIB,
        pci_bus_id: format!("00000000:1{index}:00.0"),
        compute_capability: (9, 0),
        mig_enabled,
        mig_capable: mig.is_some(),
        mig_devices: if mig_enabled {
            (0..2)
                .map(|m| MigDevice {
                    index: m,
                    uuid: mig_uuid(index, m),
                    gi: m + 1,
                    ci: 0,
                    profile: "1g.10gb".into(),
                    memory_bytes: 10 * GIB,
                    caps: vec![
                        node(
                            &format!("/dev/nvidia-caps/nvidia-cap{}", 100 + m * 10),
                            237,
                            100 + m * 10,
                        ),
                        node(
                            &format!("/dev/nvidia-caps/nvidia-cap{}", 101 + m * 10),
                            237,
                            101 + m * 10,
                        ),
                    ],
                })
                .collect()
        } else {
            vec![]
        },
        node: node(&format!("/dev/nvidia{index}"), 195, index),
    }
}

fn file(path: &str, kind: FileKind, cap: Capability) -> DriverFile {
    DriverFile {
        host_path: PathBuf::from(format!("/sim/driver{path}")),
        container_path: path.to_string(),
        kind,
        capability: cap,
        soname: None,
    }
}

/// GPUs 0 and 1 plain, GPU 2 with MIG enabled (MIG 2:0, 2:1, 10 GiB each), GPU 3 MIG-capable
/// with MIG disabled. 80 GiB each.
pub fn inventory() -> Inventory {
    Inventory {
        driver_version: "580.65.06".into(),
        cuda_driver_version: 12080,
        gpus: vec![
            gpu(0, None),
            gpu(1, None),
            gpu(2, Some(true)),
            gpu(3, Some(false)),
        ],
        control_nodes: vec![
            node("/dev/nvidiactl", 195, 255),
            node("/dev/nvidia-modeset", 195, 254),
            node("/dev/nvidia-uvm", 510, 0),
            node("/dev/nvidia-uvm-tools", 510, 1),
        ],
        driver_files: vec![
            file(
                "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
                FileKind::Library,
                Capability::Compute,
            ),
            file(
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.65.06",
                FileKind::Library,
                Capability::Utility,
            ),
            file("/usr/bin/nvidia-smi", FileKind::Binary, Capability::Utility),
            file(
                "/usr/lib/x86_64-linux-gnu/libnvidia-encode.so.580.65.06",
                FileKind::Library,
                Capability::Video,
            ),
            file(
                "/lib/firmware/nvidia/580.65.06/gsp_ga10x.bin",
                FileKind::Firmware,
                Capability::Compute,
            ),
        ],
        memory_limits: Default::default(),
    }
}

/// The test inventory with device minors that differ from the NVML indexes (GPU i has minor
/// `offset + i`, its node `/dev/nvidia<minor>`): Koordinator names GPUs by minor.
pub fn inventory_with_minors(offset: u32) -> Inventory {
    let mut inv = inventory();
    for g in &mut inv.gpus {
        g.minor = offset + g.index;
        g.node.minor = g.minor;
        g.node.path = format!("/dev/nvidia{}", g.minor);
    }
    inv
}

pub fn config() -> Config {
    Config {
        state_dir: PathBuf::from("/run/gpufence"),
        ..Config::default()
    }
}

pub fn trusting(dialects: &[Dialect]) -> Config {
    let mut c = config();
    c.allocation.trust_env = TrustEnv::Dialects(dialects.to_vec());
    c
}

pub fn trust_all() -> Config {
    let mut c = config();
    c.allocation.trust_env = TrustEnv::All(true);
    c
}

/// A config.json with these annotations and env.
pub fn spec(annotations: &[(&str, &str)], env: &[&str]) -> serde_json::Value {
    let ann: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
        .collect();
    serde_json::json!({
        "ociVersion": "1.0.2",
        "process": { "args": ["sh"], "env": env, "cwd": "/" },
        "root": { "path": "rootfs" },
        "annotations": ann,
        "mounts": [ { "destination": "/proc", "type": "proc", "source": "proc" } ],
    })
}

pub fn with_mounts(mut s: serde_json::Value, destinations: &[&str]) -> serde_json::Value {
    let mounts = s["mounts"].as_array_mut().unwrap();
    for d in destinations {
        mounts.push(serde_json::json!({"destination": d, "type": "bind", "source": "/dev/null", "options": ["ro", "bind"]}));
    }
    s
}

pub fn foreign_spec(path: &str, priority: u8, yaml: &str) -> LoadedSpec {
    let spec: Spec = gpufence::cdi::parse::parse_spec(yaml, std::path::Path::new(path)).unwrap();
    LoadedSpec {
        path: PathBuf::from(path),
        priority,
        spec,
    }
}

/// A foreign (non-gpufence) CDI spec, so `cdi.k8s.io/*` annotations can name other kinds.
pub fn foreign_specs() -> Vec<gpufence::cdi::LoadedSpec> {
    vec![foreign_spec(
        "/etc/cdi/nic.yaml",
        0,
        "cdiVersion: \"0.5.0\"\nkind: vendor.com/nic\ndevices:\n- name: nic0\n  containerEdits:\n    deviceNodes:\n    - {path: /dev/vnic0, type: c, major: 240, minor: 0}\n",
    )]
}

/// The plan grants only what the allocation names; without an allocation it grants nothing.
/// Shared by the proptest harness (tests/alloc_fuzz.rs) and the cargo-fuzz `plan` target; panics
/// on a violation (proptest reports and shrinks panics).
pub fn check_plan(p: &gpufence::plan::Plan, inv: &Inventory) {
    use gpufence::allocation::DeviceRef;
    use std::collections::BTreeSet;
    let Some(a) = &p.allocation else {
        assert!(p.grants_nothing(), "no allocation but grants: {p:?}");
        assert!(p.edits.is_empty(), "no allocation but edits: {p:?}");
        assert!(p.cgroup_rules.is_empty() && p.host_files.is_empty() && p.state_dir.is_none());
        for o in &p.env_overrides {
            assert!(o.ends_with("=void"), "override {o:?} without an allocation");
        }
        return;
    };
    let mut allowed: BTreeSet<String> = inv.control_nodes.iter().map(|n| n.path.clone()).collect();
    let mut uuids: BTreeSet<String> = BTreeSet::new();
    for d in &a.devices {
        uuids.insert(d.uuid.clone());
        match d.device {
            DeviceRef::Gpu { index } => {
                let g = inv.gpu_by_index(index).expect("allocated GPU in inventory");
                assert_eq!(g.uuid, d.uuid);
                allowed.insert(g.node.path.clone());
            }
            DeviceRef::Mig { gpu, mig } => {
                let g = inv.gpu_by_index(gpu).expect("MIG parent in inventory");
                assert!(g.mig_enabled, "MIG device on a GPU without MIG");
                let m = g
                    .mig_devices
                    .iter()
                    .find(|m| m.index == mig)
                    .expect("MIG device in inventory");
                assert_eq!(m.uuid, d.uuid);
                allowed.insert(g.node.path.clone());
                allowed.extend(m.caps.iter().map(|c| c.path.clone()));
            }
        }
        if let Some(m) = d.memory_limit {
            assert!(m > 0, "zero memory limit granted");
        }
        if let Some(c) = d.cores {
            assert!((1..=100).contains(&c), "cores {c}");
            assert!(
                matches!(d.device, DeviceRef::Gpu { .. }),
                "compute share on a MIG device"
            );
        }
    }
    assert!(
        !a.cores_burst || a.devices.iter().any(|d| d.cores.is_some()),
        "burst policy without a compute share"
    );
    for f in &a.foreign_cdi {
        allowed.extend(f.edits.device_nodes.iter().map(|n| n.path.clone()));
    }
    for n in &p.edits.device_nodes {
        assert!(
            allowed.contains(&n.path),
            "{} granted but not allocated",
            n.path
        );
        if let Some(i) = n
            .path
            .strip_prefix("/dev/nvidia")
            .and_then(|s| s.parse::<u32>().ok())
        {
            let named = a.devices.iter().any(|d| match d.device {
                DeviceRef::Gpu { index } => index == i,
                DeviceRef::Mig { gpu, .. } => gpu == i,
            });
            assert!(named, "GPU node {} not named by the allocation", n.path);
        }
    }
    assert_eq!(p.cgroup_rules.len(), p.edits.device_nodes.len());
    if a.devices.is_empty() {
        assert!(p.quota.is_none() && p.host_files.is_empty());
        assert!(
            !p.edits
                .mounts
                .iter()
                .any(|m| m.container_path == gpufence::plan::CONTAINER_SHIM_PATH),
            "shim mounted without a GPU"
        );
    } else {
        let q = p.quota.as_ref().expect("GPU allocation without a quota");
        assert_eq!(q.devices.len(), a.devices.len());
        for (i, d) in q.devices.iter().enumerate() {
            assert_eq!(d.ordinal as usize, i);
            assert!(uuids.contains(&d.uuid), "quota for unallocated {}", d.uuid);
        }
        assert_eq!(gpufence::quota::Quota::parse(&q.render()).as_ref(), Ok(q));
        let nvd = p
            .edits
            .env
            .iter()
            .find_map(|e| e.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
            .expect("NVIDIA_VISIBLE_DEVICES set for a GPU allocation");
        for u in nvd.split(',') {
            assert!(
                uuids.contains(u),
                "NVIDIA_VISIBLE_DEVICES names unallocated {u}"
            );
        }
    }
}

/// Plan `spec` as the runtime does with kubelet's checkpoint `checkpoint` (JSON text; `None`: no
/// kubelet), the container named by the CRI annotations of `spec`.
pub fn plan_with_checkpoint(
    spec: &serde_json::Value,
    checkpoint: Option<&str>,
    config: &Config,
) -> Result<gpufence::plan::Plan, gpufence::allocation::AllocationError> {
    use gpufence::kubelet::{self, KubeletSource, PodIdentity};
    let ann = spec["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect();
    let source = match (checkpoint, PodIdentity::from_annotations(&ann)) {
        (Some(cp), Ok(Some(id))) => kubelet::from_checkpoint_bytes(cp.as_bytes(), &id, "/cp"),
        _ => KubeletSource::Absent,
    };
    gpufence::plan::plan_with(spec, "ctr-1", &inventory(), config, &[], &source)
}
