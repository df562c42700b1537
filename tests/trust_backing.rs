//! `allocation.trust-annotations` (issue 21): on a CRI container, a GPU is granted only within
//! what kubelet recorded for that very container (device-plugin checkpoint, DRA claims); pod
//! annotations choose among and narrow it, never add to it. Every dialect, every channel of the
//! record, the three modes, non-CRI containers, and `gpufence plan` naming the backing.

mod alloc_support;
mod common;

use std::path::Path;
use std::process::Command;

use alloc_support::*;
use gpufence::allocation::AllocationError;
use gpufence::allocation::backing::Backing;
use gpufence::config::{Config, TrustAnnotations, TrustEnv};
use gpufence::kubelet::{
    self, CONTAINERD_CONTAINER_NAME, CONTAINERD_POD_UID, ContainerRecord, DraClaimRecord,
    KubeletSource, PodIdentity, ResourceGrant,
};
use gpufence::plan::Plan;

/// Key/value pairs (annotations, or mount destination and source).
type Pairs<'a> = Vec<(&'a str, &'a str)>;

const POD: &str = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

fn ann_of(kv: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut a = vec![
        (CONTAINERD_POD_UID.to_string(), POD.to_string()),
        (CONTAINERD_CONTAINER_NAME.to_string(), "main".to_string()),
        (
            "io.kubernetes.cri.sandbox-namespace".to_string(),
            "team".to_string(),
        ),
        (
            "io.kubernetes.cri.sandbox-name".to_string(),
            "forged".to_string(),
        ),
    ];
    a.extend(kv.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    a
}

/// A CRI container `main` of pod POD with these extra annotations, env and mounts.
fn cri(kv: &[(&str, &str)], env: &[&str], mounts: &[(&str, &str)]) -> serde_json::Value {
    let a = ann_of(kv);
    let a: Vec<(&str, &str)> = a.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut s = spec(&a, env);
    for (dst, src) in mounts {
        s["mounts"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"destination": dst, "source": src, "type": "bind"}));
    }
    s
}

fn grant(resource: &str, ids: &[&str]) -> ResourceGrant {
    ResourceGrant {
        resource: resource.into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
        envs: Default::default(),
        annotations: Default::default(),
        mounts: vec![],
        devices: vec![],
        cdi_devices: vec![],
    }
}

fn record_of(container: &str, resources: Vec<ResourceGrant>) -> KubeletSource {
    KubeletSource::Record(ContainerRecord {
        identity: PodIdentity {
            pod_uid: POD.into(),
            container_name: container.into(),
            pod: Some("team/forged".into()),
        },
        checkpoint: "/cp".into(),
        resources,
        dra_claims: vec![],
        dra_unavailable: None,
        replicas: vec![],
    })
}

fn plan(s: &serde_json::Value, src: &KubeletSource, c: &Config) -> Result<Plan, AllocationError> {
    gpufence::plan::plan_with(s, "ctr-1", &inventory(), c, &[], src)
}

fn granted(p: &Plan) -> Vec<(u32, Option<u64>, Backing)> {
    p.allocation
        .iter()
        .flat_map(|a| &a.devices)
        .map(|d| match d.device {
            gpufence::allocation::DeviceRef::Gpu { index } => {
                (index, d.memory_limit, d.backing.clone())
            }
            gpufence::allocation::DeviceRef::Mig { gpu, mig } => {
                (gpu * 100 + mig, d.memory_limit, d.backing.clone())
            }
        })
        .collect()
}

fn dp(ids: &[&str]) -> Backing {
    Backing::DevicePlugin {
        resource: "nvidia.com/gpu".into(),
        ids: ids.iter().map(|s| s.to_string()).collect(),
    }
}

/// `trust-annotations = m`, env not believed (the record's env then backs, without being read
/// as a dialect that would have to agree).
fn mode(m: TrustAnnotations) -> Config {
    let mut c = config();
    c.allocation.trust_annotations = m;
    c.allocation.trust_env = TrustEnv::All(false);
    c
}

/// kubelet recorded nothing for `main`; every dialect's annotation (and a pod's own
/// `/dev/null` volume at the NVIDIA plugin's mount point) naming a GPU is refused in one line
/// naming its key, its value and what kubelet recorded.
#[test]
fn no_annotation_in_any_dialect_grants_an_unrecorded_gpu() {
    let u0 = uuid(0);
    let hami = format!("{u0},NVIDIA,1000,10:;");
    let mount = format!("/var/run/nvidia-container-devices/{u0}");
    let cases: Vec<(Pairs, Pairs, &str)> = vec![
        (
            vec![("gpufence.dev/devices", "all")],
            vec![],
            "gpufence.dev/devices",
        ),
        (
            vec![("gpufence.dev/devices", "0")],
            vec![],
            "gpufence.dev/devices",
        ),
        (
            vec![("cdi.k8s.io/anything", "gpufence.dev/gpu=all")],
            vec![],
            "cdi.k8s.io/anything",
        ),
        (
            vec![("hami.io/vgpu-devices-allocated", &hami)],
            vec![],
            "hami.io/vgpu-devices-allocated",
        ),
        (
            vec![
                ("ALIYUN_COM_GPU_MEM_IDX", "0"),
                ("ALIYUN_COM_GPU_MEM_POD", "4"),
            ],
            vec![],
            "ALIYUN_COM_GPU_MEM_IDX",
        ),
        (
            vec![("nvidia.com/container.main.gpus.devices", &u0)],
            vec![],
            "nvidia.com/container.main.gpus.devices",
        ),
        (vec![], vec![(&mount, "/dev/null")], "mounts["),
    ];
    // kubelet gave this container GPU 1, and GPU 0 to the sidecar: neither backs GPU 0 here.
    let mut g1 = grant("nvidia.com/gpu", &[&uuid(1)]);
    g1.envs.insert("NVIDIA_VISIBLE_DEVICES".into(), uuid(1));
    let mut cfg = config();
    cfg.allocation.trust_env = TrustEnv::All(false);
    let main = PodIdentity {
        pod_uid: POD.into(),
        container_name: "main".into(),
        pod: Some("team/forged".into()),
    };
    let sidecar_only = kubelet::checkpoint_json(vec![kubelet::entry(
        POD,
        "sidecar",
        "nvidia.com/gpu",
        &[&u0],
        kubelet::encode_alloc_resp(&[("NVIDIA_VISIBLE_DEVICES", u0.as_str())], &[]),
    )]);
    for src in [
        record_of("main", vec![]),
        kubelet::from_checkpoint_bytes(sidecar_only.as_bytes(), &main, "/cp"),
        record_of("main", vec![g1]),
    ] {
        for (kv, mounts, key) in &cases {
            let e = plan(&cri(kv, &[], mounts), &src, &cfg).unwrap_err();
            let line = e.to_string();
            assert!(e.key.contains(key), "{key}: {line}");
            assert!(!line.contains('\n'), "{line}");
            assert!(
                line.contains(
                    "is not among what kubelet recorded for container main of pod team/forged"
                ) && line.contains("kubelet recorded: "),
                "{line}"
            );
            // Under the admission policy, and believed: granted as written (GPU 0 by the
            // policy; a GPU the record also backs shows its record).
            let p = plan(
                &cri(kv, &[], mounts),
                &src,
                &mode(TrustAnnotations::Admission),
            );
            let p = p.unwrap_or_else(|e| panic!("{key}: {e}"));
            let recorded_here = matches!(&src, KubeletSource::Record(r)
                if r.identity.container_name == "main" && !r.resources.is_empty());
            let want = |g: u32, otherwise: Backing| {
                if g == 1 && recorded_here {
                    dp(&[&uuid(1)])
                } else {
                    otherwise
                }
            };
            for g in granted(&p) {
                assert_eq!(g.2, want(g.0, Backing::Admission), "{key}");
            }
            let p = plan(
                &cri(kv, &[], mounts),
                &src,
                &mode(TrustAnnotations::Believed),
            )
            .unwrap();
            for g in granted(&p) {
                assert_eq!(g.2, want(g.0, Backing::Trusted), "{key}");
            }
        }
    }
    // The refusal names what kubelet recorded.
    let e = plan(
        &cri(&[("gpufence.dev/devices", "all")], &[], &[]),
        &record_of("main", vec![]),
        &config(),
    )
    .unwrap_err();
    assert!(e.why.ends_with("kubelet recorded: nothing"), "{e}");
}

/// Every channel of a device plugin's Allocate response, and its device ids (replicas mapped to
/// their GPU), backs GPU 1 — and only GPU 1.
#[test]
fn every_channel_of_the_record_backs_its_gpu() {
    let u1 = uuid(1);
    let replica = format!("{u1}::2");
    let mut channels: Vec<(&str, ResourceGrant)> = Vec::new();
    channels.push(("replica id", grant("nvidia.com/gpu", &[&replica])));
    channels.push(("index id", grant("nvidia.com/gpu", &["1::0"])));
    let mut g = grant("example.com/gpu", &["dev-a"]);
    g.devices = vec![("/dev/nvidia1".into(), "/dev/nvidia1".into(), "rw".into())];
    channels.push(("device spec", g));
    let mut g = grant("example.com/gpu", &["dev-a"]);
    g.mounts = vec![(
        format!("/var/run/nvidia-container-devices/{u1}"),
        "/dev/null".into(),
        true,
    )];
    channels.push(("mount", g));
    let mut g = grant("example.com/gpu", &["dev-a"]);
    g.cdi_devices = vec!["nvidia.com/gpu=1".into()];
    channels.push(("CDI device", g));
    let mut g = grant("example.com/gpu", &["dev-a"]);
    g.annotations
        .insert("cdi.k8s.io/plugin".into(), format!("gpufence.dev/gpu={u1}"));
    channels.push(("CDI annotation", g));
    let mut g = grant("aliyun.com/gpu-mem", &["x-_-0"]);
    g.envs.insert("ALIYUN_COM_GPU_MEM_IDX".into(), "1".into());
    channels.push(("gpushare env", g));
    // trust-env false: the env channels back grants without being read as allocations.
    let mut cfg = config();
    cfg.allocation.trust_env = TrustEnv::All(false);
    for (what, g) in channels {
        let resource = g.resource.clone();
        let src = record_of("main", vec![g]);
        let s = cri(
            &[
                ("gpufence.dev/devices", "1"),
                ("gpufence.dev/memory", "4Gi"),
            ],
            &[],
            &[],
        );
        let p = plan(&s, &src, &cfg).unwrap_or_else(|e| panic!("{what}: {e}"));
        let got = granted(&p);
        assert_eq!(got.len(), 1, "{what}");
        assert_eq!((got[0].0, got[0].1), (1, Some(4 * GIB)), "{what}");
        assert!(
            matches!(&got[0].2, Backing::DevicePlugin { resource: r, .. } if *r == resource),
            "{what}: {:?}",
            got[0].2
        );
        let e = plan(&cri(&[("gpufence.dev/devices", "0")], &[], &[]), &src, &cfg).unwrap_err();
        assert!(e.why.contains("kubelet recorded: "), "{what}: {e}");
    }
    // The replica's id is what the plan shows.
    let src = record_of("main", vec![grant("nvidia.com/gpu", &[&replica, "other"])]);
    let p = plan(&cri(&[("gpufence.dev/devices", "1")], &[], &[]), &src, &cfg).unwrap();
    assert_eq!(granted(&p)[0].2, dp(&[&replica]));
    assert_eq!(
        granted(&p)[0].2.to_string(),
        format!("kubelet device plugin nvidia.com/gpu [{replica}]")
    );
    // A non-NVIDIA resource's numeric id names no GPU.
    let src = record_of("main", vec![grant("example.com/fpga", &["1"])]);
    assert!(plan(&cri(&[("gpufence.dev/devices", "1")], &[], &[]), &src, &cfg).is_err());
}

/// Annotations choose among and narrow what kubelet recorded: a subset of its GPUs, lower
/// memory and cores, a MIG device of a recorded GPU.
#[test]
fn narrowing_what_kubelet_recorded_is_allowed() {
    let ids = [uuid(0), uuid(1), uuid(2)];
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let src = record_of("main", vec![grant("nvidia.com/gpu", &ids)]);
    let cfg = config();
    for (devs, want) in [
        ("1", vec![1]),
        ("0,1", vec![0, 1]),
        ("1,0", vec![1, 0]),
        ("2:1", vec![201]),
    ] {
        let mut kv = vec![
            ("gpufence.dev/devices", devs),
            ("gpufence.dev/memory", "2Gi"),
        ];
        if !devs.contains(':') {
            kv.extend([
                ("gpufence.dev/cores", "30"),
                ("gpufence.dev/cores-policy", "burst"),
            ]);
        }
        let s = cri(&kv, &[], &[]);
        let p = plan(&s, &src, &cfg).unwrap_or_else(|e| panic!("{devs}: {e}"));
        let got: Vec<u32> = granted(&p).iter().map(|g| g.0).collect();
        assert_eq!(got, want, "{devs}");
    }
    // `all` is more than was recorded (GPU 3): refused.
    let e = plan(
        &cri(&[("gpufence.dev/devices", "all")], &[], &[]),
        &src,
        &cfg,
    )
    .unwrap_err();
    assert!(e.why.contains("GPU 3"), "{e}");
}

/// The record's own env: HAMi's recorded slice with a lower memory from the annotation agreeing;
/// the recorded limit cannot be raised (the dialects disagree).
#[test]
fn recorded_env_backs_and_its_limits_are_not_raised() {
    let u1 = uuid(1);
    let mut g = grant("nvidia.com/gpu", &[&format!("{u1}-0")]);
    g.envs.insert("NVIDIA_VISIBLE_DEVICES".into(), u1.clone());
    g.envs
        .insert("CUDA_DEVICE_MEMORY_LIMIT_0".into(), "4096m".into());
    let src = record_of("main", vec![g]);
    let p = plan(&cri(&[], &[], &[]), &src, &config()).unwrap();
    assert_eq!(granted(&p)[0].0, 1);
    assert!(matches!(granted(&p)[0].2, Backing::DevicePlugin { .. }));
    let e = plan(
        &cri(&[("gpufence.dev/memory", "8Gi")], &[], &[]),
        &src,
        &config(),
    )
    .unwrap_err();
    assert!(e.why.contains("disagrees"), "{e}");
}

/// DRA: the CDI device ids of the claims prepared for the pod back their GPUs; an unusable DRA
/// state is named in the refusal.
#[test]
fn dra_claims_back_their_gpus() {
    let KubeletSource::Record(mut r) = record_of("main", vec![]) else {
        unreachable!()
    };
    r.dra_claims = vec![DraClaimRecord {
        claim: "team/train-gpu".into(),
        cdi_device_ids: vec![format!("gpufence.dev/gpu={}", uuid(1))],
        shared_cdi_ids: vec![],
    }];
    let src = KubeletSource::Record(r.clone());
    let p = plan(
        &cri(&[("gpufence.dev/devices", "1")], &[], &[]),
        &src,
        &config(),
    )
    .unwrap();
    assert_eq!(
        granted(&p)[0].2,
        Backing::DraClaim {
            claim: "team/train-gpu".into(),
            device: Some("/dev/nvidia1".into()),
            share: None,
        }
    );
    assert_eq!(
        granted(&p)[0].2.to_string(),
        "kubelet DRA claim team/train-gpu (device /dev/nvidia1)"
    );
    let e = plan(
        &cri(&[("gpufence.dev/devices", "0")], &[], &[]),
        &src,
        &config(),
    )
    .unwrap_err();
    assert!(e.why.contains("DRA claim team/train-gpu"), "{e}");
    r.dra_claims.clear();
    r.dra_unavailable = Some("kubelet DRA state /d: checksum 1 does not match".into());
    let e = plan(
        &cri(&[("gpufence.dev/devices", "1")], &[], &[]),
        &KubeletSource::Record(r),
        &config(),
    )
    .unwrap_err();
    assert!(
        e.why
            .contains("its DRA state cannot be used: kubelet DRA state /d"),
        "{e}"
    );
}

/// Fail closed: a CRI container asking for a GPU by annotation with kubelet's record
/// unreadable or absent is refused with the reason; one that asks for nothing starts without a
/// GPU; non-CRI containers keep today's rules.
#[test]
fn unreadable_record_refuses_grants_and_nothing_else() {
    let unavailable = KubeletSource::Unavailable {
        checkpoint: "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint".into(),
        why: "checksum mismatch".into(),
    };
    let e = plan(
        &cri(&[("gpufence.dev/devices", "1")], &[], &[]),
        &unavailable,
        &config(),
    )
    .unwrap_err();
    assert!(
        e.why
            .contains("kubelet_internal_checkpoint cannot be used: checksum mismatch"),
        "{e}"
    );
    let e = plan(
        &cri(&[("gpufence.dev/devices", "1")], &[], &[]),
        &KubeletSource::Absent,
        &config(),
    )
    .unwrap_err();
    assert!(e.why.contains("no kubelet device-plugin checkpoint"), "{e}");
    // Nothing asked: starts, no GPU (without kubelet, a CUDA image's NVIDIA_VISIBLE_DEVICES=all
    // too; with an unreadable record, env asking for a GPU is refused by trust-env "kubelet").
    for (src, env) in [
        (&unavailable, ["PATH=/bin"]),
        (&KubeletSource::Absent, ["NVIDIA_VISIBLE_DEVICES=all"]),
    ] {
        let p = plan(&cri(&[], &env, &[]), src, &config()).unwrap();
        assert!(p.grants_nothing());
    }
    // Not a CRI container: the annotation is believed as before.
    let s = spec(&[("gpufence.dev/devices", "all")], &[]);
    let p = plan(&s, &KubeletSource::Absent, &config()).unwrap();
    assert_eq!(granted(&p).len(), 4 + 1);
    assert!(granted(&p).iter().all(|g| g.2 == Backing::Trusted));
    // A malformed pod identity counts as CRI (fail closed).
    let s = spec(
        &[(CONTAINERD_POD_UID, POD), ("gpufence.dev/devices", "1")],
        &[],
    );
    assert!(plan(&s, &KubeletSource::Absent, &config()).is_err());
}

fn write_bundle(dir: &Path, name: &str, ann: &[(&str, &str)]) -> std::path::PathBuf {
    let b = dir.join(name);
    std::fs::create_dir_all(&b).unwrap();
    let a: serde_json::Map<String, serde_json::Value> = ann_of(ann)
        .into_iter()
        .map(|(k, v)| (k, v.into()))
        .collect();
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "env": [], "cwd": "/"},
        "root": {"path": "rootfs"},
        "annotations": a,
    });
    std::fs::write(b.join("config.json"), spec.to_string()).unwrap();
    b
}

/// The reproduction through `gpufence plan`: a valid checkpoint in which this pod has no
/// GPU; `gpufence.dev/devices: all` and `cdi.k8s.io/anything: gpufence.dev/gpu=all` are refused
/// (exit 1, one line); a recorded GPU is granted and the plan says what backs it.
#[test]
fn plan_cli_refuses_the_forged_pod_and_names_the_backing() {
    if common::skip_unless(&[]) {
        return;
    }
    let dir = common::scratch("trust-cli");
    let cfg = common::sim_node(&dir.join("node"), 4, None);
    let cp = dir.join("kubelet_internal_checkpoint");
    let gpu1 = gpufence::sim::gpu_uuid(1);
    let resp = kubelet::encode_alloc_resp(&[("NVIDIA_VISIBLE_DEVICES", gpu1.as_str())], &[]);
    std::fs::write(
        &cp,
        kubelet::checkpoint_json(vec![
            kubelet::entry(
                "other-pod",
                "main",
                "nvidia.com/gpu",
                &[&gpu1],
                resp.clone(),
            ),
            kubelet::entry(
                POD,
                "backed",
                "nvidia.com/gpu",
                &[&format!("{gpu1}::1")],
                resp,
            ),
        ]),
    )
    .unwrap();
    let run = |b: &Path, json: bool| {
        let mut c = Command::new(common::bin("gpufence"));
        c.arg("--config")
            .arg(&cfg)
            .arg("plan")
            .arg("--bundle")
            .arg(b);
        c.arg("--kubelet-checkpoint").arg(&cp);
        if json {
            c.arg("--json");
        }
        common::run(&mut c)
    };
    for (name, k, v) in [
        ("forged", "gpufence.dev/devices", "all"),
        ("forged-cdi", "cdi.k8s.io/anything", "gpufence.dev/gpu=all"),
    ] {
        let b = write_bundle(&dir, name, &[(k, v)]);
        let (code, out, err) = run(&b, false);
        assert_eq!(code, 1, "{out}{err}");
        let line = err.trim();
        assert_eq!(line.lines().count(), 1, "{err}");
        assert!(
            line.contains(k) && line.contains(v) && line.contains("kubelet recorded: nothing"),
            "{line}"
        );
    }
    // The container kubelet gave GPU 1 (a replica of it), narrowed to 4 GiB.
    let b = dir.join("backed");
    std::fs::create_dir_all(&b).unwrap();
    let mut a = ann_of(&[("gpufence.dev/memory", "4Gi")]);
    a[1].1 = "backed".into();
    let a: serde_json::Map<String, serde_json::Value> =
        a.into_iter().map(|(k, v)| (k, v.into())).collect();
    let spec = serde_json::json!({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
        "process": {"args": ["sh"], "env": [], "cwd": "/"}, "annotations": a});
    std::fs::write(b.join("config.json"), spec.to_string()).unwrap();
    let (code, out, err) = run(&b, false);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!(
            "backed by kubelet device plugin nvidia.com/gpu [{gpu1}::1]"
        )),
        "{out}"
    );
    let (code, out, err) = run(&b, true);
    assert_eq!(code, 0, "{out}{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    let d = &j["allocation"]["devices"];
    assert_eq!(d.as_array().unwrap().len(), 1, "{j}");
    assert_eq!(d[0]["memoryLimit"], 4u64 << 30);
    assert_eq!(
        d[0]["backing"],
        serde_json::json!({"kind": "devicePlugin", "resource": "nvidia.com/gpu",
                           "ids": [format!("{gpu1}::1")]})
    );
}

/// CRI-O copies a pod's annotations into the spec: a pod adding podman's markers
/// (`io.container.manager: libpod`, `io.podman.annotations.*`) stays a CRI container, and its
/// own `/dev/null` volume at the NVIDIA plugin's mount point gets no GPU kubelet did not record.
#[test]
fn podman_markers_do_not_make_a_cri_container_trusted() {
    let u0 = uuid(0);
    let mount = format!("/var/run/nvidia-container-devices/{u0}");
    for marker in [
        ("io.container.manager", "libpod"),
        ("io.podman.annotations.autoremove", "FALSE"),
    ] {
        let s = cri(&[marker], &[], &[(mount.as_str(), "/dev/null")]);
        let e = plan(
            &s,
            &record_of("main", vec![]),
            &mode(TrustAnnotations::Kubelet),
        )
        .unwrap_err();
        assert!(e.to_string().contains("kubelet"), "{marker:?}: {e}");
    }
}
