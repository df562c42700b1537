//! The request's device part — a container's `linux.devices` and `linux.resources.devices` as
//! the engine wrote them (a device plugin's DeviceSpecs, CDI devices it resolved, `--device`) —
//! read into device-borne grants and planned for a CRI container against kubelet's record.
//! Input: one selector byte (which record: none, a DRA claim of GPU 1 — shared or not, its share
//! written or not — and a device plugin's DeviceSpecs of GPU 0; the trust mode), then the
//! `linux` object's JSON. Whatever the devices: no panic; an error is one short line; a plan
//! grants only what its allocation names, and every GPU node of the spec (unless the container
//! may open every device) is a device of the allocation, under the quota, backed by kubelet's
//! record under `trust-annotations = "kubelet"`.
#![no_main]

use gpufence::allocation::DeviceRef;
use gpufence::allocation::backing::Backing;
use gpufence::allocation::input::Inputs;
use gpufence::allocation::spec_devices::{self, NodeOf};
use gpufence::cdi::LoadedSpec;
use gpufence::config::TrustAnnotations;
use gpufence::kubelet::{
    ContainerRecord, DraClaimRecord, KubeletSource, PodIdentity, ResourceGrant,
};
use libfuzzer_sys::fuzz_target;

#[path = "../common/plan_check.rs"]
mod plan_check;

const DRA_ID: &str = "k8s.gpu.nvidia.com/claim=c0ffee-gpu-1";

/// kubelet's record from the selector's low bits.
fn record(sel: u8) -> KubeletSource {
    if sel & 1 == 0 {
        return KubeletSource::Absent;
    }
    let mut plugin = ResourceGrant {
        resource: "example.com/gpu".into(),
        device_ids: vec!["dev-0".into()],
        envs: Default::default(),
        annotations: Default::default(),
        mounts: vec![],
        devices: vec![],
        cdi_devices: vec![],
    };
    plugin.devices = vec![
        ("/dev/nvidia0".into(), "/dev/nvidia0".into(), "rw".into()),
        (
            "/dev/nvidiactl".into(),
            "/dev/nvidiactl".into(),
            "rw".into(),
        ),
    ];
    let shared = sel & 2 != 0;
    KubeletSource::Record(ContainerRecord {
        identity: PodIdentity {
            pod_uid: "u".into(),
            container_name: "main".into(),
            pod: Some("team/train".into()),
        },
        checkpoint: "/cp".into(),
        resources: vec![plugin],
        dra_claims: vec![DraClaimRecord {
            claim: "team/train-gpu".into(),
            cdi_device_ids: vec![DRA_ID.into()],
            shared_cdi_ids: if shared { vec![DRA_ID.into()] } else { vec![] },
        }],
        dra_unavailable: None,
        replicas: vec![],
    })
}

/// The claim's CDI spec: GPU 1 and nvidiactl, with a share of 8Gi written or not.
fn specs(sel: u8) -> Vec<LoadedSpec> {
    let ann = if sel & 4 != 0 {
        "  annotations: {gpufence.dev/memory: 8Gi}\n"
    } else {
        ""
    };
    let yaml = format!(
        "cdiVersion: \"0.6.0\"\nkind: k8s.gpu.nvidia.com/claim\ndevices:\n- name: c0ffee-gpu-1\n{ann}  containerEdits:\n    deviceNodes:\n    - {{path: /dev/nvidia1, type: c, major: 195, minor: 1}}\n    - {{path: /dev/nvidiactl, type: c, major: 195, minor: 255}}\n"
    );
    let path = std::path::Path::new("/var/run/cdi/claim.yaml");
    let mut out = plan_check::foreign_specs();
    out.push(LoadedSpec {
        path: path.to_path_buf(),
        priority: 1,
        spec: gpufence::cdi::parse::parse_spec(&yaml, path).expect("the claim's spec"),
    });
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let Ok(linux) = serde_json::from_slice::<serde_json::Value>(rest) else {
        return;
    };
    let spec = serde_json::json!({
        "process": {"env": ["PATH=/bin"]},
        "annotations": {
            "io.kubernetes.cri.sandbox-uid": "u",
            "io.kubernetes.cri.container-name": "main",
            "io.kubernetes.cri.sandbox-namespace": "team",
            "io.kubernetes.cri.sandbox-name": "train",
        },
        "linux": linux,
    });
    let inv = plan_check::inventory();
    let one_line = |line: String| {
        assert!(!line.contains('\n'), "multi-line error: {line}");
        assert!(line.len() < 2000, "error of {} bytes", line.len());
    };
    let inputs = match Inputs::from_spec(&spec) {
        Ok(i) => i,
        Err(e) => return one_line(e.to_string()),
    };
    // The device-borne grants: only GPU-related nodes of the spec, none when privileged.
    let borne = spec_devices::read(&inputs, &inv);
    assert!(!inputs.all_devices_allowed || borne.is_empty());
    for n in &borne.nodes {
        assert!(inputs.devices.contains(n));
        assert!(spec_devices::node_of(&inv, (n.kind, n.major, n.minor)).is_some());
    }
    assert!(borne.rest.iter().all(|n| borne.nodes.contains(n)));
    for (i, d) in borne.devices.iter().enumerate() {
        assert!(
            !borne.devices[..i].iter().any(|e| e.device == d.device),
            "{borne:?}"
        );
    }

    let mut cfg = plan_check::config(0, 0);
    cfg.allocation.trust_annotations = match sel >> 6 {
        0 | 1 => TrustAnnotations::Kubelet,
        2 => TrustAnnotations::Admission,
        _ => TrustAnnotations::Believed,
    };
    let src = record(sel);
    let p = match gpufence::plan::plan_with(&spec, "ctr-1", &inv, &cfg, &specs(sel), &src) {
        Ok(p) => p,
        Err(e) => return one_line(e.to_string()),
    };
    plan_check::check(&p, &inv);
    if inputs.all_devices_allowed {
        return;
    }
    // No GPU node of the spec is left outside the fence.
    for n in &inputs.devices {
        let Some(NodeOf::Gpu(g)) = spec_devices::node_of(&inv, (n.kind, n.major, n.minor)) else {
            continue;
        };
        let a = p
            .allocation
            .as_ref()
            .unwrap_or_else(|| panic!("{} with no allocation", n.path));
        let d = a
            .devices
            .iter()
            .find(|d| match d.device {
                DeviceRef::Gpu { index } => index == g,
                DeviceRef::Mig { gpu, .. } => gpu == g,
            })
            .unwrap_or_else(|| panic!("{} not allocated: {a:?}", n.path));
        assert!(p.quota.is_some(), "{} without a quota", n.path);
        if cfg.allocation.trust_annotations == TrustAnnotations::Kubelet {
            assert!(
                matches!(
                    d.backing,
                    Backing::DevicePlugin { .. } | Backing::DraClaim { .. }
                ),
                "{} backed by {:?}",
                n.path,
                d.backing
            );
        }
    }
});
