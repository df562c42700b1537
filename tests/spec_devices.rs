//! Grants that arrive as devices (issue 28): GPU device nodes the engine put into the spec are a
//! grant like any other. On a CRI container each must be backed by kubelet's record — a device
//! plugin's DeviceSpecs (host path), its CDI devices and the pod's DRA claims' CDI ids resolved
//! through their specs — and then becomes the allocation (nodes, cgroup rules, shim, quota:
//! the whole device, narrowed by gpufence's annotations, held to a shared DRA device's share);
//! an unbacked one is refused. Outside CRI, `allocation.non-cri-devices`. A proptest: no GPU
//! node of the spec is ever left without the fence.

mod alloc_support;
mod prop_support;

use alloc_support::*;
use gpufence::allocation::backing::Backing;
use gpufence::allocation::{AllocationError, DeviceRef};
use gpufence::cdi::LoadedSpec;
use gpufence::config::{Config, NonCriDevices, TrustAnnotations, TrustEnv};
use gpufence::kubelet::{
    CONTAINERD_CONTAINER_NAME, CONTAINERD_POD_UID, ContainerRecord, DraClaimRecord, KubeletSource,
    PodIdentity, ResourceGrant,
};
use gpufence::plan::Plan;
use proptest::prelude::*;

const POD: &str = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
/// NVIDIA's DRA driver's per-claim CDI id for gpu-1.
const DRA_ID: &str = "k8s.gpu.nvidia.com/claim=c0ffee-gpu-1";
/// NVIDIA's device plugin's `cdi-cri` id.
fn plugin_id(i: u32) -> String {
    format!("k8s.device-plugin.nvidia.com/gpu={}", uuid(i))
}

/// A CRI container `main` of pod POD with these device nodes (path, major, minor) and
/// annotations.
fn cri(devices: &[(&str, u32, u32)], ann: &[(&str, &str)]) -> serde_json::Value {
    let mut a: Vec<(&str, &str)> = vec![
        (CONTAINERD_POD_UID, POD),
        (CONTAINERD_CONTAINER_NAME, "main"),
        ("io.kubernetes.cri.sandbox-namespace", "team"),
        ("io.kubernetes.cri.sandbox-name", "train"),
    ];
    a.extend_from_slice(ann);
    with_devices(spec(&a, &["PATH=/bin"]), devices)
}

fn with_devices(mut s: serde_json::Value, devices: &[(&str, u32, u32)]) -> serde_json::Value {
    let list: Vec<serde_json::Value> = devices
        .iter()
        .map(|(p, ma, mi)| serde_json::json!({"path": p, "type": "c", "major": ma, "minor": mi}))
        .collect();
    s["linux"] = serde_json::json!({"devices": list,
        "resources": {"devices": [{"allow": false, "access": "rwm"}]}});
    s
}

/// The node of GPU `i` and nvidiactl, as containerd puts a CDI device's nodes into the spec.
fn gpu_nodes(i: u32) -> Vec<(String, u32, u32)> {
    vec![
        (format!("/dev/nvidia{i}"), 195, i),
        ("/dev/nvidiactl".to_string(), 195, 255),
    ]
}

fn nodes_ref(v: &[(String, u32, u32)]) -> Vec<(&str, u32, u32)> {
    v.iter().map(|(p, a, b)| (p.as_str(), *a, *b)).collect()
}

fn grant(resource: &str) -> ResourceGrant {
    ResourceGrant {
        resource: resource.into(),
        device_ids: vec![],
        envs: Default::default(),
        annotations: Default::default(),
        mounts: vec![],
        devices: vec![],
        cdi_devices: vec![],
    }
}

fn record(resources: Vec<ResourceGrant>, claims: Vec<DraClaimRecord>) -> KubeletSource {
    KubeletSource::Record(ContainerRecord {
        identity: PodIdentity {
            pod_uid: POD.into(),
            container_name: "main".into(),
            pod: Some("team/train".into()),
        },
        checkpoint: "/cp".into(),
        resources,
        dra_claims: claims,
        dra_unavailable: None,
        replicas: vec![],
    })
}

fn claim(ids: &[&str], shared: bool) -> DraClaimRecord {
    DraClaimRecord {
        claim: "team/train-gpu".into(),
        cdi_device_ids: ids.iter().map(|s| s.to_string()).collect(),
        shared_cdi_ids: if shared {
            ids.iter().map(|s| s.to_string()).collect()
        } else {
            vec![]
        },
    }
}

/// A driver's CDI spec: `kind`, device `name` with GPU `gpu`'s node, device annotations and env,
/// and nvidiactl in the common edits.
fn cdi_spec(kind: &str, name: &str, gpu: u32, ann: &str, env: &str) -> LoadedSpec {
    let yaml = format!(
        "cdiVersion: \"0.6.0\"\nkind: {kind}\ndevices:\n- name: \"{name}\"\n{ann}  containerEdits:\n    env: [{env}]\n    deviceNodes:\n    - {{path: /dev/nvidia{gpu}, type: c, major: 195, minor: {gpu}}}\ncontainerEdits:\n  deviceNodes:\n  - {{path: /dev/nvidiactl, type: c, major: 195, minor: 255}}\n"
    );
    foreign_spec("/var/run/cdi/driver.yaml", 1, &yaml)
}

fn dra_spec(ann: &str, env: &str) -> Vec<LoadedSpec> {
    vec![cdi_spec(
        "k8s.gpu.nvidia.com/claim",
        "c0ffee-gpu-1",
        1,
        ann,
        env,
    )]
}

fn plan(
    s: &serde_json::Value,
    src: &KubeletSource,
    specs: &[LoadedSpec],
    c: &Config,
) -> Result<Plan, AllocationError> {
    gpufence::plan::plan_with(s, "ctr-1", &inventory(), c, specs, src)
}

fn granted(p: &Plan) -> Vec<(DeviceRef, Option<u64>, Option<u8>, Backing)> {
    p.allocation
        .iter()
        .flat_map(|a| &a.devices)
        .map(|d| (d.device, d.memory_limit, d.cores, d.backing.clone()))
        .collect()
}

const GPU1: DeviceRef = DeviceRef::Gpu { index: 1 };

#[test]
fn a_dra_claim_narrowed_to_4gib() {
    let s = cri(&nodes_ref(&gpu_nodes(1)), &[("gpufence.dev/memory", "4Gi")]);
    let src = record(vec![], vec![claim(&[DRA_ID], false)]);
    let p = plan(&s, &src, &dra_spec("", ""), &config()).unwrap();
    check_plan(&p, &inventory());
    let g = granted(&p);
    assert_eq!(g.len(), 1);
    assert_eq!((g[0].0, g[0].1), (GPU1, Some(4 * GIB)));
    assert_eq!(
        g[0].3.to_string(),
        "kubelet DRA claim team/train-gpu (device /dev/nvidia1)"
    );
    assert!(p.quota.is_some() && p.state_dir.is_some());
    assert!(
        p.cgroup_rules
            .iter()
            .any(|r| (r.major, r.minor) == (195, 1))
    );
    // Without the annotation: the whole GPU, still fenced.
    let s = cri(&nodes_ref(&gpu_nodes(1)), &[]);
    let p = plan(&s, &src, &dra_spec("", ""), &config()).unwrap();
    assert_eq!(granted(&p)[0].1, None);
    assert!(p.quota.is_some());
}

#[test]
fn the_plugins_cdi_strategy_and_device_specs_back_their_gpus() {
    let mut g = grant("nvidia.com/gpu");
    g.cdi_devices = vec![plugin_id(1)];
    g.device_ids = vec![uuid(1)];
    let specs = vec![cdi_spec(
        "k8s.device-plugin.nvidia.com/gpu",
        &uuid(1),
        1,
        "",
        "",
    )];
    let s = cri(&nodes_ref(&gpu_nodes(1)), &[("gpufence.dev/cores", "30")]);
    let p = plan(&s, &record(vec![g], vec![]), &specs, &config()).unwrap();
    let got = granted(&p);
    assert_eq!((got[0].0, got[0].2), (GPU1, Some(30)));
    assert!(
        matches!(&got[0].3, Backing::DevicePlugin { resource, .. } if resource == "nvidia.com/gpu")
    );

    // DeviceSpecs: the plugin hands /dev/nvidia0 (host path) as a CRI device, no env.
    let mut g = grant("example.com/gpu");
    g.devices = vec![
        (
            "/dev/nvidia0".into(),
            "/sim/dev/nvidia0".into(),
            "rw".into(),
        ),
        (
            "/dev/nvidiactl".into(),
            "/sim/dev/nvidiactl".into(),
            "rw".into(),
        ),
    ];
    g.device_ids = vec!["dev-0".into()];
    let s = cri(&nodes_ref(&gpu_nodes(0)), &[]);
    let p = plan(&s, &record(vec![g], vec![]), &[], &config()).unwrap();
    check_plan(&p, &inventory());
    assert_eq!(granted(&p)[0].0, DeviceRef::Gpu { index: 0 });
    assert!(p.quota.is_some());
}

#[test]
fn an_unbacked_gpu_node_is_refused_naming_the_device_and_the_record() {
    // Nothing recorded; another pod's claim (not in this pod's record); another GPU recorded.
    let mut other = grant("nvidia.com/gpu");
    other.envs.insert("NVIDIA_VISIBLE_DEVICES".into(), uuid(0));
    for src in [
        record(vec![], vec![]),
        record(vec![other], vec![]),
        KubeletSource::Absent,
    ] {
        let s = cri(&nodes_ref(&gpu_nodes(1)), &[]);
        let mut c = config();
        c.allocation.trust_env = TrustEnv::All(false);
        let e = plan(&s, &src, &dra_spec("", ""), &c).unwrap_err();
        let line = e.to_string();
        assert!(
            line.starts_with("linux.devices=\"/dev/nvidia1,/dev/nvidiactl\": GPU 1"),
            "{line}"
        );
        assert!(
            line.contains("kubelet recorded:") || line.contains("needs kubelet's record"),
            "{line}"
        );
    }
    // A claim whose CDI id no spec defines (the driver's spec not in cdi.spec-dirs, or skipped
    // as writable by others) backs nothing it could resolve, and the line says so; so does a
    // device plugin's CDI device.
    let s = cri(&nodes_ref(&gpu_nodes(1)), &[]);
    let e = plan(
        &s,
        &record(vec![], vec![claim(&[DRA_ID], false)]),
        &[],
        &config(),
    )
    .unwrap_err();
    assert!(
        e.to_string().ends_with(
            "kubelet recorded: DRA claim team/train-gpu [k8s.gpu.nvidia.com/claim=c0ffee-gpu-1: \
             in no CDI spec read from cdi.spec-dirs]"
        ),
        "{e}"
    );
    let mut g = grant("nvidia.com/gpu");
    g.cdi_devices = vec![plugin_id(1), "gpufence.dev/gpu=0".into()];
    let e = plan(&s, &record(vec![g], vec![]), &[], &config()).unwrap_err();
    assert!(
        e.to_string().ends_with(&format!(
            "kubelet recorded: nvidia.com/gpu [] = GPU 0 ({}) ({}: in no CDI spec read from \
             cdi.spec-dirs)",
            uuid(0),
            plugin_id(1)
        )),
        "{e}"
    );
    // A control node alone, unbacked.
    let s = cri(&[("/dev/nvidiactl", 195, 255)], &[]);
    let e = plan(&s, &record(vec![], vec![]), &[], &config()).unwrap_err();
    assert!(
        e.to_string().contains("device /dev/nvidiactl (c 195:255)"),
        "{e}"
    );
    // "admission" believes the engine's devices as it believes annotations.
    let mut c = config();
    c.allocation.trust_annotations = TrustAnnotations::Admission;
    let p = plan(&s, &record(vec![], vec![]), &[], &c).unwrap();
    assert!(p.allocation.is_none());
    let s = cri(&nodes_ref(&gpu_nodes(1)), &[]);
    let p = plan(&s, &record(vec![], vec![]), &[], &c).unwrap();
    assert_eq!(granted(&p)[0].3, Backing::Admission);
}

#[test]
fn annotations_choose_among_the_devices_never_leave_one_unfenced() {
    let src = record(vec![], vec![claim(&[DRA_ID], false)]);
    // The spec holds GPU 1; an annotation naming GPU 0 disagrees: refused, not merged.
    let s = cri(&nodes_ref(&gpu_nodes(1)), &[("gpufence.dev/devices", "0")]);
    let e = plan(&s, &src, &dra_spec("", ""), &config()).unwrap_err();
    assert!(e.to_string().contains("devices differ"), "{e}");
    let s = cri(&nodes_ref(&gpu_nodes(1)), &[("gpufence.dev/devices", "1")]);
    assert_eq!(
        granted(&plan(&s, &src, &dra_spec("", ""), &config()).unwrap())[0].0,
        GPU1
    );
}

#[test]
fn a_shared_dra_device_is_held_to_its_share() {
    let src = record(vec![], vec![claim(&[DRA_ID], true)]);
    let contract = "  annotations: {gpufence.dev/memory: 8Gi}\n";
    let s = cri(&nodes_ref(&gpu_nodes(1)), &[]);
    let p = plan(&s, &src, &dra_spec(contract, ""), &config()).unwrap();
    let g = granted(&p);
    assert_eq!(g[0].1, Some(8 * GIB));
    assert_eq!(
        g[0].3.to_string(),
        "kubelet DRA claim team/train-gpu (device /dev/nvidia1, share 8 GiB)"
    );
    // An annotation may lower it, never raise it.
    let s = cri(&nodes_ref(&gpu_nodes(1)), &[("gpufence.dev/memory", "4Gi")]);
    assert_eq!(
        granted(&plan(&s, &src, &dra_spec(contract, ""), &config()).unwrap())[0].1,
        Some(4 * GIB)
    );
    let s = cri(
        &nodes_ref(&gpu_nodes(1)),
        &[("gpufence.dev/memory", "16Gi")],
    );
    let e = plan(&s, &src, &dra_spec(contract, ""), &config()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "gpufence.dev/memory=\"16Gi\": 16 GiB is more than the share of GPU 1 ({}) that DRA \
             claim team/train-gpu holds (8 GiB); an annotation may lower the share, never raise it",
            uuid(1)
        )
    );
    // HAMi's DRA driver's env.
    let s = cri(&nodes_ref(&gpu_nodes(1)), &[]);
    let hami = "\"CUDA_DEVICE_MEMORY_LIMIT_0=2048m\", \"CUDA_DEVICE_SM_LIMIT=25\"";
    let g = granted(&plan(&s, &src, &dra_spec("", hami), &config()).unwrap());
    assert_eq!((g[0].1, g[0].2), (Some(2 * GIB), Some(25)));
    // A share nobody wrote: refused (fail closed).
    let e = plan(&s, &src, &dra_spec("", ""), &config()).unwrap_err();
    assert!(e.to_string().contains("whose share cannot be read"), "{e}");
}

#[test]
fn outside_cri_the_device_is_fenced_whole_or_refused() {
    let s = with_devices(spec(&[], &[]), &nodes_ref(&gpu_nodes(1)));
    let p = plan(&s, &KubeletSource::Absent, &[], &config()).unwrap();
    check_plan(&p, &inventory());
    let g = granted(&p);
    assert_eq!(
        (g[0].0, g[0].1, g[0].3.clone()),
        (GPU1, None, Backing::Trusted)
    );
    assert!(p.quota.is_some());
    assert!(
        p.notes.iter().any(|n| n.contains("non-cri-devices")),
        "{:?}",
        p.notes
    );
    let mut c = config();
    c.allocation.non_cri_devices = NonCriDevices::Refuse;
    let e = plan(&s, &KubeletSource::Absent, &[], &c).unwrap_err();
    assert!(
        e.to_string()
            .contains("allocation.non-cri-devices = \"refuse\""),
        "{e}"
    );
}

#[test]
fn mig_devices_arrive_as_their_capability_nodes() {
    // GPU 2 has MIG enabled; MIG 2:1's caps are 237:110 and 237:111.
    let nodes = [
        ("/dev/nvidia2", 195, 2),
        ("/dev/nvidia-caps/nvidia-cap110", 237, 110),
        ("/dev/nvidia-caps/nvidia-cap111", 237, 111),
    ];
    let s = with_devices(spec(&[], &[]), &nodes);
    let p = plan(&s, &KubeletSource::Absent, &[], &config()).unwrap();
    assert_eq!(granted(&p)[0].0, DeviceRef::Mig { gpu: 2, mig: 1 });
    // One cap of two: no whole MIG device; on a CRI container an unbacked cap is refused.
    let s = cri(&[("/dev/nvidia-caps/nvidia-cap110", 237, 110)], &[]);
    assert!(plan(&s, &record(vec![], vec![]), &[], &config()).is_err());
}

#[test]
fn a_privileged_container_is_no_grant() {
    let mut s = cri(&nodes_ref(&gpu_nodes(1)), &[]);
    s["linux"]["resources"]["devices"] = serde_json::json!([{"allow": true, "access": "rwm"}]);
    let p = plan(&s, &record(vec![], vec![]), &[], &config()).unwrap();
    assert!(p.allocation.is_none());
    assert!(
        p.notes.iter().any(|n| n.contains("privileged")),
        "{:?}",
        p.notes
    );
    // A later deny-all closes it again: the device is a grant, and unbacked.
    s["linux"]["resources"]["devices"] =
        serde_json::json!([{"allow": true, "access": "rwm"}, {"allow": false, "access": "rwm"}]);
    assert!(plan(&s, &record(vec![], vec![]), &[], &config()).is_err());
}

#[test]
fn malformed_devices_are_refused() {
    for bad in [
        serde_json::json!({"path": "/dev/x", "type": "c"}),
        serde_json::json!({"path": "/dev/x", "type": "z", "major": 1, "minor": 1}),
        serde_json::json!({"type": "c", "major": 1, "minor": 1}),
        serde_json::json!({"path": "/dev/x", "type": "c", "major": -1, "minor": 1}),
    ] {
        let mut s = spec(&[], &[]);
        s["linux"] = serde_json::json!({"devices": [bad]});
        let e = plan(&s, &KubeletSource::Absent, &[], &config()).unwrap_err();
        assert_eq!(e.key, "linux.devices[0]");
    }
}

/// Every inventory node (GPU, MIG capability, control) with its device.
fn all_nodes() -> Vec<(String, u32, u32)> {
    let inv = inventory();
    let mut out: Vec<(String, u32, u32)> = Vec::new();
    for g in &inv.gpus {
        out.push((g.node.path.clone(), g.node.major, g.node.minor));
        for m in &g.mig_devices {
            out.extend(m.caps.iter().map(|c| (c.path.clone(), c.major, c.minor)));
        }
    }
    out.extend(
        inv.control_nodes
            .iter()
            .map(|n| (n.path.clone(), n.major, n.minor)),
    );
    out.push(("/dev/null".into(), 1, 3));
    out
}

proptest! {
    #![proptest_config(prop_support::cases(256))]

    /// Whatever the spec's devices and whatever kubelet recorded (DeviceSpecs, DRA claims, a
    /// shared device with or without its share), a CRI container is either refused, or every GPU
    /// node of its spec is a device of the allocation, backed by the record, under the shim's
    /// quota, and the plan grants nothing else.
    #[test]
    fn no_spec_gpu_node_is_left_unfenced(
        in_spec in proptest::collection::vec(any::<bool>(), 13),
        specs_rec in proptest::collection::vec(any::<bool>(), 13),
        claim_gpu in proptest::option::of(0u32..4),
        shared in any::<bool>(),
        share_written in any::<bool>(),
        mode in 0u8..3,
    ) {
        let nodes = all_nodes();
        let devices: Vec<(&str, u32, u32)> = nodes.iter().zip(&in_spec)
            .filter(|(_, b)| **b).map(|((p, a, m), _)| (p.as_str(), *a, *m)).collect();
        let mut g = grant("example.com/gpu");
        g.devices = nodes.iter().zip(&specs_rec).filter(|(_, b)| **b)
            .map(|((p, ..), _)| (p.clone(), format!("/sim{p}"), "rw".to_string())).collect();
        let mut claims = vec![];
        let mut specs = vec![];
        if let Some(i) = claim_gpu {
            claims.push(claim(&[DRA_ID], shared));
            let ann = if share_written { "  annotations: {gpufence.dev/memory: 8Gi}\n" } else { "" };
            specs.push(cdi_spec("k8s.gpu.nvidia.com/claim", "c0ffee-gpu-1", i, ann, ""));
        }
        let src = record(vec![g], claims);
        let mut c = config();
        c.allocation.trust_env = TrustEnv::All(false);
        c.allocation.trust_annotations = [TrustAnnotations::Kubelet, TrustAnnotations::Admission, TrustAnnotations::Believed][mode as usize];
        let s = cri(&devices, &[]);
        let inv = inventory();
        let Ok(p) = gpufence::plan::plan_with(&s, "ctr-1", &inv, &c, &specs, &src) else {
            return Ok(());
        };
        check_plan(&p, &inv);
        let alloc = p.allocation.clone();
        for (path, major, minor) in &devices {
            let gpu = inv.gpus.iter().find(|g| (g.node.major, g.node.minor) == (*major, *minor));
            let Some(gpu) = gpu else { continue };
            let a = alloc.as_ref().unwrap_or_else(|| panic!("{path} with no allocation"));
            let d = a.devices.iter().find(|d| match d.device {
                DeviceRef::Gpu { index } => index == gpu.index,
                DeviceRef::Mig { gpu: g, .. } => g == gpu.index,
            }).unwrap_or_else(|| panic!("{path} not allocated"));
            prop_assert!(p.quota.is_some(), "{} without a quota", path);
            if c.allocation.trust_annotations == TrustAnnotations::Kubelet {
                prop_assert!(matches!(d.backing, Backing::DevicePlugin { .. } | Backing::DraClaim { .. }),
                    "{} backed by {:?}", path, d.backing);
            }
            if shared && matches!(d.backing, Backing::DraClaim { .. }) {
                prop_assert!(share_written, "shared device without a share granted");
                prop_assert!(d.memory_limit.is_some_and(|m| m <= 8 * GIB));
            }
        }
    }
}
