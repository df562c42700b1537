//! The sharing schedulers of issue 34 end to end through CRI on containerd 2.3.4 + runc 1.5.1,
//! for both appliers — the `gpufence` runtime handler and `gpufence nri` — one containerd each,
//! on a simulated node of 4 GPUs with MIG on GPU 2 (seven 1g.10gb instances, GPU instances
//! 7–13). kubelet's device-manager checkpoint is a file the node's config points at. Pods (UID
//! `<name>-uid`, container `app`) run a CUDA-like image (`NVIDIA_VISIBLE_DEVICES=all`):
//!
//! * Volcano: `volcano.sh/vgpu-ids-new` describing two containers, kubelet's record of Volcano's
//!   device plugin (`volcano.sh/vgpu-number`: GPU 1, `3000m`, 30 %) for this one → exactly GPU 1
//!   with 3000 MiB and 30 %; an annotation naming another GPU than kubelet recorded → refused;
//! * HAMi v2.10 dynamic MIG: `hami.io/vgpu-devices-allocated` naming GPU 2 and
//!   `hami.io/vgpu-mig-allocations` reserving MIG device 2:3 (with the device plugin's runtime
//!   identity, or before it, resolved through kubelet's record of the MIG UUID) → exactly that MIG
//!   device: its two caps, its UUID visible and in the quota, no other GPU; a reservation naming
//!   another MIG device than kubelet recorded → refused;
//! * Koordinator: `scheduling.koordinator.sh/device-allocated` for minor 1 with 8Gi and
//!   gpu-core 50, no kubelet record: under `trust-annotations = "kubelet"` (a pod writing the
//!   annotation itself) refused in one line naming the mode Koordinator needs; under
//!   `"admission"` exactly GPU 1 with 8 GiB and 50 %, also beside what koordlet adds
//!   (`NVIDIA_VISIBLE_DEVICES=1`, the unindexed HAMi-core limits, `LD_PRELOAD` of libvgpu.so —
//!   passed here as the container's env, where koordlet's NRI plugin would put it): the preload is
//!   gone, gpufence's shim is in `/etc/ld.so.preload`; koordlet's env naming another GPU → refused;
//!   through `gpufence nri` with NRI's validation beside a stand-in for koordlet's NRI plugin:
//!   its `NVIDIA_VISIBLE_DEVICES=1` kept and validated, and its HAMi-core injection (the pod's
//!   label `koordinator.sh/gpu-isolation-provider=HAMi-core`) refused at creation in one line
//!   naming that label.
//!
//! The trust mode is switched by rewriting the node's config: the handler reads it per
//! container, `gpufence nri` is restarted on it.

mod common;
mod cri_support;
mod runtime_support;

use std::path::{Path, PathBuf};

use std::sync::Arc;

use cri_support::{Applier, Containerd, assert_refused};
use gpufence::kubelet;
use gpufence::nri::{Gone, Handler, Plugin, PluginConfig, Transport, api};
use gpufence::sim::{gpu_uuid, mig_uuid};

const KOORDINATOR: &str = "scheduling.koordinator.sh/device-allocated";
const VOLCANO: &str = "volcano.sh/vgpu-ids-new";
const HAMI: &str = "hami.io/vgpu-devices-allocated";
const HAMI_MIG: &str = "hami.io/vgpu-mig-allocations";
/// The pod label for which koordlet injects HAMi-core.
const HAMI_CORE_LABEL: (&str, &str) = ("koordinator.sh/gpu-isolation-provider", "HAMi-core");
/// The MIG device HAMi's device plugin created for the MIG pods (GPU 2, instance 3: GI 10).
const MIG_J: u32 = 3;

/// Facts beyond runtime_support's PROBE: GPUs made by hand, the quota's cores, the MIG caps
/// in the container, the env koordlet's HAMi-core injection would use.
const PROBE_MORE: &str = r#"
echo "quota_cores=$(grep '^device.0.cores=' /run/gpufence/quota 2>/dev/null | cut -d= -f2)"
echo "caps=$(ls /dev/nvidia-caps 2>/dev/null | sort | tr '\n' ' ')"
echo "env_ld_preload=$LD_PRELOAD"
echo "env_cuda_mem=$CUDA_DEVICE_MEMORY_LIMIT"
"#;

fn probe() -> String {
    format!(
        "{}{}{PROBE_MORE}",
        runtime_support::PROBE,
        cri_support::PROBE_MKNOD
    )
}

/// The node and its kubelet checkpoint in scratch dir `s`.
struct World {
    s: PathBuf,
    node: runtime_support::Node,
    checkpoint: PathBuf,
}

fn world(name: &str) -> World {
    let s = common::scratch(name);
    let cp = s.join("kubelet/device-plugins/kubelet_internal_checkpoint");
    std::fs::create_dir_all(cp.parent().unwrap()).unwrap();
    let node = runtime_support::node_mig(
        &s,
        4,
        Some(2),
        &[(
            "kubelet.checkpoint",
            toml_edit::value(cp.display().to_string()),
        )],
    );
    World {
        s,
        node,
        checkpoint: cp,
    }
}

impl World {
    fn images(&self, c: &Containerd) {
        cri_support::import_image(&self.s, c);
        let env = ["PATH=/bin:/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"];
        cri_support::import_image_named(&self.s, c, "cuda", &env);
    }

    /// kubelet's record: Volcano's device plugin gave `volcano-pod` (and `volcano-forged`) GPU
    /// 1 with 3000 MiB and 30 %; HAMi's device plugin in MIG mode gave the MIG pods MIG 2:3.
    fn records(&self) {
        let volcano = |pod: &str| {
            kubelet::entry(
                &format!("{pod}-uid"),
                "app",
                "volcano.sh/vgpu-number",
                &[&format!("{}-0", gpu_uuid(1))],
                kubelet::encode_alloc_resp(
                    &[
                        ("NVIDIA_VISIBLE_DEVICES", gpu_uuid(1).as_str()),
                        ("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m"),
                        ("CUDA_DEVICE_SM_LIMIT", "30"),
                    ],
                    &[],
                ),
            )
        };
        let mig = |pod: &str| {
            kubelet::entry(
                &format!("{pod}-uid"),
                "app",
                "nvidia.com/gpu",
                &[&format!("{}-0", gpu_uuid(2))],
                kubelet::encode_alloc_resp(
                    &[("NVIDIA_VISIBLE_DEVICES", mig_uuid(2, MIG_J).as_str())],
                    &[],
                ),
            )
        };
        let entries = vec![
            volcano("volcano-pod"),
            volcano("volcano-forged"),
            mig("mig-pod"),
            mig("mig-early-pod"),
            mig("mig-other-pod"),
        ];
        std::fs::write(&self.checkpoint, kubelet::checkpoint_json(entries)).unwrap();
    }

    /// The node's config with `allocation.trust-annotations` set to `mode` (TOML text).
    fn trust(&self, mode: &str) {
        let text = std::fs::read_to_string(&self.node.config).unwrap();
        let mut doc: toml_edit::DocumentMut = text.parse().unwrap();
        doc["allocation"]["trust-annotations"] = toml_edit::value(mode);
        std::fs::write(&self.node.config, doc.to_string()).unwrap();
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

fn annotated(pairs: &[(&str, &str)]) -> serde_json::Value {
    let map: serde_json::Map<String, serde_json::Value> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    serde_json::json!({"pod_annotations": map})
}

/// Ran, with exactly GPU `gpu`'s node openable (every other absent, EPERM when made by hand),
/// the shim preloaded, `uuid` in the quota with `memory` bytes and `cores` percent,
/// `NVIDIA_VISIBLE_DEVICES` = `nvd`.
fn assert_fenced(
    r: &serde_json::Value,
    gpu: u32,
    (uuid, nvd): (&str, &str),
    memory: &str,
    cores: &str,
) {
    assert_eq!(r["stage"], "done", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    let f = runtime_support::facts(r["log"].as_str().unwrap());
    cri_support::assert_only_gpus(&f, r, &[gpu]);
    assert_eq!(f["preload"], "/usr/lib/gpufence/libgpufence.so", "{r}");
    assert_eq!(f["quota_uuid"], uuid, "{r}");
    assert_eq!(f["env_nvd"], nvd, "{r}");
    assert_eq!(f["quota_mem"], memory, "{r}");
    assert_eq!(f["quota_cores"], cores, "{r}");
    assert!(!f["env_ld_preload"].contains("libvgpu"), "{r}");
}

/// HAMi v2.10's reservation of container 0's device 0 on GPU 2: MIG 2:`j` (GI 7 + j) with the
/// device plugin's runtime identity, or without it.
fn reservation(j: u32, runtime: bool) -> String {
    let rt = if runtime {
        format!(
            r#","migUUID":"{}","gpuInstanceID":{},"computeInstanceID":0"#,
            mig_uuid(2, j),
            7 + j
        )
    } else {
        String::new()
    };
    format!(
        r#"[{{"containerIndex":0,"deviceIndex":0,"gpuUUID":"{}","profile":"1g.10gb","placement":{{"start":{j},"size":1}}{rt}}}]"#,
        gpu_uuid(2)
    )
}

/// Volcano and HAMi's MIG pods: what kubelet records (trust-annotations = "kubelet").
fn recorded_scenarios(py: &Path, c: &Containerd, w: &World, a: Applier) {
    // Volcano: two containers in the annotation; kubelet's record picks this one's.
    let v = format!(
        "{},NVIDIA,3000,30:;{},NVIDIA,5000,0:;",
        gpu_uuid(1),
        gpu_uuid(3)
    );
    let r = pod(py, c, w, a, "volcano-pod", annotated(&[(VOLCANO, &v)]));
    let g1 = gpu_uuid(1);
    assert_fenced(&r, 1, (&g1, &g1), &(3000u64 << 20).to_string(), "30");
    let forged = format!("{},NVIDIA,3000,30:;", gpu_uuid(0));
    let r = pod(
        py,
        c,
        w,
        a,
        "volcano-forged",
        annotated(&[(VOLCANO, &forged)]),
    );
    assert_refused(&r, &[VOLCANO]);

    // HAMi's dynamic MIG: exactly MIG 2:3 — its caps, its UUID, GPU 2's node, no other GPU.
    let hami = format!("{},NVIDIA,9984,0:;", gpu_uuid(2));
    let mig = mig_uuid(2, MIG_J);
    let mut caps_seen = String::new();
    for (name, runtime) in [("mig-pod", true), ("mig-early-pod", false)] {
        let res = reservation(MIG_J, runtime);
        let r = pod(
            py,
            c,
            w,
            a,
            name,
            annotated(&[(HAMI, &hami), (HAMI_MIG, &res)]),
        );
        assert_fenced(&r, 2, (&mig, &mig), "", "");
        let f = runtime_support::facts(r["log"].as_str().unwrap());
        // The MIG device's GPU-instance and compute-instance access caps, nothing else.
        assert_eq!(f["caps"].split_whitespace().count(), 2, "{r}");
        if caps_seen.is_empty() {
            caps_seen = f["caps"].clone();
        }
        assert_eq!(f["caps"], caps_seen, "{r}");
    }
    let res = reservation(MIG_J + 1, true);
    let r = pod(
        py,
        c,
        w,
        a,
        "mig-other-pod",
        annotated(&[(HAMI, &hami), (HAMI_MIG, &res)]),
    );
    assert_refused(&r, &[HAMI_MIG, &mig_uuid(2, MIG_J + 1), "devices differ"]);
}

/// Koordinator's annotation for GPU minor 1: 8Gi of it and half its compute.
fn koord_value() -> String {
    r#"{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":50,"koordinator.sh/gpu-memory-ratio":10,"koordinator.sh/gpu-memory":"8Gi"}}],"rdma":[{"minor":0,"id":"0000:09:00.0","resources":{"koordinator.sh/rdma":100}}]}"#.to_string()
}

/// What koordlet's NRI plugin adds for a `koordinator.sh/gpu-isolation-provider: HAMi-core` pod.
fn koordlet_env(minor: &str) -> serde_json::Value {
    serde_json::json!({
        "NVIDIA_VISIBLE_DEVICES": minor,
        "CUDA_DEVICE_MEMORY_LIMIT": (8u64 << 30).to_string(),
        "CUDA_DEVICE_SM_LIMIT": "50",
        "LD_PRELOAD": "/usr/local/vgpu/libvgpu.so",
    })
}

/// A Koordinator pod written by its own author: nothing backs it under "kubelet".
fn koordinator_forged(py: &Path, c: &Containerd, w: &World, a: Applier) {
    let r = pod(
        py,
        c,
        w,
        a,
        "koord-forged",
        annotated(&[(KOORDINATOR, &koord_value())]),
    );
    assert_refused(
        &r,
        &[
            KOORDINATOR,
            "Koordinator needs allocation.trust-annotations = \"admission\"",
        ],
    );
}

/// Koordinator's pods under "admission".
fn koordinator_admitted(py: &Path, c: &Containerd, w: &World, a: Applier) {
    let eight = (8u64 << 30).to_string();
    let g1 = gpu_uuid(1);
    let v = koord_value();
    let r = pod(py, c, w, a, "koord-pod", annotated(&[(KOORDINATOR, &v)]));
    assert_fenced(&r, 1, (&g1, &g1), &eight, "50");
    // With koordlet's env. Through NRI the pod's image sets no NVIDIA_VISIBLE_DEVICES: koordlet's
    // NRI plugin replaces the image's, but here the env arrives through CRI, beside the image's,
    // and NRI cannot replace a repeated variable (gpufence nri refuses it).
    let mut req = annotated(&[(KOORDINATOR, &v)]);
    req["envs"] = koordlet_env("1");
    if a == Applier::Nri {
        req["image"] = "localhost/pause:test".into();
    }
    let r = pod(py, c, w, a, "koord-hami-core-pod", req);
    // The handler rewrites it to the UUIDs; gpufence nri leaves koordlet's agreeing minors.
    let nvd = if a == Applier::Nri { "1" } else { g1.as_str() };
    assert_fenced(&r, 1, (&g1, nvd), &eight, "50");
    let mut req = annotated(&[(KOORDINATOR, &v)]);
    req["envs"] = koordlet_env("0");
    req["image"] = "localhost/pause:test".into();
    let r = pod(py, c, w, a, "koord-disagree-pod", req);
    assert_refused(&r, &["NVIDIA_VISIBLE_DEVICES=\"0\"", KOORDINATOR]);
}

/// The world `name` and a containerd 2.3 configuration private to it (`required`: NRI's
/// validator's plugins): (engines, python, world, containerd's directory, its config).
/// A stand-in for koordlet's NRI plugin (index 00, its `GPUEnvInject` hook): for a pod with
/// Koordinator's annotation it sets `NVIDIA_VISIBLE_DEVICES=<minors>`, and where the pod carries
/// the label `koordinator.sh/gpu-isolation-provider: HAMi-core` also the unindexed HAMi-core
/// limits and the `LD_PRELOAD` of libvgpu.so, as `pkg/koordlet/runtimehooks/hooks/gpu/gpu.go`
/// does.
struct Koordlet;

impl Handler for Koordlet {
    fn create_container(
        &self,
        pod: &api::PodSandbox,
        _ctr: &api::Container,
    ) -> Result<api::ContainerAdjustment, String> {
        let Some(v) = pod.annotations.get(KOORDINATOR) else {
            return Ok(Default::default());
        };
        let gpus = gpufence::allocation::koordinator::parse(v)?;
        let Some(first) = gpus.first() else {
            return Ok(Default::default());
        };
        let minors: Vec<String> = gpus.iter().map(|g| g.minor.to_string()).collect();
        let kv = |k: &str, v: String| api::KeyValue {
            key: k.into(),
            value: v,
        };
        let mut env = vec![kv("NVIDIA_VISIBLE_DEVICES", minors.join(","))];
        if pod.labels.get(HAMI_CORE_LABEL.0).map(String::as_str) == Some(HAMI_CORE_LABEL.1) {
            env.push(kv(
                "CUDA_DEVICE_MEMORY_LIMIT",
                first.memory.unwrap_or_default().to_string(),
            ));
            env.push(kv(
                "CUDA_DEVICE_SM_LIMIT",
                first.core.unwrap_or_default().to_string(),
            ));
            env.push(kv("LD_PRELOAD", "/usr/local/vgpu/libvgpu.so".into()));
        }
        Ok(api::ContainerAdjustment {
            env,
            ..Default::default()
        })
    }
    fn container_gone(&self, _id: &str, _why: Gone) {}
}

/// Koordinator's pods through `gpufence nri` beside koordlet's plugin (under "admission").
fn koordinator_beside_koordlet(py: &Path, c: &Containerd, w: &World) {
    let v = koord_value();
    // koordlet's NVIDIA_VISIBLE_DEVICES agrees with the plan: kept as koordlet set it (NRI would
    // refuse gpufence setting it again), the GPU fenced with its quota.
    let r = pod(
        py,
        c,
        w,
        Applier::Nri,
        "koord-nri-pod",
        annotated(&[(KOORDINATOR, &v)]),
    );
    assert_fenced(&r, 1, (&gpu_uuid(1), "1"), &(8u64 << 30).to_string(), "50");
    // Validated: containerd 2.3 asked gpufence nri about the merged adjustment, koordlet's
    // variable included, and it passed.
    let log = std::fs::read_to_string(&w.node.log).unwrap_or_default();
    assert!(
        log.lines()
            .any(|l| l.contains("merged adjustment validated") && l.contains("koord-nri-pod")),
        "no validation of koord-nri-pod in {}",
        w.node.log.display()
    );
    // koordlet's HAMi-core injection: its LD_PRELOAD is another plugin's variable, which
    // gpufence cannot take back: refused at creation, naming the Koordinator setting to turn off.
    let mut req = annotated(&[(KOORDINATOR, &v)]);
    req["pod_labels"] = serde_json::json!({HAMI_CORE_LABEL.0: HAMI_CORE_LABEL.1});
    let r = pod(py, c, w, Applier::Nri, "koord-nri-hami-core-pod", req);
    assert_refused(
        &r,
        &[
            "LD_PRELOAD=/usr/local/vgpu/libvgpu.so (HAMi-core), which gpufence replaces",
            "remove its label koordinator.sh/gpu-isolation-provider=HAMi-core",
        ],
    );
    assert!(
        !r["error"]
            .as_str()
            .unwrap_or_default()
            .contains("both tried to set"),
        "{r}"
    );
}

fn setup(name: &str, required: &[&str]) -> Option<(PathBuf, PathBuf, World, PathBuf, PathBuf)> {
    let (bin, py) = cri_support::prerequisites()?;
    let w = world(name);
    let cdir = w.s.join("containerd");
    let config = cri_support::containerd_config(&bin, &cdir, required);
    Some((bin, py, w, cdir, config))
}

#[test]
fn sharing_schedulers_through_the_runtime_handler() {
    let Some((bin, py, w, cdir, config)) = setup("sched-handler", &[]) else {
        return;
    };
    cri_support::configure_handler(&w.node.config, &config, &w.s.join("records"));
    let c = cri_support::start_containerd(
        Some(&bin),
        &config,
        &cdir,
        &[("GPUFENCE_CONFIG", &w.node.config)],
    );
    w.images(&c);
    w.records();
    recorded_scenarios(&py, &c, &w, Applier::Handler);
    koordinator_forged(&py, &c, &w, Applier::Handler);
    w.trust("admission");
    koordinator_admitted(&py, &c, &w, Applier::Handler);
    drop(c);
    assert!(cri_support::state_dirs(&w.node.state_dir).is_empty());
}

#[test]
fn sharing_schedulers_through_nri() {
    let Some((bin, py, w, cdir, config)) = setup("sched-nri", &["gpufence"]) else {
        return;
    };
    let c = cri_support::start_containerd23(&bin, &cdir, &config);
    w.images(&c);
    let nri = |n: usize| {
        let p = cri_support::spawn_nri(
            &w.node.config,
            &cdir.join("nri.sock"),
            &w.s.join(format!("nri-{n}.stderr")),
        );
        cri_support::wait_registered(&w.node.log, n);
        p
    };
    let plugin = nri(1);
    w.records();
    recorded_scenarios(&py, &c, &w, Applier::Nri);
    koordinator_forged(&py, &c, &w, Applier::Nri);
    drop(plugin);
    w.trust("admission");
    let plugin = nri(2);
    koordinator_admitted(&py, &c, &w, Applier::Nri);
    let koordlet = Plugin::new(
        PluginConfig {
            transport: Transport::Socket(cdir.join("nri.sock")),
            name: "koordlet".into(),
            index: "00".into(),
        },
        Arc::new(Koordlet),
    )
    .unwrap();
    let stop = koordlet.stopper();
    let t = std::thread::spawn(move || koordlet.run().unwrap());
    // Wait until containerd says it is connected and synchronized.
    let log = cdir.join("containerd.log");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("00-koordlet") && l.contains("connected and synchronized"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "koordlet's plugin did not register"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    koordinator_beside_koordlet(&py, &c, &w);
    stop.stop();
    t.join().unwrap();
    drop(plugin);
    assert!(cri_support::state_dirs(&w.node.state_dir).is_empty());
}
