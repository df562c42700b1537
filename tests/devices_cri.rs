//! Grants that arrive as devices (issue 28) end to end through CRI on containerd 2.3.4 + runc
//! 1.5.1, for both appliers — the `gpufence` runtime handler and `gpufence nri` — one containerd
//! each. containerd itself resolves the CRI `CDIDevices` from root-owned spec files (mode 0644)
//! in its `cdi_spec_dirs`, which are gpufence's `cdi.spec-dirs`; kubelet's records are files the
//! node's config points at: the device-manager checkpoint (`kubelet.checkpoint`) and the DRA
//! state (`kubelet.dra-checkpoint`). The GPUs are the simulated node's character devices
//! (`mknod c 195 N`). Pods (UID `<name>-uid`, container `app`, namespace `default`, as
//! tests/cri/cri_client.py creates them):
//!
//! * a DRA claim of NVIDIA's driver (per-claim spec `k8s.gpu.nvidia.com/claim=<uid>-gpu-1`) and
//!   `gpufence.dev/memory: 4Gi` → exactly /dev/nvidia1 openable, every other GPU EPERM, the shim
//!   preloaded, 4 GiB in the quota file and env; its standard id `k8s.gpu.nvidia.com/device=gpu-1`
//!   with a per-claim spec of env only → the whole GPU; two claims with a memory list → both
//!   GPUs, each its quota; `gpufence.dev/devices` naming another GPU than the claim's → refused;
//! * NVIDIA's device plugin, CDI strategies (`k8s.device-plugin.nvidia.com/gpu=<uuid>`, recorded
//!   in the Allocate response's `cdi_devices`, or as its `cdi.k8s.io/*` annotation) → that GPU
//!   fenced whole;
//! * DeviceSpecs (CRI `devices` /dev/nvidia2, recorded in the Allocate response's `devices`) →
//!   GPU 2 fenced whole;
//! * a CRI device nothing recorded (a GPU, a control node alone), the CDI id of another pod's
//!   claim, a claim whose spec others can write (containerd reads it, gpufence does not) →
//!   refused, in one line naming the device and what kubelet recorded;
//! * shares of one DRA device (KEP-5075 `ShareID`): 8 GiB and 50 % written by a driver as
//!   gpufence's CDI annotations, 2048 MiB and 25 % as HAMi's env; each pod held to its share, a
//!   pod annotation asking more than the share refused, a lower one narrowing it.
//!
//! Every pod runs a CUDA-like image (`NVIDIA_VISIBLE_DEVICES=all`, never believed), while the
//! drivers' CDI specs set `NVIDIA_VISIBLE_DEVICES` themselves, as NVIDIA's do. The records are
//! written after containerd and gpufence are up, as on a node.

mod common;
mod cri_support;
mod runtime_support;

use std::path::{Path, PathBuf};

use cri_support::{Applier, Containerd, assert_refused};
use gpufence::kubelet::{self, proto};
use gpufence::sim::gpu_uuid;

/// The claims' UIDs (kubelet's DRA state, the drivers' per-claim CDI device names).
const CLAIM_A: &str = "c0ffee00-0000-4000-8000-00000000000a";
const CLAIM_B: &str = "c0ffee00-0000-4000-8000-00000000000b";
const CLAIM_C: &str = "c0ffee00-0000-4000-8000-00000000000c";
const CLAIM_D: &str = "c0ffee00-0000-4000-8000-00000000000d";
const CLAIM_E: &str = "c0ffee00-0000-4000-8000-00000000000e";
const CLAIM_S: &str = "c0ffee00-0000-4000-8000-00000000005e";
const CLAIM_H: &str = "c0ffee00-0000-4000-8000-0000000000a4";
/// A whole GPU: no memory limit in the quota.
const WHOLE: Option<u64> = None;

/// NVIDIA's DRA driver: a claim's CDI id, and a GPU's standard id.
fn claim_id(uid: &str, gpu: u32) -> String {
    format!("k8s.gpu.nvidia.com/claim={uid}-gpu-{gpu}")
}
fn standard_id(gpu: u32) -> String {
    format!("k8s.gpu.nvidia.com/device=gpu-{gpu}")
}
/// NVIDIA's device plugin, `DEVICE_LIST_STRATEGY=cdi-cri`.
fn plugin_id(gpu: u32) -> String {
    format!("k8s.device-plugin.nvidia.com/gpu={}", gpu_uuid(gpu))
}
/// The annotation NVIDIA's device plugin (`cdi-annotations`) returns from Allocate.
const CDI_ANNOTATION: &str = "cdi.k8s.io/nvidia-device-plugin_c0ffee";
const SHARE_ID: &str = "k8s.gpu.example.com/claim=c0ffee00-0000-4000-8000-00000000005e-gpu-0";
const HAMI_ID: &str = "hami.io/claim=c0ffee00-0000-4000-8000-0000000000a4-gpu-0";

/// Facts beyond runtime_support's PROBE and `mkN` (cri_support::PROBE_MKNOD):
/// the first device's cores, the second device's memory and UUID in the quota file.
const PROBE_MORE: &str = r#"
q() { grep "^device.$1=" /run/gpufence/quota 2>/dev/null | cut -d= -f2; }
echo "quota_cores=$(q 0.cores)"
echo "quota1_mem=$(q 1.memory)"
echo "quota1_uuid=$(q 1.uuid)"
"#;

fn probe() -> String {
    format!(
        "{}{}{PROBE_MORE}",
        runtime_support::PROBE,
        cri_support::PROBE_MKNOD
    )
}

/// A device node of the simulated node in a CDI spec: the container path and the host's.
fn node(dev: &Path, name: &str) -> serde_json::Value {
    serde_json::json!({"path": format!("/dev/{name}"), "hostPath": dev.join(name)})
}

/// One CDI spec file as a driver writes it (root-owned, 0644: the umask here is 022).
fn write_spec(dir: &Path, file: &str, spec: serde_json::Value) {
    let p = dir.join(file);
    std::fs::write(&p, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// The drivers' CDI specs: NVIDIA's DRA driver (standard devices, claims A and B), NVIDIA's
/// device plugin (cdi-cri), a driver writing gpufence's share annotations (claim S) and HAMi's
/// DRA driver writing its env (claim H).
fn cdi_specs(dir: &Path, dev: &Path) {
    let ctl = serde_json::json!({"deviceNodes": [node(dev, "nvidiactl")]});
    let gpus = |name: &dyn Fn(u32) -> String| -> Vec<serde_json::Value> {
        (0..4)
            .map(|g| {
                serde_json::json!({"name": name(g),
                    "containerEdits": {"deviceNodes": [node(dev, &format!("nvidia{g}"))]}})
            })
            .collect()
    };
    write_spec(
        dir,
        "k8s.gpu.nvidia.com-device.json",
        serde_json::json!({"cdiVersion": "0.6.0", "kind": "k8s.gpu.nvidia.com/device",
            "devices": gpus(&|g| format!("gpu-{g}")), "containerEdits": ctl}),
    );
    write_spec(
        dir,
        "k8s.device-plugin.nvidia.com-gpu.json",
        serde_json::json!({"cdiVersion": "0.6.0", "kind": "k8s.device-plugin.nvidia.com/gpu",
            "devices": gpus(&gpu_uuid), "containerEdits": ctl}),
    );
    // Claim A's spec carries the GPU's nodes itself; claim B's only env (its standard id the
    // nodes). NVIDIA_VISIBLE_DEVICES=void: the driver's, so that no other hook injects GPUs.
    write_spec(
        dir,
        &format!("k8s.gpu.nvidia.com-claim_{CLAIM_A}.json"),
        serde_json::json!({"cdiVersion": "0.6.0", "kind": "k8s.gpu.nvidia.com/claim",
            "devices": [{"name": format!("{CLAIM_A}-gpu-1"), "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=void"],
                "deviceNodes": [node(dev, "nvidia1"), node(dev, "nvidiactl")]}}]}),
    );
    write_spec(
        dir,
        &format!("k8s.gpu.nvidia.com-claim_{CLAIM_B}.json"),
        serde_json::json!({"cdiVersion": "0.6.0", "kind": "k8s.gpu.nvidia.com/claim",
            "devices": [{"name": format!("{CLAIM_B}-gpu-1"), "containerEdits": {
                "env": [format!("NVIDIA_VISIBLE_DEVICES={}", gpu_uuid(1))]}}]}),
    );
    // A claim spec any user could have written (0666).
    write_spec(
        dir,
        &format!("k8s.gpu.nvidia.com-claim_{CLAIM_E}.json"),
        serde_json::json!({"cdiVersion": "0.6.0", "kind": "k8s.gpu.nvidia.com/claim",
            "devices": [{"name": format!("{CLAIM_E}-gpu-1"), "containerEdits": {
                "deviceNodes": [node(dev, "nvidia1"), node(dev, "nvidiactl")]}}]}),
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(format!("k8s.gpu.nvidia.com-claim_{CLAIM_E}.json"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    // Shares of GPU 0: gpufence's contract (device annotations), and HAMi's env.
    write_spec(
        dir,
        &format!("k8s.gpu.example.com-claim_{CLAIM_S}.json"),
        serde_json::json!({"cdiVersion": "0.6.0", "kind": "k8s.gpu.example.com/claim",
            "devices": [{"name": format!("{CLAIM_S}-gpu-0"),
                "annotations": {"gpufence.dev/memory": "8Gi", "gpufence.dev/cores": "50"},
                "containerEdits": {"deviceNodes": [node(dev, "nvidia0"), node(dev, "nvidiactl")]}}]}),
    );
    write_spec(
        dir,
        &format!("hami.io-claim_{CLAIM_H}.json"),
        serde_json::json!({"cdiVersion": "0.6.0", "kind": "hami.io/claim",
            "devices": [{"name": format!("{CLAIM_H}-gpu-0"), "containerEdits": {
                "env": ["CUDA_DEVICE_MEMORY_LIMIT_0=2048m", "CUDA_DEVICE_SM_LIMIT=25"],
                "deviceNodes": [node(dev, "nvidia0"), node(dev, "nvidiactl")]}}]}),
    );
}

/// kubelet's DRA state (consumable capacity on: every device carries `ShareID`): claim A for
/// `dra-pod`, B for `dra-std-pod` (both GPU 1), and shares of GPU 0: S for `share-pod` and
/// `share-greedy`, H for `hami-share-pod`.
fn dra_state(path: &Path) {
    let claim = |uid: &str,
                 name: &str,
                 pods: &[&str],
                 driver: &str,
                 device: &str,
                 share: Option<&str>,
                 ids: Vec<String>| {
        let pods: serde_json::Map<String, serde_json::Value> = pods
            .iter()
            .map(|p| (format!("{p}-uid"), serde_json::json!({})))
            .collect();
        serde_json::json!({"ClaimUID": uid, "ClaimName": name, "Namespace": "default",
            "PodUIDs": pods, "DriverState": {driver: {"Devices": [{"PoolName": "node-1",
                "DeviceName": device, "ShareID": share, "RequestNames": ["gpu"],
                "CDIDeviceIDs": ids}]}}})
    };
    let entries = vec![
        claim(
            CLAIM_A,
            "train-gpu",
            &["dra-pod", "mismatch-pod"],
            "gpu.nvidia.com",
            "gpu-1",
            None,
            vec![claim_id(CLAIM_A, 1)],
        ),
        claim(
            CLAIM_E,
            "loose-gpu",
            &["loose-pod"],
            "gpu.nvidia.com",
            "gpu-1",
            None,
            vec![claim_id(CLAIM_E, 1)],
        ),
        claim(
            CLAIM_C,
            "pair-gpu-a",
            &["pair-pod"],
            "gpu.nvidia.com",
            "gpu-2",
            None,
            vec![standard_id(2)],
        ),
        claim(
            CLAIM_D,
            "pair-gpu-b",
            &["pair-pod"],
            "gpu.nvidia.com",
            "gpu-3",
            None,
            vec![standard_id(3)],
        ),
        claim(
            CLAIM_B,
            "infer-gpu",
            &["dra-std-pod"],
            "gpu.nvidia.com",
            "gpu-1",
            None,
            vec![standard_id(1), claim_id(CLAIM_B, 1)],
        ),
        claim(
            CLAIM_S,
            "shared-gpu",
            &["share-pod", "share-greedy"],
            "gpu.example.com",
            "gpu-0",
            Some("5e000000-0000-4000-8000-000000000001"),
            vec![SHARE_ID.to_string()],
        ),
        claim(
            CLAIM_H,
            "hami-gpu",
            &["hami-share-pod"],
            "hami.io",
            "gpu-0",
            Some("5e000000-0000-4000-8000-000000000002"),
            vec![HAMI_ID.to_string()],
        ),
    ];
    let data =
        serde_json::json!({"kind": kubelet::dra::KIND, "apiVersion": kubelet::dra::API_VERSION,
        "Entries": entries})
        .to_string();
    std::fs::write(
        path,
        kubelet::dra::file_json(&data, kubelet::dra::checksum(&data)),
    )
    .unwrap();
}

/// kubelet's device-manager checkpoint: NVIDIA's device plugin gave `cdi-pod` GPU 3 as a CDI
/// device (cdi-cri) and `cdi-ann-pod` GPU 1 as a CDI annotation (cdi-annotations); a plugin
/// passing DeviceSpecs gave `devspec-pod` /dev/nvidia2.
fn checkpoint(path: &Path, dev: &Path) {
    use prost::Message as _;
    let cdi = proto::ContainerAllocateResponse {
        cdi_devices: vec![proto::CdiDevice { name: plugin_id(3) }],
        ..Default::default()
    };
    let spec = |n: &str| proto::DeviceSpec {
        container_path: format!("/dev/{n}"),
        host_path: dev.join(n).display().to_string(),
        permissions: "rw".into(),
    };
    let specs = proto::ContainerAllocateResponse {
        devices: vec![spec("nvidia2"), spec("nvidiactl")],
        ..Default::default()
    };
    // The cdi-annotations strategy: the device as an annotation kubelet puts on the container.
    let ann = proto::ContainerAllocateResponse {
        annotations: [(CDI_ANNOTATION.to_string(), plugin_id(1))].into(),
        ..Default::default()
    };
    let gpu3 = gpu_uuid(3);
    // Time-slicing: GPU 2 advertised 4 times under its own resource, one replica as a CDI device.
    let ts = proto::ContainerAllocateResponse {
        cdi_devices: vec![proto::CdiDevice { name: plugin_id(2) }],
        ..Default::default()
    };
    let replicas: Vec<String> = (0..4).map(|k| format!("{}::{k}", gpu_uuid(2))).collect();
    let entries = vec![
        kubelet::entry(
            "ts-pod-uid",
            "app",
            "nvidia.com/gpu.shared",
            &[&replicas[1]],
            ts.encode_to_vec(),
        ),
        kubelet::entry(
            "cdi-ann-pod-uid",
            "app",
            "nvidia.com/gpu",
            &[&gpu_uuid(1)],
            ann.encode_to_vec(),
        ),
        kubelet::entry(
            "cdi-pod-uid",
            "app",
            "nvidia.com/gpu",
            &[&gpu3],
            cdi.encode_to_vec(),
        ),
        kubelet::entry(
            "devspec-pod-uid",
            "app",
            "example.com/gpu",
            &["dev-2"],
            specs.encode_to_vec(),
        ),
    ];
    let registered = [
        ("nvidia.com/gpu", vec![gpu_uuid(1), gpu3]),
        ("nvidia.com/gpu.shared", replicas),
        ("example.com/gpu", vec!["dev-2".to_string()]),
    ];
    std::fs::write(
        path,
        kubelet::checkpoint_json_registered(entries, &registered),
    )
    .unwrap();
}

/// The node, its kubelet records and the drivers' CDI specs in scratch dir `s`.
struct World {
    s: PathBuf,
    node: runtime_support::Node,
    cdi: PathBuf,
    dev: PathBuf,
    checkpoint: PathBuf,
    dra: PathBuf,
}

fn world(name: &str) -> World {
    let s = common::scratch(name);
    let cp = s.join("kubelet/device-plugins/kubelet_internal_checkpoint");
    let dra = s.join("kubelet/dra_manager_state");
    let cdi = s.join("cdi");
    std::fs::create_dir_all(cp.parent().unwrap()).unwrap();
    std::fs::create_dir_all(&cdi).unwrap();
    let mut dirs = toml_edit::Array::new();
    dirs.push(cdi.display().to_string());
    let path = |p: &Path| toml_edit::value(p.display().to_string());
    let node = runtime_support::node(
        &s,
        4,
        &[
            ("kubelet.checkpoint", path(&cp)),
            ("kubelet.dra-checkpoint", path(&dra)),
            ("cdi.spec-dirs", toml_edit::value(dirs)),
        ],
    );
    let dev = node.dir.canonicalize().unwrap().join("dev");
    World {
        s,
        node,
        cdi,
        dev,
        checkpoint: cp,
        dra,
    }
}

impl World {
    /// containerd 2.3's configuration private to this world (`required`: NRI's validator's
    /// plugins), resolving CDI ids from the world's spec directory: (its directory, the file).
    fn containerd_config(&self, bin: &Path, required: &[&str]) -> (PathBuf, PathBuf) {
        let cdir = self.s.join("containerd");
        let config = cri_support::containerd_config(bin, &cdir, required);
        cri_support::set_cdi_spec_dirs(&config, &[&self.cdi]);
        (cdir, config)
    }

    /// The sandbox image, and the pods' image: as every CUDA base image, it sets
    /// NVIDIA_VISIBLE_DEVICES=all (a grant nothing backs: never believed).
    fn images(&self, c: &Containerd) {
        cri_support::import_image(&self.s, c);
        let env = [
            "PATH=/bin:/usr/bin",
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
        ];
        cri_support::import_image_named(&self.s, c, "cuda", &env);
    }

    /// What kubelet and the drivers write as pods are admitted and their claims prepared: after
    /// containerd and gpufence are up, as on a node (neither may have read them at start).
    fn records(&self) {
        cdi_specs(&self.cdi, &self.dev);
        dra_state(&self.dra);
        checkpoint(&self.checkpoint, &self.dev);
    }
}

/// One pod through the applier, on the CUDA-like image unless `extra` names another.
fn pod(
    py: &Path,
    c: &Containerd,
    w: &World,
    a: Applier,
    name: &str,
    extra: serde_json::Value,
) -> serde_json::Value {
    cri_support::applier_pod(py, &c.sock, &w.s, a, name, &probe(), extra)
}

/// Exactly the GPUs of `gpus` openable (ENXIO: a node with no driver behind it), every other
/// GPU's node absent and refused by the device cgroup when made by hand, the shim preloaded, the
/// quota of each (`memory` bytes or none, in order; `cores` percent of the first, or empty) in
/// the read-only quota file and the env.
fn assert_fenced(r: &serde_json::Value, gpus: &[(u32, Option<u64>)], cores: &str) {
    assert_eq!(r["stage"], "done", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    let f = runtime_support::facts(r["log"].as_str().unwrap());
    let indexes: Vec<u32> = gpus.iter().map(|(g, _)| *g).collect();
    cri_support::assert_only_gpus(&f, r, &indexes);
    assert_eq!(f["ctl"], "ENXIO", "{r}");
    assert_eq!(f["preload"], "/usr/lib/gpufence/libgpufence.so", "{r}");
    let shown = |m: Option<u64>| m.map(|m| m.to_string()).unwrap_or_default();
    let (g0, m0) = gpus[0];
    assert_eq!(f["quota_mem"], shown(m0), "{r}");
    assert_eq!(f["quota_uuid"], gpu_uuid(g0), "{r}");
    assert_eq!(f["env_mem"], shown(m0), "{r}");
    let (g1, m1) = gpus
        .get(1)
        .map_or((String::new(), None), |(g, m)| (gpu_uuid(*g), *m));
    assert_eq!(
        (&f["quota1_uuid"], &f["quota1_mem"]),
        (&g1, &shown(m1)),
        "{r}"
    );
    assert_eq!(f["quota_cores"], cores, "{r}");
    // The image's NVIDIA_VISIBLE_DEVICES=all never survives: the plan's GPUs, or the `void` a
    // driver's CDI spec set after it (NRI cannot replace a repeated variable; runc keeps the
    // last).
    let uuids: Vec<String> = gpus.iter().map(|(g, _)| gpu_uuid(*g)).collect();
    assert!(
        [uuids.join(","), "void".to_string()].contains(&f["env_nvd"]),
        "{r}"
    );
    assert_eq!(f["quota_write"], "DENIED", "{r}");
    assert_eq!(f["env_state"], "/run/gpufence", "{r}");
}

/// Every device-borne path, through one applier on one containerd.
fn scenarios(py: &Path, c: &Containerd, w: &World, a: Applier) {
    let cdi = |ids: &[String]| serde_json::json!({"cdi_devices": ids});
    let dev_spec = |n: &str| {
        serde_json::json!({"container_path": format!("/dev/{n}"),
            "host_path": w.dev.join(n), "permissions": "rw"})
    };

    // (a) A DRA claim narrowed to 4 GiB by gpufence's annotation.
    let mut req = cdi(&[claim_id(CLAIM_A, 1)]);
    req["pod_annotations"] = serde_json::json!({"gpufence.dev/memory": "4Gi"});
    assert_fenced(&pod(py, c, w, a, "dra-pod", req), &[(1, Some(4 << 30))], "");
    // Its standard id (nodes) with a per-claim spec of env only: the whole GPU.
    let r = pod(
        py,
        c,
        w,
        a,
        "dra-std-pod",
        cdi(&[standard_id(1), claim_id(CLAIM_B, 1)]),
    );
    assert_fenced(&r, &[(1, WHOLE)], "");

    // Two claims, one GPU each; a list of memory aligned with the devices (in index order).
    let mut req = cdi(&[standard_id(2), standard_id(3)]);
    req["pod_annotations"] = serde_json::json!({"gpufence.dev/memory": "2Gi,3Gi"});
    let r = pod(py, c, w, a, "pair-pod", req);
    assert_fenced(&r, &[(2, Some(2 << 30)), (3, Some(3 << 30))], "");
    // Another dialect naming another GPU than the claim's: refused, never merged.
    let mut req = cdi(&[claim_id(CLAIM_A, 1)]);
    req["pod_annotations"] = serde_json::json!({"gpufence.dev/devices": "0"});
    let r = pod(py, c, w, a, "mismatch-pod", req);
    assert_refused(&r, &["gpufence.dev/devices=\"0\"", "differ"]);

    // (b) NVIDIA's device plugin, CDI strategy: GPU 3 whole.
    assert_fenced(
        &pod(py, c, w, a, "cdi-pod", cdi(&[plugin_id(3)])),
        &[(3, WHOLE)],
        "",
    );

    // The same plugin's cdi-annotations strategy: the annotation on the container, which
    // containerd resolves as it does CDIDevices.
    let req = serde_json::json!({"container_annotations": {CDI_ANNOTATION: plugin_id(1)}});
    assert_fenced(&pod(py, c, w, a, "cdi-ann-pod", req), &[(1, WHOLE)], "");

    // The same with time-slicing: one replica of GPU 2's four, a quarter of it.
    let quarter = (gpufence::sim::GPU_MEMORY_MIB << 20) / 4;
    let r = pod(py, c, w, a, "ts-pod", cdi(&[plugin_id(2)]));
    assert_fenced(&r, &[(2, Some(quarter))], "25");

    // (c) DeviceSpecs: GPU 2 whole.
    let req = serde_json::json!({"devices": [dev_spec("nvidia2"), dev_spec("nvidiactl")]});
    assert_fenced(&pod(py, c, w, a, "devspec-pod", req), &[(2, WHOLE)], "");

    // (d) A CRI device nothing recorded, and another pod's claim: refused in one line.
    let req = serde_json::json!({"devices": [dev_spec("nvidia0")]});
    let r = pod(py, c, w, a, "rogue-pod", req);
    let gpu0 = format!("GPU 0 ({})", gpu_uuid(0));
    assert_refused(
        &r,
        &[
            "linux.devices=\"/dev/nvidia0\"",
            &gpu0,
            "is not among what kubelet recorded for container app of pod default/rogue-pod",
            "kubelet recorded: nothing",
        ],
    );
    let r = pod(py, c, w, a, "thief-pod", cdi(&[claim_id(CLAIM_A, 1)]));
    let gpu1 = format!("GPU 1 ({})", gpu_uuid(1));
    assert_refused(
        &r,
        &[
            "linux.devices=\"/dev/nvidia1,/dev/nvidiactl\"",
            &gpu1,
            "pod default/thief-pod",
            "kubelet recorded: nothing",
        ],
    );

    // A claim whose spec any user could have written: gpufence does not read it (containerd
    // does), so the claim backs nothing and the line says why; the log names the file.
    let r = pod(py, c, w, a, "loose-pod", cdi(&[claim_id(CLAIM_E, 1)]));
    let recorded = format!(
        "kubelet recorded: DRA claim default/loose-gpu [{}: in no CDI spec read from \
         cdi.spec-dirs]",
        claim_id(CLAIM_E, 1)
    );
    assert_refused(&r, &[&gpu1, "pod default/loose-pod", &recorded]);
    let log = std::fs::read_to_string(&w.node.log).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains(&format!("claim_{CLAIM_E}.json"))
                && l.contains("writable by its group or everyone (mode 666): not read")),
        "{log}"
    );
    // A control node alone, nothing recorded.
    let req = serde_json::json!({"devices": [dev_spec("nvidiactl")]});
    let r = pod(py, c, w, a, "ctl-pod", req);
    assert_refused(
        &r,
        &["linux.devices=\"/dev/nvidiactl\": device /dev/nvidiactl (c 195:255) is not among"],
    );

    // (e) Shares of GPU 0: each pod held to its own; asking more than the share is refused,
    // asking less narrows it.
    assert_fenced(
        &pod(py, c, w, a, "share-pod", cdi(&[SHARE_ID.into()])),
        &[(0, Some(8 << 30))],
        "50",
    );
    let mut req = cdi(&[SHARE_ID.into()]);
    req["pod_annotations"] = serde_json::json!({"gpufence.dev/memory": "16Gi"});
    assert_refused(
        &pod(py, c, w, a, "share-greedy", req),
        &["gpufence.dev/memory=\"16Gi\"", "8 GiB"],
    );
    let mut req = cdi(&[HAMI_ID.into()]);
    req["pod_annotations"] = serde_json::json!({"gpufence.dev/memory": "1Gi"});
    assert_fenced(
        &pod(py, c, w, a, "hami-share-pod", req),
        &[(0, Some(1 << 30))],
        "25",
    );
}

#[test]
fn device_borne_grants_through_the_runtime_handler() {
    let Some((bin, py)) = cri_support::prerequisites() else {
        return;
    };
    let w = world("devices-handler");
    let (cdir, config) = w.containerd_config(&bin, &[]);
    // The engine's CDI directories and gpufence's agree: configure says nothing about them.
    let out = cri_support::configure_handler(&w.node.config, &config, &w.s.join("records"));
    assert!(!out.contains("CDI directories disagree"), "{out}");
    let c = cri_support::start_containerd(
        Some(&bin),
        &config,
        &cdir,
        &[("GPUFENCE_CONFIG", &w.node.config)],
    );
    w.images(&c);
    w.records();
    scenarios(&py, &c, &w, Applier::Handler);
    drop(c);
    assert!(cri_support::state_dirs(&w.node.state_dir).is_empty());
}

#[test]
fn device_borne_grants_through_nri() {
    let Some((bin, py)) = cri_support::prerequisites() else {
        return;
    };
    let w = world("devices-nri");
    let (cdir, config) = w.containerd_config(&bin, &["gpufence"]);
    let c = cri_support::start_containerd23(&bin, &cdir, &config);
    w.images(&c);
    let plugin = cri_support::spawn_nri(
        &w.node.config,
        &cdir.join("nri.sock"),
        &w.s.join("nri.stderr"),
    );
    cri_support::wait_registered(&w.node.log, 1);
    w.records();
    scenarios(&py, &c, &w, Applier::Nri);
    drop(plugin);
    assert!(cri_support::state_dirs(&w.node.state_dir).is_empty());
}
