//! The installer image end to end: `scripts/image.sh` (what `make image` runs) builds the OCI
//! image, umoci unpacks it, and its entrypoint — `gpufence install --host-root /host --runtime
//! containerd` — runs in a runc container with only CAP_SYS_CHROOT (what the DaemonSet grants)
//! against a throwaway host root: a minimal system with containerd 1.6, runc and their libraries
//! (copied from this machine) and a simulated 2-GPU node. containerd is then started chrooted
//! into that host root with the configuration install left there, and a CRI pod gets GPU 1
//! through the `gpufence` handler. The image's `gpufence uninstall` then puts the host's files
//! back: the operator's containerd config byte-for-byte, nothing of gpufence's left.

mod common;
mod cri_support;
mod runtime_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cri_support::Containerd;
use runtime_support::{PROBE, facts};

fn ok(cmd: &mut Command) -> String {
    let (code, out, err) = common::run(cmd);
    assert_eq!(code, 0, "{cmd:?}: {out}{err}");
    out
}

/// `file` and the shared libraries it loads (from `ldd`).
fn with_libs(file: &str) -> Vec<String> {
    let mut files = vec![file.to_string()];
    let ldd = ok(Command::new("ldd").arg(file));
    for l in ldd.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            [_, "=>", p, ..] if p.starts_with('/') => files.push(p.to_string()),
            [p, ..] if p.starts_with('/') => files.push(p.to_string()),
            _ => {}
        }
    }
    files
}

/// Copy these files of this machine into `root` at the same paths (following links).
fn copy_in(root: &Path, files: &[String]) {
    for f in files {
        let dest = root.join(f.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(std::fs::canonicalize(f).unwrap(), &dest)
            .unwrap_or_else(|e| panic!("{f}: {e}"));
    }
}

const OPERATOR_CONTAINERD: &str = r#"# The node's containerd configuration: uninstall must give it back byte for byte.
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "localhost/pause:test"
    restrict_oom_score_adj = true   # root here lacks CAP_SYS_RESOURCE
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "native"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
"#;

/// The throwaway host root.
fn host_root(s: &Path) -> PathBuf {
    let h = s.join("host");
    for d in [
        "etc/containerd",
        "proc",
        "sys",
        "dev",
        "run",
        "var/lib",
        "var/log",
        "usr/bin",
    ] {
        std::fs::create_dir_all(h.join(d)).unwrap();
    }
    std::fs::create_dir_all(h.join("tmp")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(h.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    // What containerd's CRI plugin creates at its first start (not gpufence's doing).
    std::fs::create_dir_all(h.join("etc/cni/net.d")).unwrap();
    std::fs::set_permissions(
        h.join("etc/cni/net.d"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    for f in ["hosts", "resolv.conf", "hostname"] {
        std::fs::write(h.join("etc").join(f), "").unwrap();
    }
    for bin in [
        "/usr/bin/containerd",
        "/usr/bin/containerd-shim-runc-v2",
        "/usr/sbin/runc",
        "/sbin/ldconfig",
    ] {
        copy_in(&h, &with_libs(bin));
    }
    // gpufence's binaries (installed by the image) and the mock driver need libgcc_s besides libc.
    copy_in(
        &h,
        &with_libs(common::bin("gpufence").to_str().unwrap())[1..],
    );
    std::fs::write(h.join("etc/containerd/config.toml"), OPERATOR_CONTAINERD).unwrap();

    // The simulated node at /sim (as the host sees it).
    let sim = h.join("sim");
    let cfg = common::sim_node(&sim, 2, None);
    let prefix = sim.display().to_string();
    for f in [
        "node.json",
        "driver/usr/lib/x86_64-linux-gnu/gpufence-mock-node.json",
    ] {
        let p = sim.join(f);
        let t = std::fs::read_to_string(&p)
            .unwrap()
            .replace(&prefix, "/sim");
        std::fs::write(&p, t).unwrap();
    }
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace(&prefix, "/sim");
    let mut doc: toml_edit::DocumentMut = text.parse().unwrap();
    doc["gpufence-binary"] = toml_edit::value("/usr/bin/gpufence");
    doc["runtime"]["path"] = toml_edit::value("/usr/sbin/runc");
    doc["shim"]["library"] = toml_edit::value("/usr/lib/gpufence/libgpufence.so");
    doc["log"]["file"] = toml_edit::value("/var/log/gpufence.log");
    std::fs::create_dir_all(h.join("etc/gpufence")).unwrap();
    std::fs::write(h.join("etc/gpufence/config.toml"), doc.to_string()).unwrap();
    // kubelet's record of the GPU pod (allocation.trust-annotations = "kubelet", the default):
    // the device plugin gave gpu-pod/app GPU 1; its annotation only narrows the memory.
    use gpufence::kubelet;
    let gpu1 = gpufence::sim::gpu_uuid(1);
    let cp = h.join("var/lib/kubelet/device-plugins/kubelet_internal_checkpoint");
    std::fs::create_dir_all(cp.parent().unwrap()).unwrap();
    let record = kubelet::checkpoint_json(vec![kubelet::entry(
        "gpu-pod-uid",
        "app",
        "nvidia.com/gpu",
        &[gpu1.as_str()],
        kubelet::encode_alloc_resp(&[("NVIDIA_VISIBLE_DEVICES", gpu1.as_str())], &[]),
    )]);
    std::fs::write(cp, record).unwrap();
    h
}

/// Build the image from this build's binaries, unpack it as a runc bundle.
fn image_bundle(s: &Path) -> (PathBuf, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/image.sh");
    let out = ok(Command::new("bash")
        .arg(script)
        .arg(common::target_dir())
        .arg(s.join("image"))
        // A debug build's shim links the build machine's glibc; `make image` refuses that.
        .env("ALLOW_HOST_GLIBC_SHIM", "1"));
    let tag = out.lines().last().unwrap().trim().to_string();
    let version = tag.rsplit(':').next().unwrap().to_string();
    assert_eq!(
        version,
        env!("CARGO_PKG_VERSION"),
        "tagged from the crate version"
    );
    let bundle = s.join("bundle");
    ok(Command::new("umoci")
        .args(["unpack", "--image", &tag])
        .arg(&bundle));
    (bundle, version)
}

/// Run the image's entrypoint with `verb` (install/uninstall) in a runc container, the host root
/// mounted at /host, read-only root, only CAP_SYS_CHROOT.
fn run_image(s: &Path, bundle: &Path, host: &Path, verb: &str) -> String {
    let cfg_path = bundle.join("config.json");
    let orig = bundle.with_extension("image-config.json");
    if !orig.exists() {
        std::fs::copy(&cfg_path, &orig).unwrap();
    }
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&orig).unwrap()).unwrap();
    let args: Vec<String> = serde_json::from_value(c["process"]["args"].clone()).unwrap();
    assert_eq!(
        args,
        [
            "/usr/bin/gpufence",
            "install",
            "--host-root",
            "/host",
            "--runtime",
            "containerd"
        ],
        "the image's entrypoint and default arguments"
    );
    let mut a = args.clone();
    a[1] = verb.to_string();
    if verb == "install" {
        // This machine's runc 1.1.5 has known escapes: install refuses it without the flag.
        a.push("--allow-vulnerable-runtime".into());
    }
    c["process"]["args"] = serde_json::json!(a);
    c["process"]["terminal"] = serde_json::json!(false);
    let caps = serde_json::json!(["CAP_SYS_CHROOT"]);
    for set in ["bounding", "effective", "permitted"] {
        c["process"]["capabilities"][set] = caps.clone();
    }
    for set in ["inheritable", "ambient"] {
        c["process"]["capabilities"][set] = serde_json::json!([]);
    }
    c["root"]["readonly"] = serde_json::json!(true);
    let mounts = c["mounts"].as_array_mut().unwrap();
    mounts.retain(|m| m["destination"] != "/host");
    mounts.push(serde_json::json!({"destination": "/host", "type": "bind",
        "source": host, "options": ["rbind", "rw"]}));
    std::fs::write(&cfg_path, serde_json::to_string_pretty(&c).unwrap()).unwrap();
    let id = format!("gpufence-deploy-{verb}-{}", std::process::id());
    let (code, out, err) = common::run(
        Command::new("runc")
            .arg("--root")
            .arg(s.join("runc"))
            .args(["run", "--bundle"])
            .arg(bundle)
            .arg(&id)
            .stdin(Stdio::null()),
    );
    assert_eq!(code, 0, "image {verb}: {out}{err}");
    out
}

/// containerd chrooted into the host root (in a private mount namespace holding its /proc,
/// /sys and /dev; the root a mount point of its own, as runc needs), with the configuration
/// found there.
fn start_containerd(s: &Path, host: &Path) -> Containerd {
    let h = host.display();
    let script = format!(
        "set -e; mount --bind {h} {h}; mount --rbind /dev {h}/dev; mount -t proc proc {h}/proc; mount --rbind /sys {h}/sys; \
         exec chroot {h} /usr/bin/containerd --config /etc/containerd/config.toml"
    );
    let log_path = s.join("containerd.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
        .arg(script)
        .env("PATH", "/usr/bin:/usr/sbin:/bin:/sbin")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("unshare");
    // Debian's containerd 1.6 runs the node: its own ctr (a 2.x ctr cannot import into it).
    Containerd::started_with(
        child,
        host.join("run/containerd/containerd.sock"),
        &log_path,
        PathBuf::from("/usr/bin/ctr"),
    )
}

fn tree(root: &Path) -> BTreeMap<PathBuf, String> {
    common::digest(root)
        .into_iter()
        .map(|(p, d)| (p.strip_prefix(root).unwrap().to_path_buf(), d))
        .collect()
}

/// `dir` holds exactly what `before` recorded; the differences otherwise.
fn same_tree(dir: &Path, before: &BTreeMap<PathBuf, String>, context: &str) {
    let now = tree(dir);
    let diff: Vec<String> = now
        .iter()
        .filter(|(p, d)| before.get(*p) != Some(d))
        .map(|(p, d)| format!("now {}: {d}", p.display()))
        .chain(
            before
                .iter()
                .filter(|(p, _)| !now.contains_key(*p))
                .map(|(p, d)| format!("gone {}: {d}", p.display())),
        )
        .collect();
    assert!(diff.is_empty(), "{}: {diff:#?}\n{context}", dir.display());
}

#[test]
fn installer_image_installs_serves_a_cri_pod_and_uninstalls() {
    if common::skip_unless(&[
        "runc",
        "containerd",
        "ctr",
        "umoci",
        "unshare",
        "ldd",
        "objdump",
        "tar",
    ]) {
        return;
    }
    let Some(py) = cri_support::python() else {
        return;
    };
    let s = common::scratch("deploy-image");
    let (bundle, _version) = image_bundle(&s);
    let image_root = bundle.join("rootfs");
    for f in [
        "usr/bin/gpufence",
        "usr/bin/gpufence-runtime",
        "usr/bin/gpufence-runtime-wrapper",
        "usr/lib/gpufence/libgpufence.so",
        "etc/gpufence/config.toml",
        "usr/share/gpufence/hooks/gpufence.json",
        "usr/share/gpufence/k8s/daemonset.yaml",
        "usr/share/gpufence/k8s/runtimeclass.yaml",
        "usr/share/gpufence/cdi/sim-2gpu.yaml",
        "lib64/ld-linux-x86-64.so.2",
    ] {
        assert!(image_root.join(f).is_file(), "image lacks {f}");
    }

    let host = host_root(&s);
    let before_etc = tree(&host.join("etc"));
    let before_usr = tree(&host.join("usr"));

    let out = run_image(&s, &bundle, &host, "install");
    // The installer's container may not open the GPUs (as in the DaemonSet), so it leaves the
    // inventory to gpufence-runtime rather than caching a node without GPUs.
    assert!(
        out.contains("inventory cache not warmed: ") && out.contains("no access from here"),
        "{out}"
    );
    assert!(out.contains("not restarted"), "no systemd here: {out}");
    assert_eq!(
        std::fs::read(host.join("usr/bin/gpufence-runtime")).unwrap(),
        std::fs::read(image_root.join("usr/bin/gpufence-runtime")).unwrap()
    );
    assert!(host.join("usr/bin/gpufence-runtime-wrapper").is_file());
    assert!(host.join("usr/lib/gpufence/libgpufence.so").is_file());
    assert!(!host.join("sim/state/inventory.json").exists(), "{out}");
    let main = std::fs::read_to_string(host.join("etc/containerd/config.toml")).unwrap();
    assert!(
        main.contains("imports = [\"/etc/containerd/conf.d/gpufence.toml\"]"),
        "{main}"
    );
    // Install again (a restarted DaemonSet pod): nothing changes.
    let installed = tree(&host.join("etc"));
    let out = run_image(&s, &bundle, &host, "install");
    assert!(!out.contains("wrote"), "{out}");
    assert_eq!(tree(&host.join("etc")), installed);

    // containerd with what install left; a pod granted GPU 1 through the `gpufence` handler.
    {
        let c = start_containerd(&s, &host);
        cri_support::import_image(&s, &c);
        let pod_dir = Path::new("/tmp/pods");
        let r = cri_support::pod(
            &py,
            &c,
            &host,
            pod_dir,
            "gpu-pod",
            serde_json::json!({"gpufence.dev/devices": "1", "gpufence.dev/memory": "2Gi"}),
            PROBE,
        );
        assert_eq!(r["stage"], "done", "{r}");
        let f = facts(r["log"].as_str().unwrap());
        assert_eq!(f["gpu1"], "ENXIO", "{r}");
        assert_eq!(f["gpu0"], "ABSENT", "{r}");
        assert_eq!(f["quota_mem"], (2u64 << 30).to_string(), "{r}");
        assert_eq!(f["preload"], "/usr/lib/gpufence/libgpufence.so", "{r}");
        let r = cri_support::pod(
            &py,
            &c,
            &host,
            pod_dir,
            "plain-pod",
            serde_json::json!({}),
            PROBE,
        );
        assert_eq!(r["stage"], "done", "{r}");
        let f = facts(r["log"].as_str().unwrap());
        assert_eq!(f["gpu1"], "ABSENT", "{r}");
    }

    let out = run_image(&s, &bundle, &host, "uninstall");
    assert_eq!(
        std::fs::read_to_string(host.join("etc/containerd/config.toml")).unwrap(),
        OPERATOR_CONTAINERD,
        "{out}"
    );
    same_tree(&host.join("etc"), &before_etc, &out);
    same_tree(&host.join("usr"), &before_usr, &out);
    assert!(!host.join("var/lib/gpufence").exists(), "{out}");
    // Uninstalling again changes nothing.
    let out = run_image(&s, &bundle, &host, "uninstall");
    assert!(out.contains("nothing installed"), "{out}");
    assert_eq!(tree(&host.join("etc")), before_etc);
}
