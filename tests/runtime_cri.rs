//! The RuntimeClass path end to end: containerd 1.6 with the `gpufence` runtime handler written
//! by `gpufence runtime configure --runtime containerd`, driven through CRI by a Python client
//! (tests/cri/cri_client.py, PyPI `container-runtime-interface-api` in target/venv, set up by
//! `make deps`). A pod annotation picks the GPU; an invalid one reaches the CRI client as the
//! StartContainer error.

mod common;
mod runtime_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use runtime_support::{PROBE, facts, node};

/// containerd on its own socket and directories; killed (and waited for) on drop.
struct Containerd {
    child: Child,
    sock: PathBuf,
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Containerd {
    fn ctr(&self) -> Command {
        let mut c = Command::new("ctr");
        c.arg("--address").arg(&self.sock).args(["-n", "k8s.io"]);
        c
    }
}

fn python() -> Option<PathBuf> {
    let p = std::env::var_os("GPUFENCE_CRI_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/venv/bin/python"));
    let ok = Command::new(&p)
        .args(["-c", "import cri_api.v1.api_pb2, grpc"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(p)
}

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

/// The busybox rootfs as an OCI image `localhost/pause:test`, imported into containerd.
fn import_image(s: &Path, c: &Containerd) {
    let rootfs = common::busybox_rootfs(&s.join("image-src"));
    let img = s.join("img");
    let ub = s.join("img-bundle");
    let sh = |args: &[&str]| {
        let (code, out, err) = common::run(Command::new(args[0]).args(&args[1..]));
        assert_eq!(code, 0, "{args:?}: {out}{err}");
    };
    let layout = img.to_str().unwrap();
    let tag = format!("{layout}:test");
    sh(&["umoci", "init", "--layout", layout]);
    sh(&["umoci", "new", "--image", &tag]);
    sh(&["umoci", "unpack", "--image", &tag, ub.to_str().unwrap()]);
    sh(&[
        "cp",
        "-a",
        &format!("{}/.", rootfs.display()),
        &format!("{}/rootfs/", ub.display()),
    ]);
    sh(&["umoci", "repack", "--image", &tag, ub.to_str().unwrap()]);
    sh(&[
        "umoci",
        "config",
        "--image",
        &tag,
        "--config.entrypoint",
        "/bin/sleep",
        "--config.cmd",
        "2147483647",
        "--config.env",
        "PATH=/bin:/usr/bin",
    ]);
    let tar = s.join("pause-oci.tar");
    sh(&["tar", "-C", layout, "-cf", tar.to_str().unwrap(), "."]);
    let (code, out, err) = common::run(
        c.ctr()
            .args([
                "images",
                "import",
                "--base-name",
                "localhost/pause",
                "--snapshotter",
                "native",
            ])
            .arg(&tar),
    );
    assert_eq!(code, 0, "ctr import: {out}{err}");
}

fn cri(
    py: &Path,
    c: &Containerd,
    s: &Path,
    name: &str,
    pod_annotations: serde_json::Value,
) -> serde_json::Value {
    let req = serde_json::json!({
        "socket": c.sock, "handler": "gpufence", "dir": s, "name": name,
        "pod_annotations": pod_annotations, "image": "localhost/pause:test",
        "command": ["/bin/sh", "-c", PROBE], "timeout": 30,
    });
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
    let Some(py) = python() else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("target/venv with container-runtime-interface-api missing (make deps)");
        }
        eprintln!("SKIP: no target/venv with container-runtime-interface-api (make deps)");
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
            .arg(&main),
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
    let c = Containerd { child, sock };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, _, _) = common::run(
            Command::new("ctr")
                .arg("--address")
                .arg(&c.sock)
                .arg("version"),
        );
        if code == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "containerd did not start: {}",
            std::fs::read_to_string(cdir.join("containerd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
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
