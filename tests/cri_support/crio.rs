//! CRI-O 1.36.3 driven through CRI for the e2e tests (the project's port of the engines' recipe,
//! `../shared/engines/crio-recipe.sh`): a private CRI-O — its own storage, run root, sockets,
//! hooks.d folder, NRI socket and plugin folders, drop-in folder — killed and unmounted on drop,
//! with the busybox image as `localhost/pause:test` (pods and the infra container) in its
//! storage. Pods go through the same CRI client as containerd's, host-network.
//!
//! Needs the engines' `crio` and `pinns` (ENGINES_DIR), and from Debian `conmon` (CRI-O's monitor
//! per container), `skopeo` (images into CRI-O's storage), `umoci`, `libsqlite3-0` and
//! `libseccomp2` (crio links both): `scripts/deps.sh test` installs them.
//!
//! The real runtime is the engines' `runc-pathrs-lite` (runc 1.5.1 without libpathrs: CRI-O's
//! generated seccomp profile answers `faccessat2` with EPERM here, and the libpathrs build dies
//! in `runc init` then), behind a wrapper that clamps the infra container's oomScoreAdj -998 to 0
//! (root here lacks CAP_SYS_RESOURCE, and CRI-O has no setting for it).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

/// The engines' folder with CRI-O, or `None` with the reason printed.
pub fn engine() -> Option<PathBuf> {
    let found = common::engines_dir().filter(|d| {
        ["crio", "pinns"].iter().all(|b| d.join(b).is_file())
            && (d.join("runc-pathrs-lite").is_file() || d.join("runc").is_file())
    });
    if found.is_none() {
        // scripts/engines.sh fetches runc and containerd, not CRI-O (it is built from its tag:
        // ../shared/engines/build-crio.sh): its absence is a skip, never a failure.
        eprintln!(
            "SKIP: CRI-O 1.36.3 absent: no crio and pinns in ENGINES_DIR ({}); build them with \
             ../shared/engines/build-crio.sh",
            common::engines_dir().map_or("unset".into(), |d| d.display().to_string())
        );
        return None;
    }
    // What scripts/deps.sh test installs: missing, they fail the test under CI.
    if common::skip_unless(&["conmon", "skopeo", "umoci", "tar"]) {
        return None;
    }
    found
}

/// How the private CRI-O is set up.
#[derive(Default)]
pub struct Options<'a> {
    /// Plugins NRI's default validator requires (empty: validator off).
    pub required: &'a [&'a str],
}

/// A private CRI-O; stopped and its mounts undone on drop.
pub struct Crio {
    pub child: Option<Child>,
    /// Its CRI socket.
    pub sock: PathBuf,
    /// Its folder (config, storage, sockets).
    pub dir: PathBuf,
    bin: PathBuf,
}

impl Crio {
    /// Its NRI socket.
    pub fn nri_socket(&self) -> PathBuf {
        self.dir.join("nri.sock")
    }
    /// Where it starts pre-registered NRI plugins from.
    pub fn plugin_dir(&self) -> PathBuf {
        self.dir.join("nri-plugins")
    }
    /// Its hooks.d folder.
    pub fn hooks_dir(&self) -> PathBuf {
        self.dir.join("hooks.d")
    }
    /// Its main configuration file (drop-ins in `crio.conf.d` beside it).
    pub fn config(&self) -> PathBuf {
        self.dir.join("crio.conf")
    }
    /// The real runtime every container runs on (the clamping wrapper).
    pub fn runtime(&self) -> PathBuf {
        self.dir.join("runc-clamp")
    }

    /// Start it (again) and wait for its CRI socket.
    pub fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("crio.log"))
            .unwrap();
        let _ = std::fs::remove_file(&self.sock);
        let child = Command::new(self.bin.join("crio"))
            .arg("--config")
            .arg(self.config())
            .arg("--config-dir")
            .arg(self.dir.join("crio.conf.d"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start crio");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.sock.exists() {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                panic!("crio exited ({st}): {}", self.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "crio did not start: {}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stop it (SIGTERM, then SIGKILL after 15 s); its containers keep running (conmon).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn log_tail(&self) -> String {
        let t = std::fs::read_to_string(self.dir.join("crio.log")).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }
}

impl Drop for Crio {
    fn drop(&mut self) {
        self.stop();
        // Its storage and namespace mounts, deepest first.
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let prefix = format!("{}/", self.dir.display());
        let mut mine: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        mine.sort_unstable_by(|a, b| b.cmp(a));
        for m in mine {
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// The clamping wrapper around the real runtime (see the module's doc).
fn clamp_wrapper(real: &Path) -> String {
    format!(
        r#"#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
if "create" in args:
    b = "."
    for k, v in zip(args, args[1:]):
        if k in ("--bundle", "-b"): b = v
    b = next((a.split("=", 1)[1] for a in args if a.startswith("--bundle=")), b)
    p = os.path.join(b, "config.json")
    c = json.load(open(p)); pr = c.get("process") or {{}}
    if (pr.get("oomScoreAdj") or 0) < 0:
        pr["oomScoreAdj"] = 0; json.dump(c, open(p, "w"))
os.execv("{real}", ["{real}"] + args)
"#,
        real = real.display()
    )
}

/// CRI-O's main file for a private instance in `d`.
fn config(d: &Path, bin: &Path, o: &Options) -> String {
    let d = d.display();
    let validator = if o.required.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = o.required.iter().map(|r| format!("{r:?}")).collect();
        format!(
            "[crio.nri.default_validator]\nnri_enable_default_validator = true\nnri_validator_required_plugins = [{}]\n",
            list.join(", ")
        )
    };
    format!(
        r#"[crio]
root = "{d}/storage"
runroot = "{d}/runroot"
storage_driver = "overlay"
version_file = "{d}/version/version"
version_file_persist = "{d}/version/persist"
clean_shutdown_file = "{d}/version/clean.shutdown"
[crio.api]
listen = "{d}/crio.sock"
stream_port = "0"
[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
hooks_dir = ["{d}/hooks.d"]
namespaces_dir = "{d}/ns"
pinns_path = "{pinns}"
container_exits_dir = "{d}/exits"
container_attach_socket_dir = "{d}/attach"
log_dir = "{d}/logs"
[crio.runtime.runtimes.runc]
runtime_path = "{d}/runc-clamp"
runtime_root = "{d}/runc"
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"
[crio.image]
pause_image = "localhost/pause:test"
pause_command = "/pause"
signature_policy = "{d}/policy.json"
[crio.network]
network_dir = "{d}/cni"
plugin_dirs = ["{d}/cni-bin"]
[crio.nri]
enable_nri = true
nri_listen = "{d}/nri.sock"
nri_plugin_dir = "{d}/nri-plugins"
nri_plugin_config_dir = "{d}/nri-conf"
{validator}"#,
        pinns = bin.join("pinns").display()
    )
}

/// A private CRI-O in `s/crio` (not started): its config, the clamping wrapper and the busybox
/// image `localhost/pause:test` (env `PATH=/bin:/usr/bin`) in its storage.
pub fn setup(s: &Path, bin: &Path, o: &Options) -> Crio {
    // Short: CRI-O's attach sockets must fit a unix socket path.
    let dir = common::scratch("crio");
    let _ = std::os::unix::fs::symlink(&dir, s.join("crio"));
    for sub in [
        "storage",
        "runroot",
        "logs",
        "exits",
        "attach",
        "ns",
        "cni",
        "cni-bin",
        "version",
        "runc",
        "nri-plugins",
        "nri-conf",
        "crio.conf.d",
        "hooks.d",
    ] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::write(dir.join("crio.conf"), config(&dir, bin, o)).unwrap();
    std::fs::write(
        dir.join("policy.json"),
        r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
    )
    .unwrap();
    let real = ["runc-pathrs-lite", "runc"]
        .iter()
        .map(|n| bin.join(n))
        .find(|p| p.is_file())
        .unwrap();
    let clamp = dir.join("runc-clamp");
    std::fs::write(&clamp, clamp_wrapper(&real)).unwrap();
    std::fs::set_permissions(&clamp, std::fs::Permissions::from_mode(0o755)).unwrap();
    let rootfs = common::busybox_rootfs(&s.join("image-src-pause"));
    // The infra container's command: stops at SIGTERM (a bare `sleep` as pid 1 ignores it, and
    // CRI-O would wait out its stop timeout for every pod).
    let pause = rootfs.join("pause");
    std::fs::write(
        &pause,
        "#!/bin/sh\ntrap \"exit 0\" TERM INT\nsleep 2147483647 &\nwait\n",
    )
    .unwrap();
    std::fs::set_permissions(&pause, std::fs::Permissions::from_mode(0o755)).unwrap();
    let layout = super::oci_layout(s, "pause", &rootfs, &["PATH=/bin:/usr/bin"]);
    let storage = format!(
        "containers-storage:[overlay@{d}/storage+{d}/runroot]localhost/pause:test",
        d = dir.display()
    );
    let (code, out, err) = common::run(
        Command::new("skopeo")
            .arg("--policy")
            .arg(dir.join("policy.json"))
            .args(["copy", "-q"])
            .arg(format!("oci:{}:test", layout.display()))
            .arg(&storage),
    );
    assert_eq!(code, 0, "skopeo copy: {out}{err}");
    Crio {
        child: None,
        sock: dir.join("crio.sock"),
        dir,
        bin: bin.to_path_buf(),
    }
}
