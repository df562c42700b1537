//! The RuntimeClass path end to end: containerd 1.6 with the `gpufence` runtime handler written
//! by `gpufence runtime configure --runtime containerd`, driven through CRI by a Python client
//! (tests/cri/cri_client.py, PyPI `container-runtime-interface-api` in target/venv, set up by
//! `make deps`). A pod annotation picks the GPU; an invalid one reaches the CRI client as the
//! StartContainer error. Under `allocation.trust-env = "kubelet"`, a HAMi pod whose env kubelet's
//! device-manager checkpoint records gets exactly the recorded slice, while env the checkpoint
//! does not record (a CUDA image's `NVIDIA_VISIBLE_DEVICES=all`, a pod spec claiming HAMi's
//! variables) is neutralised, and a missing checkpoint refuses the HAMi pod in one line.

mod common;
mod cri_support;
mod runtime_support;

use std::path::Path;
use std::process::Command;

use cri_support::{Containerd, import_image, import_image_named, operator_config};
use runtime_support::{PROBE, facts, node};

fn cri(
    py: &Path,
    c: &Containerd,
    s: &Path,
    name: &str,
    pod_annotations: serde_json::Value,
) -> serde_json::Value {
    cri_with(py, c, s, name, pod_annotations, serde_json::json!({}))
}

/// One pod through CRI; `extra` adds request fields (`image`, `envs`: what kubelet passes).
fn cri_with(
    py: &Path,
    c: &Containerd,
    s: &Path,
    name: &str,
    pod_annotations: serde_json::Value,
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut req = serde_json::json!({
        "socket": c.sock, "handler": "gpufence", "dir": s, "name": name,
        "pod_annotations": pod_annotations, "image": "localhost/pause:test",
        "command": ["/bin/sh", "-c", PROBE], "timeout": 30,
    });
    for (k, v) in extra.as_object().unwrap() {
        req[k] = v.clone();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cri/cri_client.py");
    let (code, out, err) = common::run(Command::new(py).arg(script).arg(req.to_string()));
    assert_eq!(code, 0, "cri client: {out}{err}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn containerd_cri_pod_annotation_picks_the_gpu() {
    if common::skip_unless(&["runc", "containerd", "ctr", "umoci", "tar"]) {
        return;
    }
    let Some(py) = cri_support::python() else {
        return;
    };
    let s = common::scratch("rt-cri");
    let checkpoint = s.join("kubelet/device-plugins/kubelet_internal_checkpoint");
    std::fs::create_dir_all(checkpoint.parent().unwrap()).unwrap();
    let n = node(
        &s,
        2,
        &[(
            "kubelet.checkpoint",
            toml_edit::value(checkpoint.display().to_string()),
        )],
    );

    // Operator file → configure writes the drop-in and adds only an `imports` line.
    let cdir = s.join("containerd");
    std::fs::create_dir_all(cdir.join("cni/net.d")).unwrap();
    let main = cdir.join("config.toml");
    let original = operator_config(&cdir);
    std::fs::write(&main, &original).unwrap();
    let out = cri_support::configure_handler(&n.config, &main, &s.join("records"));
    // It says what the allow-listed pod annotations are worth on this node.
    assert!(
        out.contains("trust mode: allocation.trust-annotations = \"kubelet\""),
        "{out}"
    );
    let now = std::fs::read_to_string(&main).unwrap();
    let added: Vec<&str> = now
        .lines()
        .filter(|l| !original.lines().any(|o| o == *l))
        .collect();
    assert_eq!(added.len(), 1, "{now}");
    assert!(added[0].starts_with("imports = ["), "{now}");
    assert_eq!(now.lines().count(), original.lines().count() + 1);
    let drop_in = std::fs::read_to_string(cdir.join("conf.d/gpufence.toml")).unwrap();
    assert!(
        drop_in.contains(&common::bin("gpufence-runtime").display().to_string()),
        "{drop_in}"
    );

    // Debian's containerd 1.6 with that configuration; the runtime finds gpufence's config
    // through the env containerd hands to its shims.
    let c = cri_support::start_containerd(None, &main, &cdir, &[("GPUFENCE_CONFIG", &n.config)]);
    import_image(&s, &c);

    // kubelet's record: the device plugin gave gpu-pod's container GPU 1 (a time-slicing replica
    // of it); nothing to forged-pod.
    let gpu1 = gpufence::sim::gpu_uuid(1);
    std::fs::write(
        &checkpoint,
        gpufence::kubelet::checkpoint_json(vec![gpufence::kubelet::entry(
            "gpu-pod-uid",
            "app",
            "nvidia.com/gpu",
            &[&format!("{gpu1}::0")],
            gpufence::kubelet::encode_alloc_resp(&[("NVIDIA_VISIBLE_DEVICES", gpu1.as_str())], &[]),
        )]),
    )
    .unwrap();
    // The pod annotation lowers the recorded GPU 1's memory to 4Gi: exactly GPU 1, 4 GiB quota.
    let r = cri(
        &py,
        &c,
        &s,
        "gpu-pod",
        serde_json::json!({"gpufence.dev/devices": "1", "gpufence.dev/memory": "4Gi"}),
    );
    assert_eq!(r["stage"], "done", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    let f = facts(r["log"].as_str().unwrap());
    assert_eq!(f["gpu1"], "ENXIO", "{r}");
    assert_eq!(f["gpu0"], "ABSENT", "{r}");
    assert_eq!(f["mknod0"], "EPERM", "{r}");
    assert_eq!(f["ctl"], "ENXIO", "{r}");
    assert_eq!(f["quota_mem"], (4u64 << 30).to_string(), "{r}");
    assert_eq!(f["quota_uuid"], gpu1, "{r}");

    // A pod with no GPU resource that writes `gpufence.dev/devices: all` (any pod author can):
    // refused, the one line in the CRI error naming the key, the value and kubelet's record.
    let r = cri(
        &py,
        &c,
        &s,
        "forged-pod",
        serde_json::json!({"gpufence.dev/devices": "all"}),
    );
    assert_eq!(r["stage"], "start_container", "{r}");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("gpufence.dev/devices=\"all\"")
            && e.contains(
                "is not among what kubelet recorded for container app of pod default/forged-pod"
            )
            && e.contains("kubelet recorded: nothing"),
        "{e}"
    );
    assert_eq!(f["quota_write"], "DENIED", "{r}");
    assert_eq!(f["preload"], "/usr/lib/gpufence/libgpufence.so", "{r}");

    // Without the annotation: same handler, no GPU.
    let r = cri(&py, &c, &s, "plain-pod", serde_json::json!({}));
    assert_eq!(r["stage"], "done", "{r}");
    let f = facts(r["log"].as_str().unwrap());
    assert_eq!(f["gpu0"], "ABSENT", "{r}");
    assert_eq!(f["gpu1"], "ABSENT", "{r}");
    assert_eq!(f["ctl"], "ABSENT", "{r}");

    // An invalid allocation: the CRI client sees gpufence's one-line reason.
    let r = cri(
        &py,
        &c,
        &s,
        "bad-pod",
        serde_json::json!({"gpufence.dev/devices": "5"}),
    );
    assert_eq!(r["stage"], "start_container", "{r}");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("gpufence-runtime") && e.contains("gpufence.dev/devices"),
        "{e}"
    );

    kubelet_checkpoint_decides_env(&py, &c, &s, &checkpoint);

    drop(c);
    // State directories of the removed containers are gone.
    let left: Vec<_> = std::fs::read_dir(&n.state_dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "state dirs left: {left:?}");
}

/// HAMi through kubelet's checkpoint (the pods' UIDs are `<name>-uid`, the container `app`, as
/// tests/cri/cri_client.py creates them).
fn kubelet_checkpoint_decides_env(py: &Path, c: &Containerd, s: &Path, checkpoint: &Path) {
    use gpufence::kubelet;
    // A CUDA-like image: every CUDA base image sets NVIDIA_VISIBLE_DEVICES=all; this one also
    // tries for a second GPU's worth of HAMi memory.
    import_image_named(
        s,
        c,
        "cuda",
        &[
            "PATH=/bin:/usr/bin",
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
            "CUDA_DEVICE_MEMORY_LIMIT_1=80000m",
        ],
    );
    let gpu1 = gpufence::sim::gpu_uuid(1);
    // What HAMi's device plugin returned from Allocate for hami-pod/app, as kubelet recorded it.
    let plugin_env = [
        ("NVIDIA_VISIBLE_DEVICES", gpu1.as_str()),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "2048m"),
        ("CUDA_DEVICE_SM_LIMIT", "30"),
    ];
    let json = kubelet::checkpoint_json(vec![kubelet::entry(
        "hami-pod-uid",
        "app",
        "nvidia.com/gpu",
        &[&format!("{gpu1}-3")],
        kubelet::encode_alloc_resp(&plugin_env, &[]),
    )]);
    std::fs::write(checkpoint, json).unwrap();
    let envs: serde_json::Map<String, serde_json::Value> = plugin_env
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    let hami = serde_json::json!({
        "hami.io/vgpu-devices-allocated": format!("{gpu1},NVIDIA,2048,30:;"),
    });
    let cuda =
        |envs: serde_json::Value| serde_json::json!({"image": "localhost/cuda:test", "envs": envs});

    // The recorded slice: GPU 1 with 2048 MiB reaches the shim's quota.
    let r = cri_with(
        py,
        c,
        s,
        "hami-pod",
        hami.clone(),
        cuda(envs.clone().into()),
    );
    assert_eq!(r["stage"], "done", "{r}");
    let f = facts(r["log"].as_str().unwrap());
    assert_eq!(f["gpu1"], "ENXIO", "{r}");
    assert_eq!(f["gpu0"], "ABSENT", "{r}");
    assert_eq!(f["quota_mem"], (2048u64 << 20).to_string(), "{r}");
    assert_eq!(f["quota_uuid"], gpu1, "{r}");
    assert_eq!(f["env_nvd"], gpu1, "{r}");

    // The image's NVIDIA_VISIBLE_DEVICES=all in a pod kubelet allocated nothing: no GPU.
    let r = cri_with(
        py,
        c,
        s,
        "cuda-pod",
        serde_json::json!({}),
        cuda(serde_json::json!({})),
    );
    assert_eq!(r["stage"], "done", "{r}");
    let f = facts(r["log"].as_str().unwrap());
    for k in ["gpu0", "gpu1", "ctl"] {
        assert_eq!(f[k], "ABSENT", "{k}: {r}");
    }
    assert_eq!(f["env_nvd"], "void", "{r}");

    // A pod spec writing HAMi's variables itself (no plugin behind them): neutralised.
    let grab = serde_json::json!({
        "NVIDIA_VISIBLE_DEVICES": gpufence::sim::gpu_uuid(0),
        "CUDA_DEVICE_MEMORY_LIMIT_0": "80000m",
    });
    let r = cri_with(py, c, s, "grab-pod", serde_json::json!({}), cuda(grab));
    assert_eq!(r["stage"], "done", "{r}");
    let f = facts(r["log"].as_str().unwrap());
    assert_eq!(f["gpu0"], "ABSENT", "{r}");
    assert_eq!(f["env_nvd"], "void", "{r}");

    // No checkpoint on a node with kubelet's directory: the HAMi pod is refused, in one line
    // naming the file (as would any pod granted a GPU by annotation, trust-annotations).
    std::fs::remove_file(checkpoint).unwrap();
    let r = cri_with(
        py,
        c,
        s,
        "hami-pod",
        serde_json::json!({}),
        cuda(envs.into()),
    );
    assert_eq!(r["stage"], "start_container", "{r}");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("kubelet_internal_checkpoint") && e.contains("does not exist"),
        "{e}"
    );
}
