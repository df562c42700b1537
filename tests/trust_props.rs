//! Property tests of `allocation.trust-annotations = "kubelet"` (bounded; `GPUFENCE_FUZZ_CASES`
//! raises the number of cases), through kubelet's checkpoint as kubelet writes it:
//! * whatever kubelet recorded for this container (any channel of the Allocate response, device
//!   ids with replicas) and for the others, and whatever annotations, mounts and env the pod
//!   carries in any dialect (Volcano's, Koordinator's and HAMi's MIG reservations too), every GPU granted is one kubelet recorded for this very container,
//!   backed by its device plugin;
//! * narrowing what was recorded (a subset, in any order, with lower memory and cores) is always
//!   allowed and granted exactly.

mod alloc_support;
mod prop_support;

use alloc_support::*;
use gpufence::allocation::DeviceRef;
use gpufence::allocation::backing::Backing;
use gpufence::config::TrustEnv;
use gpufence::kubelet::{self, PodIdentity, proto};
use prop_support::cases;
use proptest::prelude::*;

const POD: &str = "u";

/// One way a device plugin's record names GPU `g` (channels 0 and 7 are env).
fn alloc_resp(g: u32, channel: u8, k: u8) -> (Vec<String>, Vec<u8>) {
    use prost::Message as _;
    let u = uuid(g);
    let mut r = proto::ContainerAllocateResponse::default();
    let mut ids = vec![format!("dev-{g}")];
    match channel {
        0 => {
            r.envs.insert("NVIDIA_VISIBLE_DEVICES".into(), u);
        }
        1 => ids = vec![format!("{u}::{k}")],
        2 => ids = vec![format!("{g}::{k}")],
        3 => r.devices.push(proto::DeviceSpec {
            container_path: format!("/dev/nvidia{g}"),
            host_path: format!("/dev/nvidia{g}"),
            permissions: "rw".into(),
        }),
        4 => r.mounts.push(proto::Mount {
            container_path: format!("/var/run/nvidia-container-devices/{u}"),
            host_path: "/dev/null".into(),
            read_only: true,
        }),
        5 => r.cdi_devices.push(proto::CdiDevice {
            name: format!("nvidia.com/gpu={g}"),
        }),
        6 => {
            r.annotations
                .insert("cdi.k8s.io/plugin".into(), format!("gpufence.dev/gpu={u}"));
        }
        _ => {
            r.envs
                .insert("ALIYUN_COM_GPU_MEM_IDX".into(), g.to_string());
        }
    }
    (ids, r.encode_to_vec())
}

/// GPUs 0, 1, 3 (GPU 2 is in MIG mode), by a channel.
fn recorded() -> impl Strategy<Value = Vec<(u32, u8, u8)>> {
    prop::collection::vec(
        (prop::sample::select(vec![0u32, 1, 2, 3]), 0u8..8, 0u8..4),
        0..3,
    )
}

fn checkpoint(main: &[(u32, u8, u8)], others: &[(u32, u8, u8)]) -> String {
    let mut entries = Vec::new();
    for (i, (g, ch, k)) in main.iter().enumerate() {
        let (ids, resp) = alloc_resp(*g, *ch, *k);
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        entries.push(kubelet::entry(
            POD,
            "main",
            &format!("nvidia.com/gpu-{i}"),
            &ids,
            resp,
        ));
    }
    for (i, (g, ch, k)) in others.iter().enumerate() {
        let (ids, resp) = alloc_resp(*g, *ch, *k);
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let (pod, ctr) = if i % 2 == 0 {
            (POD, "sidecar")
        } else {
            ("other-pod", "main")
        };
        entries.push(kubelet::entry(pod, ctr, "nvidia.com/gpu", &ids, resp));
    }
    kubelet::checkpoint_json(entries)
}

/// A device token naming GPU `g` some way, or `all`, or a MIG device.
fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u32..4).prop_map(|g| g.to_string()),
        (0u32..4).prop_map(uuid),
        Just("all".to_string()),
        (0u32..2).prop_map(|m| format!("2:{m}")),
    ]
}

/// One forged input: (annotation key, value) or a mount or env entry (key prefixed).
fn forged() -> impl Strategy<Value = (String, String)> {
    prop_oneof![
        token().prop_map(|t| ("gpufence.dev/devices".to_string(), t)),
        token().prop_map(|t| ("cdi.k8s.io/x".to_string(), format!("gpufence.dev/gpu={t}"))),
        (0u32..4).prop_map(|g| (
            "hami.io/vgpu-devices-allocated".to_string(),
            format!("{},NVIDIA,1000,10:;", uuid(g))
        )),
        (0u32..4).prop_map(|g| ("ALIYUN_COM_GPU_MEM_IDX".to_string(), g.to_string())),
        (0u32..4).prop_map(|g| (
            "nvidia.com/container.main.gpus.devices".to_string(),
            uuid(g)
        )),
        (0u32..4).prop_map(|g| (
            "volcano.sh/vgpu-ids-new".to_string(),
            format!("{},NVIDIA,1000,10:;", uuid(g))
        )),
        // Koordinator names GPUs by device minor (the test inventory's minor is its index).
        (0u32..4).prop_map(|g| (
            "scheduling.koordinator.sh/device-allocated".to_string(),
            format!(r#"{{"gpu":[{{"minor":{g},"resources":{{"koordinator.sh/gpu-core":50}}}}]}}"#)
        )),
        (0u32..2).prop_map(|m| (
            "hami.io/vgpu-mig-allocations".to_string(),
            format!(
                r#"[{{"containerIndex":0,"deviceIndex":0,"gpuUUID":"{}","profile":"1g.10gb","placement":{{"start":{m},"size":1}},"migUUID":"{}","gpuInstanceID":{},"computeInstanceID":0}}]"#,
                uuid(2),
                mig_uuid(2, m),
                m + 1
            )
        )),
        (0u32..4).prop_map(|g| ("mount:".to_string(), uuid(g))),
        token().prop_map(|t| ("env:NVIDIA_VISIBLE_DEVICES".to_string(), t)),
        Just(("gpufence.dev/memory".to_string(), "4Gi".to_string())),
    ]
}

fn container(inputs: &[(String, String)]) -> serde_json::Value {
    let mut ann: Vec<(&str, &str)> = vec![
        ("io.kubernetes.cri.sandbox-uid", POD),
        ("io.kubernetes.cri.container-name", "main"),
    ];
    let mut env: Vec<String> = Vec::new();
    let mut mounts: Vec<serde_json::Value> = Vec::new();
    let mut gpushare = false;
    for (k, v) in inputs {
        if let Some(e) = k.strip_prefix("env:") {
            env.push(format!("{e}={v}"));
        } else if k == "mount:" {
            mounts.push(serde_json::json!({"destination":
                format!("/var/run/nvidia-container-devices/{v}"), "source": "/dev/null"}));
        } else {
            gpushare |= k == "ALIYUN_COM_GPU_MEM_IDX";
            ann.push((k, v));
        }
    }
    if gpushare {
        ann.push(("ALIYUN_COM_GPU_MEM_POD", "4"));
    }
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    let mut s = spec(&ann, &env);
    s["mounts"].as_array_mut().unwrap().extend(mounts);
    s
}

fn id() -> PodIdentity {
    PodIdentity {
        pod_uid: POD.into(),
        container_name: "main".into(),
        pod: None,
    }
}

fn gpu_of(d: DeviceRef) -> u32 {
    match d {
        DeviceRef::Gpu { index } => index,
        DeviceRef::Mig { gpu, .. } => gpu,
    }
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn no_annotation_in_any_dialect_adds_a_gpu_kubelet_did_not_record(
        main in recorded(),
        others in recorded(),
        inputs in prop::collection::vec(forged(), 0..4),
        trust_env_kubelet in any::<bool>(),
    ) {
        let cp = checkpoint(&main, &others);
        let source = kubelet::from_checkpoint_bytes(cp.as_bytes(), &id(), "/cp");
        let mut cfg = config();
        if !trust_env_kubelet {
            cfg.allocation.trust_env = TrustEnv::All(false);
        }
        let s = container(&inputs);
        let inv = inventory();
        if let Ok(p) = gpufence::plan::plan_with(&s, "ctr-1", &inv, &cfg, &[], &source) {
            check_plan(&p, &inv);
            for d in p.allocation.iter().flat_map(|a| &a.devices) {
                let g = gpu_of(d.device);
                prop_assert!(
                    main.iter().any(|(r, _, _)| *r == g),
                    "GPU {} granted, kubelet recorded {:?} for main ({:?})", g, main, inputs
                );
                let by_plugin = matches!(d.backing, Backing::DevicePlugin { .. });
                prop_assert!(by_plugin, "{:?}", d.backing);
            }
        }
    }

    #[test]
    fn narrowing_what_kubelet_recorded_is_always_allowed(
        main in prop::collection::vec(
            (prop::sample::select(vec![0u32, 1, 3]), 1u8..7, 0u8..4), 1..4),
        pick in prop::collection::vec(any::<prop::sample::Index>(), 1..4),
        gib in prop::collection::vec(1u64..=80, 4),
        cores in 1u8..=100,
    ) {
        let cp = checkpoint(&main, &[]);
        let source = kubelet::from_checkpoint_bytes(cp.as_bytes(), &id(), "/cp");
        let mut chosen: Vec<u32> = pick.iter().map(|i| main[i.index(main.len())].0).collect();
        let mut seen = Vec::new();
        chosen.retain(|g| if seen.contains(g) { false } else { seen.push(*g); true });
        let devices: Vec<String> = chosen.iter().map(u32::to_string).collect();
        let memory: Vec<String> = chosen
            .iter()
            .enumerate()
            .map(|(i, _)| format!("{}Gi", gib[i]))
            .collect();
        let inputs = vec![
            ("gpufence.dev/devices".to_string(), devices.join(",")),
            ("gpufence.dev/memory".to_string(), memory.join(",")),
            ("gpufence.dev/cores".to_string(), cores.to_string()),
        ];
        // Replica shares are off here: their own properties (tests/replicas.rs) cover lowering
        // within a share; a GPU recorded as replicas under two resources is refused there.
        let mut cfg = config();
        cfg.sharing.replicas = gpufence::config::ReplicasPolicy::Off;
        let p = gpufence::plan::plan_with(&container(&inputs), "ctr-1", &inventory(), &cfg, &[], &source);
        let p = p.map_err(|e| TestCaseError::fail(format!("{e} (recorded {main:?})")))?;
        let a = p.allocation.unwrap();
        let got: Vec<(u32, Option<u64>, Option<u8>)> =
            a.devices.iter().map(|d| (gpu_of(d.device), d.memory_limit, d.cores)).collect();
        let want: Vec<(u32, Option<u64>, Option<u8>)> = chosen
            .iter()
            .enumerate()
            .map(|(i, g)| (*g, Some(gib[i] * GIB), Some(cores)))
            .collect();
        prop_assert_eq!(got, want);
        let by_plugin = |d: &gpufence::allocation::AllocatedDevice| {
            matches!(d.backing, Backing::DevicePlugin { .. })
        };
        prop_assert!(a.devices.iter().all(by_plugin), "{:?}", a.devices);
    }
}
