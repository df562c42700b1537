//! The RuntimeClass path end to end: containerd 1.6 with the `gpufence` runtime handler written
//! by `gpufence runtime configure --runtime containerd`, driven through CRI by a Python client
//! (tests/cri/cri_client.py, PyPI `container-runtime-interface-api` in target/venv, set up by
//! `make deps`). A pod annotation picks the GPU; an invalid one reaches the CRI client as the
//! StartContainer error.

mod common;
mod cri_support;
mod runtime_support;

use std::path::Path;
use std::process::Command;

use cri_support::{Containerd, import_image};
use runtime_support::{PROBE, facts, node};

fn operator_config(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"# Operator's containerd configuration: gpufence must keep this file and its comments.
version = 2
root = "{d}/root"
state = "{d}/state"

[grpc]
  address = "{d}/containerd.sock" # our own socket, not the system one

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "localhost/pause:test"
    # root here lacks CAP_SYS_RESOURCE: the sandbox's oomScoreAdj -998 would fail
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "{d}/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "native"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
"#
    )
}

fn cri(
    py: &Path,
    c: &Containerd,
    s: &Path,
    name: &str,
    pod_annotations: serde_json::Value,
) -> serde_json::Value {
    cri_support::pod(py, c, Path::new("/"), s, name, pod_annotations, PROBE)
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
    let n = node(&s, 2, &[]);

    // Operator file → configure writes the drop-in and adds only an `imports` line.
    let cdir = s.join("containerd");
    std::fs::create_dir_all(cdir.join("cni/net.d")).unwrap();
    let main = cdir.join("config.toml");
    let original = operator_config(&cdir);
    std::fs::write(&main, &original).unwrap();
    let (code, out, err) = common::run(
        Command::new(common::bin("gpufence"))
            .args([
                "runtime",
                "configure",
                "--allow-vulnerable-runtime",
                "--runtime",
                "containerd",
                "--config",
            ])
            .arg(&main)
            .arg("--record-dir")
            .arg(s.join("records")),
    );
    assert_eq!(code, 0, "{out}{err}");
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

    // containerd with that configuration; the runtime finds gpufence's config through the env
    // containerd hands to its shims.
    let sock = cdir.join("containerd.sock");
    let log = std::fs::File::create(cdir.join("containerd.log")).unwrap();
    let child = Command::new("containerd")
        .arg("--config")
        .arg(&main)
        .env("GPUFENCE_CONFIG", &n.config)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start containerd");
    let c = Containerd::started(child, sock, &cdir.join("containerd.log"));
    import_image(&s, &c);

    // The pod annotation picks GPU 1.
    let r = cri(
        &py,
        &c,
        &s,
        "gpu-pod",
        serde_json::json!({"gpufence.dev/devices": "1", "gpufence.dev/memory": "2Gi"}),
    );
    assert_eq!(r["stage"], "done", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    let f = facts(r["log"].as_str().unwrap());
    assert_eq!(f["gpu1"], "ENXIO", "{r}");
    assert_eq!(f["gpu0"], "ABSENT", "{r}");
    assert_eq!(f["mknod0"], "EPERM", "{r}");
    assert_eq!(f["ctl"], "ENXIO", "{r}");
    assert_eq!(f["quota_mem"], (2u64 << 30).to_string(), "{r}");
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
