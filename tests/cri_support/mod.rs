//! containerd driven through CRI for the e2e tests: a containerd on its own socket (killed on
//! drop), the busybox image imported as `localhost/pause:test`, and one pod run by the Python
//! CRI client (tests/cri/cri_client.py, PyPI `container-runtime-interface-api` in target/venv,
//! set up by `make deps`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

pub mod crio;
pub mod gpu1;
pub mod injector;

/// containerd on its own socket and directories; killed (and waited for) on drop.
pub struct Containerd {
    pub child: Child,
    pub sock: PathBuf,
    /// The `ctr` of the same release (a 2.x ctr cannot import into containerd 1.6).
    pub ctr_bin: PathBuf,
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
    /// Wrap a started containerd and wait until it answers on `sock` (`log`: its output, shown
    /// when it does not come up).
    pub fn started(child: Child, sock: PathBuf, log: &Path) -> Containerd {
        Containerd::started_with(child, sock, log, PathBuf::from("ctr"))
    }

    /// [`Containerd::started`], talking to it with the `ctr` at `ctr_bin`.
    pub fn started_with(child: Child, sock: PathBuf, log: &Path, ctr_bin: PathBuf) -> Containerd {
        let c = Containerd {
            child,
            sock,
            ctr_bin,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (code, _, _) = common::run(
                Command::new(&c.ctr_bin)
                    .arg("--address")
                    .arg(&c.sock)
                    .arg("version"),
            );
            if code == 0 {
                return c;
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not start: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether the `ctr` is containerd 2.x's (`ctr github.com/containerd/containerd/v2 v2.…`).
    pub fn ctr_is_v2(&self) -> bool {
        let (_, out, _) = common::run(Command::new(&self.ctr_bin).arg("--version"));
        out.contains("containerd/v2 ")
    }

    pub fn ctr(&self) -> Command {
        let mut c = Command::new(&self.ctr_bin);
        c.arg("--address").arg(&self.sock).args(["-n", "k8s.io"]);
        c
    }
}

/// `gpufence runtime configure --runtime containerd` on the containerd config `main` (drop-in
/// beside it, records under `records`), checking the real runtime named by gpufence's config
/// `gpufence_config` (the node's `runtime.path`); its stdout.
pub fn configure_handler(gpufence_config: &Path, main: &Path, records: &Path) -> String {
    let args = ["configure", "--runtime", "containerd"];
    runtime_verb(gpufence_config, &args, main, records)
}

/// `gpufence runtime ARGS --config MAIN --record-dir RECORDS` with `GPUFENCE_CONFIG`
/// (`configure`/`unconfigure`, `--runtime`, `--mode`, …); its stdout, a failure asserted.
pub fn runtime_verb(gpufence_config: &Path, args: &[&str], main: &Path, records: &Path) -> String {
    let (code, out, err) = common::run(
        Command::new(common::bin("gpufence"))
            .env("GPUFENCE_CONFIG", gpufence_config)
            .arg("runtime")
            .args(args)
            .arg("--config")
            .arg(main)
            .arg("--record-dir")
            .arg(records),
    );
    assert_eq!(code, 0, "runtime {args:?}: {out}{err}");
    out
}

/// A containerd of its own on `config` (socket `dir/containerd.sock`, log `dir/containerd.log`,
/// appended to across restarts), with `env` added (e.g. `GPUFENCE_CONFIG`, which its shims hand to
/// gpufence-runtime). `engine`: `Some(dir)` runs that release's containerd and ctr with `dir` first
/// on PATH (the engines' 2.3: its shim, the shim's runc); `None` runs Debian's containerd 1.6 with
/// its own shim and ctr, PATH without the engines (runc named by the config's `BinaryName`).
pub fn start_containerd(
    engine: Option<&Path>,
    config: &Path,
    dir: &Path,
    env: &[(&str, &Path)],
) -> Containerd {
    const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    let (containerd, ctr, path) = match engine {
        Some(bin) => (
            bin.join("containerd"),
            bin.join("ctr"),
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        ),
        None => (
            PathBuf::from("/usr/bin/containerd"),
            PathBuf::from("/usr/bin/ctr"),
            SYSTEM_PATH.to_string(),
        ),
    };
    let log = dir.join("containerd.log");
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    let mut cmd = Command::new(&containerd);
    cmd.arg("--config")
        .arg(config)
        .env("PATH", path)
        .stdout(Stdio::null())
        .stderr(out);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("start containerd");
    Containerd::started_with(child, dir.join("containerd.sock"), &log, ctr)
}

/// The venv's Python with the CRI stubs; `None` (a skip, a failure under CI) without it.
pub fn python() -> Option<PathBuf> {
    let p = std::env::var_os("GPUFENCE_CRI_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/venv/bin/python"));
    let ok = Command::new(&p)
        .args(["-c", "import cri_api.v1.api_pb2, grpc"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(p);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("target/venv with container-runtime-interface-api missing (make deps)");
    }
    eprintln!("SKIP: no target/venv with container-runtime-interface-api (make deps)");
    None
}

/// The busybox rootfs as an OCI image `localhost/pause:test`, imported into containerd.
pub fn import_image(s: &Path, c: &Containerd) {
    import_image_named(s, c, "pause", &["PATH=/bin:/usr/bin"]);
}

/// The busybox rootfs as an OCI image `localhost/<name>:test` with this env, imported into
/// containerd.
pub fn import_image_named(s: &Path, c: &Containerd, name: &str, env: &[&str]) {
    let rootfs = common::busybox_rootfs(&s.join(format!("image-src-{name}")));
    import_rootfs(s, c, name, &rootfs, env);
}

/// `rootfs` as an OCI image `localhost/<name>:test` with this env, imported into containerd.
pub fn import_rootfs(s: &Path, c: &Containerd, name: &str, rootfs: &Path, env: &[&str]) {
    let layout = oci_layout(s, name, rootfs, env);
    let tar = s.join(format!("{name}-oci.tar"));
    let (code, out, err) = common::run(
        Command::new("tar")
            .arg("-C")
            .arg(&layout)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
    );
    assert_eq!(code, 0, "tar: {out}{err}");
    let mut import = c.ctr();
    import.args([
        "images",
        "import",
        "--base-name",
        &format!("localhost/{name}"),
        "--snapshotter",
        "native",
    ]);
    if c.ctr_is_v2() {
        // containerd 2.x's transfer service unpacks only for the platforms its config names;
        // a local import unpacks into the native snapshotter as 1.x's ctr does.
        import.arg("--local");
    }
    let (code, out, err) = common::run(import.arg(&tar));
    assert_eq!(code, 0, "ctr import: {out}{err}");
}

/// `rootfs` as an OCI image layout `s/img-<name>` tagged `test`, with this env (entrypoint
/// `sleep 2147483647`): for containerd's import and CRI-O's storage alike.
pub fn oci_layout(s: &Path, name: &str, rootfs: &Path, env: &[&str]) -> PathBuf {
    let img = s.join(format!("img-{name}"));
    let ub = s.join(format!("img-bundle-{name}"));
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
    let mut config = vec![
        "umoci",
        "config",
        "--image",
        &tag,
        "--config.entrypoint",
        "/bin/sleep",
        "--config.cmd",
        "2147483647",
    ];
    for e in env {
        config.extend(["--config.env", e]);
    }
    sh(&config);
    img
}

/// An operator's containerd 1.6 configuration (config version 2) in `dir`: own root, state and
/// socket, host-network pods, the imported `localhost/pause:test` as sandbox image, the runc of
/// the tests ([`common::runc`]: the engines' 1.5.1) under the default handler.
pub fn operator_config(dir: &Path) -> String {
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
          BinaryName = "{runc}"
"#,
        runc = common::runc().display()
    )
}

/// One pod through the `gpufence` handler running `command`; the client's JSON answer.
/// `dir` is a directory as containerd sees it, `root` where containerd's root directory is
/// from here (`/` unless containerd runs chrooted).
pub fn pod(
    py: &Path,
    c: &Containerd,
    root: &Path,
    dir: &Path,
    name: &str,
    pod_annotations: serde_json::Value,
    command: &str,
) -> serde_json::Value {
    let root = if root == Path::new("/") {
        String::new()
    } else {
        root.display().to_string()
    };
    let req = serde_json::json!({
        "socket": c.sock, "handler": "gpufence", "dir": dir, "root": root, "name": name,
        "pod_annotations": pod_annotations, "image": "localhost/pause:test",
        "command": ["/bin/sh", "-c", command], "timeout": 30,
    });
    client(py, &req)
}

/// One pod as `req` describes it (tests/cri/cri_client.py's request, sent on stdin: it may be
/// larger than a command-line argument); the client's JSON answer.
pub fn client(py: &Path, req: &serde_json::Value) -> serde_json::Value {
    use std::io::Write;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cri/cri_client.py");
    let mut child = Command::new(py)
        .arg(script)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cri client");
    let mut stdin = child.stdin.take().expect("stdin");
    let body = req.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(body.as_bytes()));
    let out = child.wait_with_output().expect("cri client");
    writer.join().expect("writer").expect("request written");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "cri client: {stdout}{stderr}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

// containerd 2.3.4 from the shared engines (its own CDI resolution, NRI), and `gpufence nri`.

/// The engines' directory, or `None` (a skip with the reason printed) without them.
pub fn engines() -> Option<PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let candidates = [
        std::env::var_os("ENGINES_DIR").map(PathBuf::from),
        Some(here.join("../shared/engines/bin")),
        Some(here.join("../../shared/engines/bin")),
    ];
    let found = candidates.into_iter().flatten().find(|d| {
        ["containerd", "containerd-shim-runc-v2", "runc"]
            .iter()
            .all(|b| d.join(b).is_file())
    });
    if found.is_none() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("engines (containerd 2.3.4, runc 1.5.1) missing: set ENGINES_DIR");
        }
        eprintln!("SKIP: no engines dir with containerd 2.3 and runc 1.5 (ENGINES_DIR)");
    }
    found
}

/// Replace `from` by `to` in `text`, exactly once (a changed default config fails loudly).
fn set(text: &mut String, from: &str, to: &str) {
    assert_eq!(
        text.matches(from).count(),
        1,
        "containerd config default: {from:?}"
    );
    *text = text.replace(from, to);
}

/// Replaces the one line of containerd's default config that starts (indentation aside) with
/// `start`, whatever it names (the sandbox image's registry is containerd's default, not ours).
fn set_line(text: &mut String, start: &str, to: &str) {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with(start))
        .collect();
    assert_eq!(lines.len(), 1, "containerd config default: {start:?}");
    let line = lines[0].to_string();
    let indent = &line[..line.len() - line.trim_start().len()];
    *text = text.replace(&line, &format!("{indent}{to}"));
}

/// A scratch directory with a short path (`/tmp/gpufence-tests/s-<pid>-<n>`, swept like the
/// others) for containerd's shim sockets, linked from `dir/shim-sockets`.
fn short_dir(dir: &Path) -> PathBuf {
    let p = common::scratch("s");
    let _ = std::os::unix::fs::symlink(&p, dir.join("shim-sockets"));
    p
}

/// containerd 2.3's default config with everything private to `dir`; `required` turns on NRI's
/// default validator requiring those plugins.
pub fn containerd_config(bin: &Path, dir: &Path, required: &[&str]) -> PathBuf {
    let out = Command::new(bin.join("containerd"))
        .args(["config", "default"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let mut t = String::from_utf8(out.stdout).unwrap();
    let d = dir.display();
    for sub in ["cni", "opt", "nri-plugins", "nri-conf", "runc"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    set(
        &mut t,
        "root = '/var/lib/containerd'",
        &format!("root = '{d}/root'"),
    );
    set(
        &mut t,
        "state = '/run/containerd'",
        &format!("state = '{d}/state'"),
    );
    set(
        &mut t,
        "imports = ['/etc/containerd/conf.d/*.toml']",
        "imports = []",
    );
    set(
        &mut t,
        "address = '/run/containerd/containerd.sock'",
        &format!("address = '{d}/containerd.sock'"),
    );
    set(
        &mut t,
        "address = '/run/containerd/containerd.sock.ttrpc'",
        &format!("address = '{d}/containerd.sock.ttrpc'"),
    );
    set(
        &mut t,
        "path = '/opt/containerd'",
        &format!("path = '{d}/opt'"),
    );
    set(
        &mut t,
        "socket_path = '/var/run/nri/nri.sock'",
        &format!("socket_path = '{d}/nri.sock'"),
    );
    set(
        &mut t,
        "plugin_path = '/opt/nri/plugins'",
        &format!("plugin_path = '{d}/nri-plugins'"),
    );
    set(
        &mut t,
        "plugin_config_path = '/etc/nri/conf.d'",
        &format!("plugin_config_path = '{d}/nri-conf'"),
    );
    set(
        &mut t,
        "conf_dir = '/etc/cni/net.d'",
        &format!("conf_dir = '{d}/cni'"),
    );
    set(
        &mut t,
        "BinaryName = ''",
        &format!("BinaryName = '{}'", bin.join("runc").display()),
    );
    set(
        &mut t,
        "            Root = ''",
        &format!("            Root = '{d}/runc'"),
    );
    // The shim's socket directory must be at most 42 bytes long.
    let shim_dir = short_dir(dir);
    set(
        &mut t,
        "socket_dir = ''",
        &format!("socket_dir = '{}'", shim_dir.display()),
    );
    set_line(&mut t, "sandbox = '", "sandbox = 'localhost/pause:test'");
    set(
        &mut t,
        "snapshotter = 'overlayfs'",
        "snapshotter = 'native'",
    );
    // Root here lacks CAP_SYS_RESOURCE: the sandbox's oomScoreAdj -998 would fail.
    set(
        &mut t,
        "restrict_oom_score_adj = false",
        "restrict_oom_score_adj = true",
    );
    set(
        &mut t,
        "ignore_deprecation_warnings = []",
        "ignore_deprecation_warnings = ['io.containerd.deprecation/cgroup-v1']",
    );
    if !required.is_empty() {
        let v = "[plugins.'io.containerd.nri.v1.nri'.default_validator]\n      enable = false";
        set(&mut t, v, &v.replace("false", "true"));
        let list: Vec<String> = required.iter().map(|r| format!("'{r}'")).collect();
        set(
            &mut t,
            "      required_plugins = []",
            &format!("      required_plugins = [{}]", list.join(", ")),
        );
    }
    let path = dir.join("config.toml");
    std::fs::write(&path, t).unwrap();
    path
}

/// Start containerd 2.3 on `config` with the engines first on PATH (its shim, the shim's runc).
pub fn start_containerd23(bin: &Path, dir: &Path, config: &Path) -> Containerd {
    start_containerd(Some(bin), config, dir, &[])
}

/// One pod with the default runtime (runc 1.5.1) through the CRI socket `sock` (containerd's or
/// CRI-O's); `extra` adds request fields.
pub fn request(
    py: &Path,
    sock: &Path,
    s: &Path,
    name: &str,
    command: &str,
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut req = serde_json::json!({
        "socket": sock, "handler": "", "dir": s, "name": name,
        "image": "localhost/pause:test", "command": ["/bin/sh", "-c", command], "timeout": 30,
    });
    for (k, v) in extra.as_object().unwrap() {
        req[k] = v.clone();
    }
    client(py, &req)
}

/// The gpufence applier a pod goes through.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Applier {
    /// The `gpufence` runtime handler (RuntimeClass).
    Handler,
    /// `gpufence nri`, beside the default runtime.
    Nri,
}

/// One pod through applier `a` running `command`, on the image `localhost/cuda:test` (a CUDA-like
/// image: `NVIDIA_VISIBLE_DEVICES=all`) unless `extra` names another; `extra` adds request
/// fields (`cdi_devices`, `devices`, `pod_annotations`, `envs`).
pub fn applier_pod(
    py: &Path,
    sock: &Path,
    s: &Path,
    a: Applier,
    name: &str,
    command: &str,
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut extra = extra;
    if extra.get("image").is_none() {
        extra["image"] = "localhost/cuda:test".into();
    }
    if a == Applier::Handler {
        extra["handler"] = "gpufence".into();
    }
    request(py, sock, s, name, command, extra)
}

/// Refused (at CreateContainer by NRI, at StartContainer by the handler) with one line holding
/// every piece of `want`.
pub fn assert_refused(r: &serde_json::Value, want: &[&str]) {
    assert_ne!(r["stage"], "done", "{r}");
    let e = r["error"].as_str().unwrap_or_default();
    eprintln!("refused: {e}");
    for w in want {
        assert!(e.contains(w), "{w:?} not in: {e}");
    }
}

/// Of GPUs 0–3 exactly `gpus` are openable (ENXIO: a node with no driver behind it) and the
/// others absent and refused by the device cgroup when made by hand, in the probe's facts `f`
/// (`gpuN` from runtime_support's PROBE, `mkN` from [`PROBE_MKNOD`]) of result `r`.
pub fn assert_only_gpus(
    f: &std::collections::BTreeMap<String, String>,
    r: &serde_json::Value,
    gpus: &[u32],
) {
    for n in 0..4u32 {
        let (node, made) = if gpus.contains(&n) {
            ("ENXIO", "ENXIO")
        } else {
            ("ABSENT", "EPERM")
        };
        assert_eq!(f[&format!("gpu{n}")], node, "gpu{n}: {r}");
        assert_eq!(f[&format!("mk{n}")], made, "mk{n}: {r}");
    }
}

/// Probe lines `mkN=`: GPU N's node made by hand in the container and opened.
pub const PROBE_MKNOD: &str = r#"
for n in 0 1 2 3; do
  mknod /tmp/mk$n c 195 $n 2>/dev/null && echo "mk$n=$(probe /tmp/mk$n)" || echo "mk$n=EPERM"
done
"#;

pub fn prerequisites() -> Option<(PathBuf, PathBuf)> {
    if common::skip_unless(&["umoci", "tar"]) {
        return None;
    }
    let bin = engines()?;
    let py = python()?;
    Some((bin, py))
}

/// `gpufence nri` with this config, on `socket` (killed on drop).
pub struct NriProcess(pub Child);

impl Drop for NriProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn spawn_nri(config: &Path, socket: &Path, log: &Path) -> NriProcess {
    spawn_nri_with(config, socket, log, &[])
}

/// [`spawn_nri`] with more arguments of `gpufence nri` (`--no-validation`).
pub fn spawn_nri_with(config: &Path, socket: &Path, log: &Path, args: &[&str]) -> NriProcess {
    let child = Command::new(common::bin("gpufence"))
        .arg("--config")
        .arg(config)
        .args(["nri", "--socket"])
        .arg(socket)
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    NriProcess(child)
}

/// Wait until `log` (gpufence's) says the plugin registered `n` times.
pub fn wait_registered(log: &Path, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.matches("NRI: registered").count() >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "gpufence nri did not register: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Container directories left in the state dir (the inventory cache and counters are files).
pub fn state_dirs(state: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(state)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// containerd 2.3's CRI `cdi_spec_dirs` in `config` ([`containerd_config`]'s file) set to `dirs`.
pub fn set_cdi_spec_dirs(config: &Path, dirs: &[&Path]) {
    let mut t = std::fs::read_to_string(config).unwrap();
    let list: Vec<String> = dirs.iter().map(|d| format!("'{}'", d.display())).collect();
    set(
        &mut t,
        "cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']",
        &format!("cdi_spec_dirs = [{}]", list.join(", ")),
    );
    std::fs::write(config, t).unwrap();
}
