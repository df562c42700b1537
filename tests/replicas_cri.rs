//! Time-slicing replicas end to end through containerd's CRI: kubelet's device-manager checkpoint,
//! written in the NVIDIA device plugin's real format (GPU 1 of the simulated node advertised 4
//! times as `GPU-…::0`…`::3`, every GPU's replicas under `RegisteredDevices`), records two pods
//! each holding one replica of GPU 1; the pods get what the plugin's Allocate returned
//! (`NVIDIA_VISIBLE_DEVICES=<uuid>`) as kubelet passes it, and nothing else: no annotation.
//! Each runs the CUDA test client (tests/fixtures/cuda_client.c) on the mock driver under
//! libgpufence.so and is held to a quarter of the GPU's memory (an allocation beyond it refused,
//! `cuMemGetInfo` showing the quarter) and a quarter of its compute, `burst` by default: alone
//! it uses the idle GPU, together each is back to its share. The split is printed (run with
//! `--nocapture`) for docs/sharing.md.
//!
//! containerd 1.6 (Debian) with the `gpufence` runtime handler written by `gpufence runtime
//! configure`; `gpufence-runtime` then runs runc 1.5.1 from shared/engines/bin where it is found
//! (`common::runc`; Debian's runc 1.1.5 lacks fixes for known container escapes). Needs
//! root, containerd, ctr, runc, umoci, gcc and target/venv (`make deps`).

mod common;
mod cri_support;
#[path = "fixtures/cuda_harness.rs"]
mod harness;
mod runtime_support;

use std::path::Path;

use cri_support::{Containerd, client, import_image, import_rootfs, operator_config};
use runtime_support::node;

const CLIENT: &str = "/usr/local/bin/cuda_client proc";
/// The simulated GPU's memory (`gpufence-sim node`'s default) and a quarter of it.
const GPU_MIB: u64 = 81559;
const QUARTER: u64 = (GPU_MIB << 20) / 4;

/// containerd 1.6 with the gpufence handler configured, finding gpufence's config `config`.
fn containerd(s: &Path, config: &Path) -> Containerd {
    let cdir = s.join("containerd");
    std::fs::create_dir_all(cdir.join("cni/net.d")).unwrap();
    let main = cdir.join("config.toml");
    std::fs::write(&main, operator_config(&cdir)).unwrap();
    // The real runtime checked is the node's runtime.path (common::runc: runc 1.5.1).
    cri_support::configure_handler(config, &main, &s.join("records"));
    // Debian's containerd 1.6 with its own shim; runc is named by BinaryName.
    cri_support::start_containerd(None, &main, &cdir, &[("GPUFENCE_CONFIG", config)])
}

/// The checkpoint: 4 GPUs × 4 replicas registered as `nvidia.com/gpu`; `ts-a` and `ts-b` (pod
/// UIDs `<name>-uid`, container `app`, as tests/cri/cri_client.py creates them) hold replicas 0
/// and 2 of GPU 1.
fn checkpoint() -> String {
    use gpufence::kubelet;
    let gpu1 = gpufence::sim::gpu_uuid(1);
    let registered: Vec<String> = (0..4)
        .flat_map(|g| (0..4).map(move |k| format!("{}::{k}", gpufence::sim::gpu_uuid(g))))
        .collect();
    let entry = |pod: &str, k: u32| {
        kubelet::entry(
            &format!("{pod}-uid"),
            "app",
            "nvidia.com/gpu",
            &[&format!("{gpu1}::{k}")],
            kubelet::encode_alloc_resp(&[("NVIDIA_VISIBLE_DEVICES", gpu1.as_str())], &[]),
        )
    };
    kubelet::checkpoint_json_registered(
        vec![entry("ts-a", 0), entry("ts-b", 2)],
        &[("nvidia.com/gpu", registered)],
    )
}

/// Run the pods at once (each after its delay); their answers in order.
fn together(
    py: &Path,
    c: &Containerd,
    s: &Path,
    pods: &[(&str, &str, serde_json::Value, u64)],
) -> Vec<serde_json::Value> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = pods
            .iter()
            .map(|(name, script, ann, delay)| {
                sc.spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(*delay));
                    // The client appends to the pod's log; a pod name is reused (its UID is
                    // what kubelet's record names).
                    let _ = std::fs::remove_dir_all(s.join("pod-logs").join(name));
                    let gpu1 = gpufence::sim::gpu_uuid(1);
                    let req = serde_json::json!({
                        "socket": c.sock, "handler": "gpufence", "dir": s, "name": name,
                        "pod_annotations": ann, "image": "localhost/cuda:test",
                        "command": ["/bin/sh", "-c", script], "timeout": 90,
                        "envs": {"NVIDIA_VISIBLE_DEVICES": gpu1},
                    });
                    let r = client(py, &req);
                    assert_eq!(r["stage"], "done", "{r}");
                    assert_eq!(r["exit_code"], 0, "{r}");
                    r
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn log(r: &serde_json::Value) -> &str {
    r["log"].as_str().unwrap()
}

/// The measured share (percent of the GPU's time) of the `spin` line.
fn spin(r: &serde_json::Value) -> f64 {
    let l = harness::lines(log(r), "spin");
    assert_eq!(l.len(), 1, "{r}");
    l[0].split_whitespace().nth(5).unwrap().parse().unwrap()
}

fn near(got: f64, want: f64, tol: f64, what: &str) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: {got:.1} % of the GPU, expected {want} ± {tol}"
    );
}

#[test]
fn two_replica_pods_each_get_a_quarter_of_gpu_1() {
    if common::skip_unless(&["containerd", "ctr", "umoci", "tar", "gcc"]) {
        return;
    }
    let Some(py) = cri_support::python() else {
        return;
    };
    let s = common::scratch("replicas-cri");
    let cp = s.join("kubelet/device-plugins/kubelet_internal_checkpoint");
    std::fs::create_dir_all(cp.parent().unwrap()).unwrap();
    std::fs::write(&cp, checkpoint()).unwrap();
    // runtime.path: the engines' runc 1.5.1 where present (common::runc).
    let runc = common::runc();
    let n = node(
        &s,
        4,
        &[(
            "kubelet.checkpoint",
            toml_edit::value(cp.display().to_string()),
        )],
    );
    let c = containerd(&s, &n.config);
    import_image(&s, &c);
    // The image: glibc, the CUDA client; the driver (the mock) comes from the plan.
    let rootfs = common::glibc_rootfs(&s.join("image-src-cuda"));
    let bin = rootfs.join("usr/local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(&harness::clients().0, bin.join("cuda_client")).unwrap();
    import_rootfs(&s, &c, "cuda", &rootfs, &["PATH=/bin:/usr/bin"]);

    // Memory: each pod sees a quarter, cannot allocate beyond it, and can fill up to it.
    let mem = format!(
        "echo policy=$GPUFENCE_CORES_POLICY; grep -E 'memory|cores' /run/gpufence/quota; \
         {CLIENT} info alloc {} free fill {} free",
        QUARTER + 1,
        256u64 << 20
    );
    let none = serde_json::json!({});
    let rs = together(
        &py,
        &c,
        &s,
        &[
            ("ts-a", &mem, none.clone(), 0),
            ("ts-b", &mem, none.clone(), 0),
        ],
    );
    for r in &rs {
        let out = log(r);
        assert!(out.contains("policy=burst"), "{out}");
        assert!(out.contains(&format!("device.0.memory={QUARTER}")), "{out}");
        assert!(out.contains("device.0.cores=25"), "{out}");
        assert_eq!(harness::field(out, "info")[1], QUARTER.to_string(), "{out}");
        assert!(
            harness::lines(out, "alloc")[0].contains(" err "),
            "allocation beyond the quarter: {out}"
        );
        let filled = harness::num(out, "fill");
        assert!(filled <= QUARTER && filled + (256 << 20) > QUARTER, "{out}");
        println!(
            "replicas-e2e memory: pod {} quota {QUARTER} B ({:.2} GiB of {:.2} GiB), \
             cuMemGetInfo total {}, alloc {} B refused, filled {filled} B",
            r["sandbox_id"]
                .as_str()
                .unwrap_or("?")
                .chars()
                .take(12)
                .collect::<String>(),
            QUARTER as f64 / (1u64 << 30) as f64,
            (GPU_MIB << 20) as f64 / (1u64 << 30) as f64,
            harness::field(out, "info")[1],
            QUARTER + 1,
        );
    }

    // Compute, alone: burst uses the idle GPU; `gpufence.dev/cores-policy: hard` (an annotation
    // may lower the share) holds it to 25 %.
    let spin4 = format!("{CLIENT} spin 1000 4 1.5 plain");
    let hard = serde_json::json!({"gpufence.dev/cores-policy": "hard"});
    let alone = spin(&together(&py, &c, &s, &[("ts-a", &spin4, none.clone(), 0)])[0]);
    let alone_hard = spin(&together(&py, &c, &s, &[("ts-a", &spin4, hard, 0)])[0]);
    // Together: each back to its share. Meanwhile `gpufence ps` and the exporter show it.
    let (both, table, metrics) = std::thread::scope(|sc| {
        let pods = [
            ("ts-a", spin4.as_str(), none.clone(), 0),
            ("ts-b", spin4.as_str(), none, 0),
        ];
        let (py, c, s) = (&py, &c, &s);
        let h = sc.spawn(move || together(py, c, s, &pods));
        std::thread::sleep(std::time::Duration::from_millis(3000));
        let list = gpufence::status::read::snapshot(&n.state_dir).unwrap();
        let table = gpufence::status::ps::table(&list);
        #[cfg(feature = "exporter")]
        let metrics = gpufence::status::exporter::scrape(&n.state_dir).unwrap();
        #[cfg(not(feature = "exporter"))]
        let metrics = String::new();
        (h.join().unwrap(), table, metrics)
    });
    println!("{table}");
    for pod in ["ts-a", "ts-b"] {
        let row = table
            .lines()
            .find(|l| l.contains(pod))
            .unwrap_or_else(|| panic!("{table}"));
        assert!(row.contains(" 1/4 ") && row.contains("19.9 GiB"), "{table}");
        if cfg!(feature = "exporter") {
            for (family, v) in [("replicas", 1), ("replicas_registered", 4)] {
                let series = metrics.lines().find(|l| {
                    l.starts_with(&format!("gpufence_container_gpu_{family}{{"))
                        && l.contains(&format!("pod=\"{pod}\""))
                });
                assert!(
                    series.is_some_and(|l| l.ends_with(&format!(" {v}"))),
                    "{metrics}"
                );
            }
        }
    }
    let (a, b) = (spin(&both[0]), spin(&both[1]));
    println!(
        "replicas-e2e compute (runc {}): alone burst {alone:.1} %, alone hard {alone_hard:.1} %, \
         together {a:.1} % + {b:.1} %",
        runc.display()
    );
    assert!(alone >= 60.0, "alone, burst: {alone:.1} %");
    near(alone_hard, 25.0, 5.0, "alone, hard");
    near(a, 25.0, 6.0, "together, pod a");
    near(b, 25.0, 6.0, "together, pod b");

    // A third pod that kubelet gave no replica: no GPU at all.
    let r = &together(
        &py,
        &c,
        &s,
        &[(
            "ts-c",
            "ls /dev/nvidia1 2>&1; echo nvd=$NVIDIA_VISIBLE_DEVICES",
            serde_json::json!({}),
            0,
        )],
    )[0];
    assert!(log(r).contains("nvd=void"), "{r}");
    assert!(!log(r).contains("/dev/nvidia1\n"), "{r}");
    drop(c);
}
