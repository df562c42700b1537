//! `allocation.trust-env = "kubelet"`: env-borne allocations (HAMi, gpushare, the NVIDIA device
//! plugin) believed exactly as far as kubelet's device-manager checkpoint records them. The
//! checkpoints are built in the real format (JSON with kubelet's go-spew FNV-32a checksum,
//! `AllocResp` a protobuf `ContainerAllocateResponse` encoded with prost) and go through the same
//! parser as the file on a node.

mod alloc_support;

use alloc_support::*;
use gpufence::allocation::{AllocationError, DeviceRef, Origin};
use gpufence::config::Config;
use gpufence::kubelet::{
    self, CONTAINERD_CONTAINER_NAME, CONTAINERD_POD_UID, CRIO_CONTAINER_NAME, CRIO_POD_UID,
    KubeletSource, checkpoint::Entry,
};
use gpufence::plan::{Plan, plan_with};

const POD: &str = "6f1c2a3b-0d4e-4f5a-9b8c-7d6e5f4a3b2c";
const OTHER_POD: &str = "0a0a0a0a-1111-2222-3333-444444444444";
const MIB: u64 = 1 << 20;

/// The env HAMi's device plugin returns for one GPU with 3000 MiB and 30 % of the SMs.
fn hami_env(gpu: u32, mib: u32, cores: u32) -> Vec<(String, String)> {
    vec![
        ("NVIDIA_VISIBLE_DEVICES".into(), uuid(gpu)),
        ("CUDA_DEVICE_MEMORY_LIMIT_0".into(), format!("{mib}m")),
        ("CUDA_DEVICE_SM_LIMIT".into(), cores.to_string()),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
            "/usr/local/vgpu/1.cache".into(),
        ),
    ]
}

fn resp(env: &[(String, String)]) -> Vec<u8> {
    let e: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    kubelet::encode_alloc_resp(&e, &[])
}

fn hami_entry(pod: &str, ctr: &str, gpu: u32, mib: u32, cores: u32) -> Entry {
    kubelet::entry(
        pod,
        ctr,
        "nvidia.com/gpu",
        &[&format!("{}-1", uuid(gpu))],
        resp(&hami_env(gpu, mib, cores)),
    )
}

/// config.json of container `ctr` of pod `pod` as containerd writes it, with this env.
fn container(pod: &str, ctr: &str, env: &[String]) -> serde_json::Value {
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    spec(
        &[
            (CONTAINERD_POD_UID, pod),
            (CONTAINERD_CONTAINER_NAME, ctr),
            ("io.kubernetes.cri.container-type", "container"),
            ("io.kubernetes.cri.sandbox-namespace", "default"),
            ("io.kubernetes.cri.sandbox-name", "p"),
        ],
        &env,
    )
}

fn env_of(kv: &[(String, String)]) -> Vec<String> {
    kv.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// Plan `spec` with kubelet's record read from `checkpoint` (JSON text) the way the runtime does.
fn plan_from(
    spec: &serde_json::Value,
    checkpoint: &str,
    config: &Config,
) -> Result<Plan, AllocationError> {
    plan_with_checkpoint(spec, Some(checkpoint), config)
}

fn devices(p: &Plan) -> Vec<(DeviceRef, Option<u64>, Option<u8>)> {
    p.allocation
        .as_ref()
        .map(|a| {
            a.devices
                .iter()
                .map(|d| (d.device, d.memory_limit, d.cores))
                .collect()
        })
        .unwrap_or_default()
}

fn gpu(index: u32) -> DeviceRef {
    DeviceRef::Gpu { index }
}

fn override_of<'a>(p: &'a Plan, key: &str) -> Option<&'a str> {
    p.env_overrides
        .iter()
        .find_map(|o| o.strip_prefix(&format!("{key}=")))
}

#[test]
fn kubelet_is_the_default_trust() {
    assert!(config().allocation.trust_env.is_kubelet());
}

#[test]
fn hami_pod_admitted_from_the_checkpoint() {
    let cp = kubelet::checkpoint_json(vec![hami_entry(POD, "main", 1, 3000, 30)]);
    // containerd puts the plugin's env after the image's: the CUDA image's NVIDIA_VISIBLE_DEVICES=all
    // comes first, the recorded values last.
    let mut env = vec![
        "PATH=/usr/bin".to_string(),
        "NVIDIA_VISIBLE_DEVICES=all".into(),
    ];
    env.extend(env_of(&hami_env(1, 3000, 30)));
    let p = plan_from(&container(POD, "main", &env), &cp, &config()).unwrap();
    assert_eq!(devices(&p), vec![(gpu(1), Some(3000 * MIB), Some(30))]);
    let a = p.allocation.as_ref().unwrap();
    assert!(
        a.sources
            .iter()
            .any(|s| s.facet == "memory" && s.origin == Origin::Kubelet),
        "{:?}",
        a.sources
    );
    assert_eq!(p.kubelet.as_ref().unwrap().status, "record");
    // The quota the shim reads.
    assert_eq!(
        p.quota.as_ref().unwrap().devices[0].memory,
        Some(3000 * MIB)
    );
    assert!(
        p.edits
            .env
            .contains(&format!("NVIDIA_VISIBLE_DEVICES={}", uuid(1)))
    );
}

#[test]
fn image_env_trying_for_more_gets_exactly_the_recorded_slice() {
    let cp = kubelet::checkpoint_json(vec![hami_entry(POD, "main", 1, 3000, 30)]);
    let env = vec![
        "NVIDIA_VISIBLE_DEVICES=all".to_string(),
        "CUDA_DEVICE_MEMORY_LIMIT_0=80000m".into(),
        "CUDA_DEVICE_SM_LIMIT=100".into(),
        "CUDA_DEVICE_MEMORY_LIMIT_1=80000m".into(),
    ];
    let p = plan_from(&container(POD, "main", &env), &cp, &config()).unwrap();
    assert_eq!(devices(&p), vec![(gpu(1), Some(3000 * MIB), Some(30))]);
    assert_eq!(override_of(&p, "CUDA_DEVICE_MEMORY_LIMIT_0"), Some("3000m"));
    assert_eq!(override_of(&p, "CUDA_DEVICE_SM_LIMIT"), Some("30"));
    let keys: Vec<&str> = p.neutralised.iter().map(|n| n.key.as_str()).collect();
    for k in [
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "CUDA_DEVICE_SM_LIMIT",
        "CUDA_DEVICE_MEMORY_LIMIT_1",
    ] {
        assert!(keys.contains(&k), "{k} not neutralised: {keys:?}");
    }
}

#[test]
fn gpushare_pod_from_the_checkpoint() {
    let env: Vec<(String, String)> = [
        ("NVIDIA_VISIBLE_DEVICES", "1"),
        ("ALIYUN_COM_GPU_MEM_IDX", "1"),
        ("ALIYUN_COM_GPU_MEM_POD", "4"),
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "4"),
        ("ALIYUN_COM_GPU_MEM_DEV", "80"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let ids: Vec<String> = (0..4).map(|i| format!("{}-_-{i}", uuid(1))).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let cp = kubelet::checkpoint_json(vec![kubelet::entry(
        POD,
        "main",
        "aliyun.com/gpu-mem",
        &ids,
        resp(&env),
    )]);
    let p = plan_from(&container(POD, "main", &env_of(&env)), &cp, &config()).unwrap();
    assert_eq!(devices(&p), vec![(gpu(1), Some(4 * GIB), None)]);
    // The same env without the record: nothing.
    let none = kubelet::checkpoint_json(vec![]);
    let p = plan_from(&container(POD, "main", &env_of(&env)), &none, &config()).unwrap();
    assert!(p.grants_nothing());
    assert_eq!(override_of(&p, "NVIDIA_VISIBLE_DEVICES"), Some("void"));
}

#[test]
fn nvidia_plugin_env_from_the_checkpoint() {
    let env = vec![(
        "NVIDIA_VISIBLE_DEVICES".to_string(),
        format!("{},{}", uuid(0), uuid(1)),
    )];
    let cp = kubelet::checkpoint_json(vec![kubelet::entry(
        POD,
        "main",
        "nvidia.com/gpu",
        &[&uuid(0), &uuid(1)],
        resp(&env),
    )]);
    let p = plan_from(&container(POD, "main", &env_of(&env)), &cp, &config()).unwrap();
    assert_eq!(
        devices(&p),
        vec![(gpu(0), None, None), (gpu(1), None, None)]
    );
}

#[test]
fn multi_container_pod_each_container_gets_its_own_record() {
    let cp = kubelet::checkpoint_json(vec![
        hami_entry(POD, "main", 1, 3000, 0),
        hami_entry(POD, "worker", 0, 5000, 50),
        // Another pod's entry on GPU 3: never anyone else's.
        hami_entry(OTHER_POD, "main", 3, 70000, 0),
    ]);
    let image = vec!["NVIDIA_VISIBLE_DEVICES=all".to_string()];
    let mut main_env = image.clone();
    main_env.extend(env_of(&hami_env(1, 3000, 0)));
    let p = plan_from(&container(POD, "main", &main_env), &cp, &config()).unwrap();
    assert_eq!(devices(&p), vec![(gpu(1), Some(3000 * MIB), None)]);

    // The worker's config.json claims the main container's values: it gets its own record.
    let p = plan_from(&container(POD, "worker", &main_env), &cp, &config()).unwrap();
    assert_eq!(devices(&p), vec![(gpu(0), Some(5000 * MIB), Some(50))]);

    // The sidecar asked for no GPU; the image's NVIDIA_VISIBLE_DEVICES=all is neutralised.
    let p = plan_from(&container(POD, "sidecar", &image), &cp, &config()).unwrap();
    assert!(p.grants_nothing());
    assert_eq!(override_of(&p, "NVIDIA_VISIBLE_DEVICES"), Some("void"));
    assert_eq!(p.neutralised[0].key, "NVIDIA_VISIBLE_DEVICES");
}

#[test]
fn cuda_image_without_a_gpu_runs_without_one() {
    let cp = kubelet::checkpoint_json(vec![hami_entry(OTHER_POD, "main", 1, 3000, 0)]);
    let env = vec![
        "NVIDIA_VISIBLE_DEVICES=all".to_string(),
        "NVIDIA_DRIVER_CAPABILITIES=compute,utility".into(),
    ];
    let p = plan_from(&container(POD, "main", &env), &cp, &config()).unwrap();
    assert!(p.grants_nothing());
    assert_eq!(override_of(&p, "NVIDIA_VISIBLE_DEVICES"), Some("void"));
}

#[test]
fn crio_annotations_name_the_container_too() {
    let cp = kubelet::checkpoint_json(vec![hami_entry(POD, "main", 1, 3000, 30)]);
    let env = env_of(&hami_env(1, 3000, 30));
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    let s = spec(&[(CRIO_POD_UID, POD), (CRIO_CONTAINER_NAME, "main")], &env);
    let p = plan_from(&s, &cp, &config()).unwrap();
    assert_eq!(devices(&p), vec![(gpu(1), Some(3000 * MIB), Some(30))]);
}

#[test]
fn hostile_checkpoints_grant_nothing() {
    let good = kubelet::checkpoint_json(vec![hami_entry(POD, "main", 1, 3000, 30)]);
    let env = env_of(&hami_env(1, 3000, 30));
    let s = container(POD, "main", &env);
    let forged_uid = good.replace(POD, OTHER_POD);
    let bad = [
        // checksum no longer matches
        good.replace("main", "mainx"),
        forged_uid.clone(),
        // truncated
        good[..good.len() / 2].to_string(),
        // not base64
        good.replace("\"AllocResp\":\"", "\"AllocResp\":\"!"),
        // duplicate entries, correctly sealed
        kubelet::checkpoint_json(vec![
            hami_entry(POD, "main", 1, 3000, 30),
            hami_entry(POD, "main", 1, 3000, 30),
        ]),
        // a protobuf that is not a ContainerAllocateResponse, correctly sealed
        kubelet::checkpoint_json(vec![kubelet::entry(
            POD,
            "main",
            "nvidia.com/gpu",
            &["x"],
            vec![0x0a, 0xff, 0x01],
        )]),
        " ".repeat(5 << 20),
    ];
    for cp in &bad {
        let e = plan_from(&s, cp, &config()).unwrap_err();
        let line = e.to_string();
        assert!(
            line.contains("/cp") && line.contains("kubelet"),
            "refusal should name the checkpoint: {line}"
        );
        assert!(!line.contains('\n'));
    }
    // Another pod's entry (correctly sealed) is no record of this container: env neutralised.
    let other = kubelet::checkpoint_json(vec![hami_entry(OTHER_POD, "main", 1, 3000, 30)]);
    let p = plan_from(&s, &other, &config()).unwrap();
    assert!(p.grants_nothing());
}

#[test]
fn an_unreadable_checkpoint_refuses_env_and_unbacked_annotations() {
    let src = KubeletSource::Unavailable {
        checkpoint: "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint".into(),
        why: "does not exist".into(),
    };
    let env = ["NVIDIA_VISIBLE_DEVICES=all"];
    let s = spec(
        &[
            (CONTAINERD_POD_UID, POD),
            (CONTAINERD_CONTAINER_NAME, "main"),
        ],
        &env,
    );
    let e = plan_with(&s, "c", &inventory(), &config(), &[], &src).unwrap_err();
    assert_eq!(e.key, "NVIDIA_VISIBLE_DEVICES");
    assert!(
        e.why
            .contains("kubelet_internal_checkpoint cannot be used: does not exist")
    );
    // No env GPU signal: runs.
    let s2 = spec(
        &[
            (CONTAINERD_POD_UID, POD),
            (CONTAINERD_CONTAINER_NAME, "main"),
        ],
        &[
            "NVIDIA_VISIBLE_DEVICES=void",
            "NVIDIA_DRIVER_CAPABILITIES=all",
        ],
    );
    assert!(
        plan_with(&s2, "c", &inventory(), &config(), &[], &src)
            .unwrap()
            .grants_nothing()
    );
    // A gpufence annotation needs kubelet's record too (trust-annotations = "kubelet"): refused,
    // naming the key, the value and the checkpoint.
    let s3 = spec(
        &[
            (CONTAINERD_POD_UID, POD),
            (CONTAINERD_CONTAINER_NAME, "main"),
            ("gpufence.dev/devices", "2:1"),
        ],
        &env,
    );
    let e = plan_with(&s3, "c", &inventory(), &config(), &[], &src).unwrap_err();
    assert_eq!(
        (e.key.as_str(), e.value.as_str()),
        ("gpufence.dev/devices", "2:1")
    );
    assert!(
        e.why
            .contains("kubelet_internal_checkpoint cannot be used: does not exist"),
        "{e}"
    );
    // Under the admission policy it allocates; the env is neutralised as untrusted.
    let mut admission = config();
    admission.allocation.trust_annotations = gpufence::config::TrustAnnotations::Admission;
    let p = plan_with(&s3, "c", &inventory(), &admission, &[], &src).unwrap();
    assert_eq!(
        devices(&p),
        vec![(DeviceRef::Mig { gpu: 2, mig: 1 }, None, None)]
    );
}

#[test]
fn without_kubelet_env_is_not_believed() {
    // podman: no CRI pod identity.
    let env = env_of(&hami_env(1, 3000, 30));
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    let s = spec(&[], &env);
    let p = plan_from(&s, "", &config()).unwrap();
    assert!(p.grants_nothing());
    assert_eq!(p.kubelet.as_ref().unwrap().status, "absent");
    // trust-env = false ignores even a record.
    let cp = kubelet::checkpoint_json(vec![hami_entry(POD, "main", 1, 3000, 30)]);
    let mut c = config();
    c.allocation.trust_env = gpufence::config::TrustEnv::All(false);
    let p = plan_from(
        &container(POD, "main", &env_of(&hami_env(1, 3000, 30))),
        &cp,
        &c,
    )
    .unwrap();
    assert!(p.grants_nothing());
    assert!(p.kubelet.is_none());
}
