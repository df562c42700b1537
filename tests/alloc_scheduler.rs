//! Scheduler pod annotations as dialects (HAMi `hami.io/vgpu-devices-allocated`, gpushare
//! `ALIYUN_COM_GPU_MEM_*`, KAI `nvidia.com/container.<name>.*`): each narrowed to this container,
//! agreeing facet by facet with the env dialects and kubelet's record.

mod alloc_support;

use alloc_support::*;
use gpufence::allocation::{AllocationError, DeviceRef, Origin};
use gpufence::config::{Config, TrustAnnotations};
use gpufence::kubelet::{self, CONTAINERD_CONTAINER_NAME, CONTAINERD_POD_UID};
use gpufence::plan::Plan;

const POD: &str = "6f1c2a3b-0d4e-4f5a-9b8c-7d6e5f4a3b2c";
const MIB: u64 = 1 << 20;

fn container(ctr: &str, ann: &[(&str, &str)], env: &[&str]) -> serde_json::Value {
    let mut a: Vec<(&str, &str)> =
        vec![(CONTAINERD_POD_UID, POD), (CONTAINERD_CONTAINER_NAME, ctr)];
    a.extend_from_slice(ann);
    spec(&a, env)
}

/// The default config with `allocation.trust-annotations` set: these tests read the scheduler
/// annotations as dialects, with no kubelet record behind them.
fn believing(mode: TrustAnnotations) -> Config {
    let mut c = config();
    c.allocation.trust_annotations = mode;
    c
}

fn run(
    s: &serde_json::Value,
    checkpoint: Option<&str>,
    config: &Config,
) -> Result<Plan, AllocationError> {
    plan_with_checkpoint(s, checkpoint, config)
}

fn devices(p: &Plan) -> Vec<(u32, Option<u64>, Option<u8>)> {
    gpu_limits(p)
}

fn hami_value(groups: &[&[(u32, u32, u32)]]) -> String {
    groups
        .iter()
        .map(|g| {
            g.iter()
                .map(|(gpu, mib, cores)| format!("{},NVIDIA,{mib},{cores}:", uuid(*gpu)))
                .collect::<String>()
                + ";"
        })
        .collect()
}

/// kubelet's record of HAMi's plugin giving `ctr` one GPU with `mib` and `cores`.
fn hami_record(entries: &[(&str, u32, u32, u32)]) -> String {
    plugin_record("nvidia.com/gpu", entries)
}

/// kubelet's record of a HAMi-format device plugin (HAMi's, Volcano's) registered as `resource`.
fn plugin_record(resource: &str, entries: &[(&str, u32, u32, u32)]) -> String {
    kubelet::checkpoint_json(
        entries
            .iter()
            .map(|(ctr, gpu, mib, cores)| {
                kubelet::entry(
                    POD,
                    ctr,
                    resource,
                    &[&format!("{}-0", uuid(*gpu))],
                    kubelet::encode_alloc_resp(
                        &[
                            ("NVIDIA_VISIBLE_DEVICES", &uuid(*gpu)),
                            ("CUDA_DEVICE_MEMORY_LIMIT_0", &format!("{mib}m")),
                            ("CUDA_DEVICE_SM_LIMIT", &cores.to_string()),
                        ],
                        &[],
                    ),
                )
            })
            .collect(),
    )
}

#[test]
fn hami_annotation_single_container_without_kubelet() {
    let v = hami_value(&[&[(1, 3000, 30)]]);
    // Under "kubelet" (the default), the annotation alone grants nothing: refused.
    let forged = container("main", &[("hami.io/vgpu-devices-allocated", &v)], &[]);
    let e = run(&forged, None, &config()).unwrap_err();
    assert_eq!(e.key, "hami.io/vgpu-devices-allocated", "{e}");
    assert!(e.why.contains("needs kubelet's record"), "{e}");
    let mut c = believing(TrustAnnotations::Believed);
    c.allocation.trust_env = gpufence::config::TrustEnv::All(false);
    let p = run(
        &container(
            "main",
            &[("hami.io/vgpu-devices-allocated", &v)],
            &["NVIDIA_VISIBLE_DEVICES=all"],
        ),
        None,
        &c,
    )
    .unwrap();
    assert_eq!(devices(&p), vec![(1, Some(3000 * MIB), Some(30))]);
    let src = &p.allocation.as_ref().unwrap().sources;
    assert!(
        src.iter().all(|s| s.origin == Origin::Annotation),
        "{src:?}"
    );
    // cores 0 = no limit; two GPUs.
    let v = hami_value(&[&[(0, 1000, 0), (1, 2000, 0)]]);
    let p = run(
        &container("main", &[("hami.io/vgpu-devices-allocated", &v)], &[]),
        None,
        &c,
    )
    .unwrap();
    assert_eq!(
        devices(&p),
        vec![(0, Some(1000 * MIB), None), (1, Some(2000 * MIB), None)]
    );
}

#[test]
fn hami_annotation_and_recorded_env_agree_or_refuse() {
    let v = hami_value(&[&[(1, 3000, 30)]]);
    let cp = hami_record(&[("main", 1, 3000, 30)]);
    let env = [
        "NVIDIA_VISIBLE_DEVICES=".to_string() + &uuid(1),
        "CUDA_DEVICE_MEMORY_LIMIT_0=3000m".into(),
        "CUDA_DEVICE_SM_LIMIT=30".into(),
    ];
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    let s = container("main", &[("hami.io/vgpu-devices-allocated", &v)], &env);
    let p = run(&s, Some(&cp), &config()).unwrap();
    assert_eq!(devices(&p), vec![(1, Some(3000 * MIB), Some(30))]);
    let origins: Vec<Origin> = p
        .allocation
        .as_ref()
        .unwrap()
        .sources
        .iter()
        .filter(|s| s.facet == "memory")
        .map(|s| s.origin)
        .collect();
    assert!(origins.contains(&Origin::Kubelet) && origins.contains(&Origin::Annotation));
    // The annotation says 5000 MiB, kubelet recorded 3000 MiB: refused, naming both.
    let v = hami_value(&[&[(1, 5000, 30)]]);
    let s = container("main", &[("hami.io/vgpu-devices-allocated", &v)], &env);
    let e = run(&s, Some(&cp), &config()).unwrap_err().to_string();
    assert!(
        e.contains("CUDA_DEVICE_MEMORY_LIMIT_0") && e.contains("hami.io/vgpu-devices-allocated"),
        "{e}"
    );
}

#[test]
fn hami_multi_container_pod_needs_kubelet_to_pick_the_group() {
    let v = hami_value(&[&[(1, 3000, 0)], &[], &[(0, 5000, 50)]]);
    let cp = hami_record(&[("main", 1, 3000, 0), ("worker", 0, 5000, 50)]);
    let ann = [("hami.io/vgpu-devices-allocated", v.as_str())];
    let p = run(&container("main", &ann, &[]), Some(&cp), &config()).unwrap();
    assert_eq!(devices(&p), vec![(1, Some(3000 * MIB), None)]);
    let p = run(&container("worker", &ann, &[]), Some(&cp), &config()).unwrap();
    assert_eq!(devices(&p), vec![(0, Some(5000 * MIB), Some(50))]);
    let p = run(
        &container("sidecar", &ann, &["NVIDIA_VISIBLE_DEVICES=all"]),
        Some(&cp),
        &config(),
    )
    .unwrap();
    assert!(p.grants_nothing());
    // Without kubelet's record, no container of the pod can be told apart: refused.
    let e = run(&container("sidecar", &ann, &[]), None, &config()).unwrap_err();
    assert_eq!(e.key, "hami.io/vgpu-devices-allocated");
    assert!(
        e.why.contains("3 containers") && e.why.contains("sidecar"),
        "{e}"
    );
    // A record that matches no group.
    let other = hami_record(&[("main", 2, 3000, 0)]);
    assert!(run(&container("main", &ann, &[]), Some(&other), &config()).is_err());
    // A single-group annotation is the pod's GPU container's: a container kubelet recorded no
    // GPU for (a sidecar) gets nothing from it.
    let single = hami_value(&[&[(1, 3000, 0)]]);
    let one = [("hami.io/vgpu-devices-allocated", single.as_str())];
    let cp1 = hami_record(&[("main", 1, 3000, 0)]);
    let p = run(&container("sidecar", &one, &[]), Some(&cp1), &config()).unwrap();
    assert!(p.grants_nothing());
    let p = run(&container("main", &one, &[]), Some(&cp1), &config()).unwrap();
    assert_eq!(devices(&p), vec![(1, Some(3000 * MIB), None)]);
}

#[test]
fn volcano_annotation_is_narrowed_as_hamis_is() {
    const VOLCANO: &str = "volcano.sh/vgpu-ids-new";
    let v = hami_value(&[&[(1, 3000, 0)], &[(0, 5000, 50)]]);
    let cp = plugin_record(
        "volcano.sh/vgpu-number",
        &[("main", 1, 3000, 0), ("worker", 0, 5000, 50)],
    );
    let ann = [(VOLCANO, v.as_str())];
    let p = run(&container("main", &ann, &[]), Some(&cp), &config()).unwrap();
    assert_eq!(devices(&p), vec![(1, Some(3000 * MIB), None)]);
    let a = p.allocation.as_ref().unwrap();
    assert!(
        a.dialects.contains(&gpufence::config::Dialect::Volcano),
        "{a:?}"
    );
    let p = run(&container("worker", &ann, &[]), Some(&cp), &config()).unwrap();
    assert_eq!(devices(&p), vec![(0, Some(5000 * MIB), Some(50))]);
    // A container kubelet recorded nothing for gets nothing; without the record, refused.
    let p = run(&container("sidecar", &ann, &[]), Some(&cp), &config()).unwrap();
    assert!(p.grants_nothing());
    let e = run(&container("main", &ann, &[]), None, &config()).unwrap_err();
    assert_eq!(e.key, VOLCANO, "{e}");
    // Its memory disagrees with what kubelet recorded for the device plugin's env: refused,
    // naming both.
    let more = hami_value(&[&[(1, 4000, 0)], &[(0, 5000, 50)]]);
    let e = run(
        &container("main", &[(VOLCANO, &more)], &[]),
        Some(&cp),
        &config(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains(VOLCANO), "{e}");
    // Not among what kubelet recorded (another GPU): refused under "kubelet".
    let forged = hami_value(&[&[(2, 3000, 0)]]);
    let single = plugin_record("volcano.sh/vgpu-number", &[("main", 1, 3000, 0)]);
    assert!(
        run(
            &container("main", &[(VOLCANO, &forged)], &[]),
            Some(&single),
            &config()
        )
        .is_err()
    );
    // The Volcano and HAMi annotations on one pod must agree.
    let both = [
        (VOLCANO, v.as_str()),
        ("hami.io/vgpu-devices-allocated", more.as_str()),
    ];
    let mut c = believing(TrustAnnotations::Believed);
    c.allocation.trust_env = gpufence::config::TrustEnv::All(false);
    assert!(run(&container("main", &both, &[]), Some(&cp), &c).is_err());
}

/// HAMi v2.10's reservation of container 0's device 0 on GPU 2 (MIG enabled), profile
/// `1g.10gb`, with the runtime identity of MIG device `2:<mig>` (GI `mig + 1`, CI 0) or none.
fn mig_reservation(runtime: Option<(u32, u32)>) -> String {
    let rt = runtime.map_or(String::new(), |(mig, gi)| {
        format!(
            r#","migUUID":"{}","gpuInstanceID":{gi},"computeInstanceID":0"#,
            mig_uuid(2, mig)
        )
    });
    format!(
        r#"[{{"containerIndex":0,"deviceIndex":0,"gpuUUID":"{}","profile":"1g.10gb","placement":{{"start":{},"size":1}}{rt}}}]"#,
        uuid(2),
        runtime.map_or(0, |(m, _)| m)
    )
}

#[test]
fn hami_dynamic_mig_reservation_fences_exactly_its_mig_device() {
    const MIG: &str = "hami.io/vgpu-mig-allocations";
    // HAMi's device plugin in MIG mode returns the MIG device's UUID; kubelet records it.
    let cp = kubelet::checkpoint_json(vec![kubelet::entry(
        POD,
        "main",
        "nvidia.com/gpu",
        &[&format!("{}-0", uuid(2))],
        kubelet::encode_alloc_resp(&[("NVIDIA_VISIBLE_DEVICES", &mig_uuid(2, 1))], &[]),
    )]);
    let hami = hami_value(&[&[(2, 10240, 0)]]);
    let mig_of = |p: &Plan| -> Vec<DeviceRef> {
        p.allocation
            .as_ref()
            .unwrap()
            .devices
            .iter()
            .map(|d| d.device)
            .collect()
    };
    for runtime in [Some((1, 2)), None] {
        let r = mig_reservation(runtime);
        let ann = [
            ("hami.io/vgpu-devices-allocated", hami.as_str()),
            (MIG, r.as_str()),
        ];
        let p = run(&container("main", &ann, &[]), Some(&cp), &config()).unwrap();
        assert_eq!(
            mig_of(&p),
            [DeviceRef::Mig { gpu: 2, mig: 1 }],
            "{runtime:?}"
        );
        let a = p.allocation.as_ref().unwrap();
        assert_eq!(
            (a.devices[0].memory_limit, a.devices[0].cores),
            (None, None)
        );
        // Its caps, not the other MIG device's; its UUID is what CUDA sees.
        let nodes: Vec<&str> = p
            .edits
            .device_nodes
            .iter()
            .map(|d| d.path.as_str())
            .collect();
        assert!(
            nodes.contains(&"/dev/nvidia-caps/nvidia-cap110"),
            "{nodes:?}"
        );
        assert!(
            !nodes.contains(&"/dev/nvidia-caps/nvidia-cap100"),
            "{nodes:?}"
        );
        assert!(
            p.edits
                .env
                .contains(&format!("NVIDIA_VISIBLE_DEVICES={}", mig_uuid(2, 1)))
        );
    }
    // Refused: another MIG device than kubelet recorded, a runtime identity that is not this
    // node's, a reservation of a device the HAMi annotation does not have, another GPU.
    let other = mig_reservation(Some((0, 1)));
    let wrong_gi = mig_reservation(Some((1, 5)));
    let past = mig_reservation(Some((1, 2))).replace(r#""deviceIndex":0"#, r#""deviceIndex":1"#);
    let gpu1 = mig_reservation(Some((1, 2))).replace(&uuid(2), &uuid(1));
    for (r, why) in [
        (other.as_str(), ""),
        (wrong_gi.as_str(), "GPU instance"),
        (past.as_str(), "does not have"),
        (gpu1.as_str(), "where hami.io/vgpu-devices-allocated names"),
    ] {
        let ann = [("hami.io/vgpu-devices-allocated", hami.as_str()), (MIG, r)];
        let e = run(&container("main", &ann, &[]), Some(&cp), &config()).unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }
    // Without runtime identity and without kubelet's record naming one: refused, saying so.
    let none = mig_reservation(None);
    let ann = [
        ("hami.io/vgpu-devices-allocated", hami.as_str()),
        (MIG, none.as_str()),
    ];
    let e = run(
        &container("main", &ann, &[]),
        None,
        &believing(TrustAnnotations::Admission),
    )
    .unwrap_err();
    assert_eq!(e.key, MIG, "{e}");
    assert!(e.why.contains("no runtime identity"), "{e}");
    // Under "admission" the identity alone names the device.
    let full = mig_reservation(Some((0, 1)));
    let ann = [
        ("hami.io/vgpu-devices-allocated", hami.as_str()),
        (MIG, full.as_str()),
    ];
    let p = run(
        &container("main", &ann, &[]),
        None,
        &believing(TrustAnnotations::Admission),
    )
    .unwrap();
    assert_eq!(mig_of(&p), [DeviceRef::Mig { gpu: 2, mig: 0 }]);
}

#[test]
fn gpushare_annotations() {
    let ann = [
        ("ALIYUN_COM_GPU_MEM_IDX", "1"),
        ("ALIYUN_COM_GPU_MEM_POD", "6"),
        ("ALIYUN_COM_GPU_MEM_DEV", "80"),
        ("ALIYUN_COM_GPU_MEM_ASSIGNED", "false"),
        ("ALIYUN_COM_GPU_MEM_ASSUME_TIME", "1700000000000000000"),
    ];
    // No kubelet, annotations believed: the pod's amount.
    let believed = believing(TrustAnnotations::Believed);
    let p = run(&container("main", &ann, &[]), None, &believed).unwrap();
    assert_eq!(devices(&p), vec![(1, Some(6 * GIB), None)]);
    // Not believed without kubelet's record (the default): refused, naming the key.
    let e = run(&container("main", &ann, &[]), None, &config()).unwrap_err();
    assert_eq!(e.key, "annotation ALIYUN_COM_GPU_MEM_IDX", "{e}");
    // kubelet allocated 2 units to this container, none to the sidecar.
    let ids: Vec<String> = (0..2).map(|i| format!("{}-_-{i}", uuid(1))).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let env = [
        ("NVIDIA_VISIBLE_DEVICES", "1"),
        ("ALIYUN_COM_GPU_MEM_IDX", "1"),
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "2"),
        ("ALIYUN_COM_GPU_MEM_DEV", "80"),
        ("ALIYUN_COM_GPU_MEM_POD", "6"),
    ];
    let cp = kubelet::checkpoint_json(vec![kubelet::entry(
        POD,
        "main",
        "aliyun.com/gpu-mem",
        &ids,
        kubelet::encode_alloc_resp(&env, &[]),
    )]);
    let envs: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let envs: Vec<&str> = envs.iter().map(String::as_str).collect();
    let p = run(&container("main", &ann, &envs), Some(&cp), &config()).unwrap();
    assert_eq!(devices(&p), vec![(1, Some(2 * GIB), None)]);
    let p = run(&container("sidecar", &ann, &[]), Some(&cp), &config()).unwrap();
    assert!(p.grants_nothing());
    // kubelet is there but its record cannot be read (a corrupt checkpoint): the pod's
    // annotation cannot be attributed to a container — refused, not given to every container.
    let e = run(
        &container("sidecar", &ann, &[]),
        Some("{not a checkpoint"),
        &config(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("needs kubelet's record"), "{e}");
    // The annotation and the recorded env disagree on the GPU.
    let bad = [
        ("ALIYUN_COM_GPU_MEM_IDX", "0"),
        ("ALIYUN_COM_GPU_MEM_POD", "6"),
    ];
    let e = run(&container("main", &bad, &envs), Some(&cp), &config())
        .unwrap_err()
        .to_string();
    assert!(e.contains("devices differ"), "{e}");
    for (k, v, why) in [
        ("ALIYUN_COM_GPU_MEM_IDX", "-1", "no GPU"),
        ("ALIYUN_COM_GPU_MEM_IDX", "x", "index"),
        ("ALIYUN_COM_GPU_MEM_POD", "0", "positive"),
        ("ALIYUN_COM_GPU_MEM_POD", "100", "exceeds"),
        ("ALIYUN_COM_GPU_MEM_IDX", "9", "no GPU with index 9"),
        ("ALIYUN_COM_GPU_MEM_ASSUME_TIME", "soon", "time"),
        ("ALIYUN_COM_GPU_MEM_TYPO", "1", "unknown"),
    ] {
        let mut a: Vec<(&str, &str)> = ann.iter().copied().filter(|(x, _)| *x != k).collect();
        a.push((k, v));
        let e = run(&container("main", &a, &[]), None, &believed).unwrap_err();
        assert!(
            e.to_string().contains(why) && e.key.contains(k),
            "{k}={v}: {e}"
        );
    }
}

#[test]
fn kai_annotations_per_container_name() {
    let ann = [
        ("nvidia.com/container.main.gpus.devices", uuid(1)),
        ("nvidia.com/container.main.gpu-memory.limit", "10Gi".into()),
        ("nvidia.com/container.main.gpu-memory.request", "8Gi".into()),
        (
            "nvidia.com/container.main.gpu-compute.mode",
            "time-slicing".into(),
        ),
        ("nvidia.com/container.other.gpus.devices", uuid(0)),
    ];
    let ann: Vec<(&str, &str)> = ann.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // A fraction pod: kubelet records no GPU for it, so KAI needs the admission policy.
    let e = run(&container("main", &ann, &[]), None, &config()).unwrap_err();
    assert_eq!(e.key, "nvidia.com/container.main.gpus.devices", "{e}");
    let config = || believing(TrustAnnotations::Admission);
    let p = run(&container("main", &ann, &[]), None, &config()).unwrap();
    assert_eq!(
        p.allocation.as_ref().unwrap().devices[0].backing,
        gpufence::allocation::backing::Backing::Admission
    );
    assert_eq!(devices(&p), vec![(1, Some(10 * GIB), None)]);
    assert_eq!(p.quota.as_ref().unwrap().devices[0].memory, Some(10 * GIB));
    let p = run(&container("other", &ann, &[]), None, &config()).unwrap();
    assert_eq!(devices(&p), vec![(0, None, None)]);
    let p = run(&container("third", &ann, &[]), None, &config()).unwrap();
    assert!(p.grants_nothing());
    // Agrees with gpufence annotations, or is refused.
    let mut with = ann.clone();
    with.push(("gpufence.dev/memory", "4Gi"));
    assert!(run(&container("main", &with, &[]), None, &config()).is_err());
    for (k, v, why) in [
        (
            "nvidia.com/container.main.gpu-memory.request",
            "11Gi",
            "exceeds the limit",
        ),
        (
            "nvidia.com/container.main.gpu-compute.mode",
            "fast",
            "time-slicing or sm-sharing",
        ),
        (
            "nvidia.com/container.main.gpu-memory.limt",
            "1Gi",
            "unknown KAI annotation",
        ),
        (
            "nvidia.com/container.main.gpus.devices",
            "7",
            "no GPU with index 7",
        ),
        (
            "nvidia.com/container.main.gpu-memory.limit",
            "0",
            "quota of 0",
        ),
    ] {
        let mut a: Vec<(&str, &str)> = ann.iter().copied().filter(|(x, _)| *x != k).collect();
        a.push((k, v));
        let e = run(&container("main", &a, &[]), None, &config()).unwrap_err();
        assert!(e.to_string().contains(why), "{k}={v}: {e}");
    }
    let lone = [("nvidia.com/container.main.gpu-memory.limit", "1Gi")];
    assert!(
        run(&container("main", &lone, &[]), None, &config())
            .unwrap_err()
            .why
            .contains("gpus.devices")
    );
}

#[test]
fn configure_passes_the_scheduler_annotations() {
    let list = gpufence::allocation::ANNOTATION_ALLOW_LIST;
    for k in [
        "hami.io/vgpu-devices-allocated",
        "ALIYUN_COM_GPU_MEM_*",
        "nvidia.com/container.*",
        "scheduling.koordinator.sh/device-allocated",
        "volcano.sh/vgpu-ids-new",
        "hami.io/vgpu-mig-allocations",
    ] {
        assert!(list.contains(&k), "{k}");
    }
}

#[test]
fn podman_containers_scheduler_annotations_are_dropped() {
    let v = hami_value(&[&[(1, 3000, 30)]]);
    let s = container(
        "main",
        &[
            ("hami.io/vgpu-devices-allocated", &v),
            ("nvidia.com/container.main.gpus.devices", "0"),
            ("ALIYUN_COM_GPU_MEM_IDX", "1"),
            ("ALIYUN_COM_GPU_MEM_POD", "2"),
            ("io.container.manager", "libpod"),
        ],
        &[],
    );
    let p = run(&s, None, &config()).unwrap();
    assert!(p.grants_nothing());
    assert!(
        p.notes
            .iter()
            .any(|n| n.contains("hami.io/vgpu-devices-allocated")),
        "{:?}",
        p.notes
    );
}
