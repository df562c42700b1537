//! docker 20.10 (Debian's docker.io) with `--runtime gpufence`, registered by `gpufence runtime
//! configure --runtime docker` and loaded by SIGHUP (as `gpufence install` does without systemd).
//! docker 20.10 cannot put annotations into the OCI spec (`--annotation` came with docker 24)
//! and its labels do not reach it, so there an allocation can only come from the environment:
//! with `allocation.trust-env = true` (single-tenant hosts) `NVIDIA_VISIBLE_DEVICES=1` grants
//! GPU 1; a label asking for a GPU grants nothing. `runtime unconfigure` restores daemon.json.

mod common;
mod runtime_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use runtime_support::{PROBE, facts};

/// dockerd on its own socket, data and exec roots; stopped on drop.
struct Dockerd {
    child: Child,
    sock: PathBuf,
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dockerd {
    fn docker(&self) -> Command {
        let mut c = Command::new("docker");
        c.env("DOCKER_HOST", format!("unix://{}", self.sock.display()));
        c
    }
}

fn start(s: &Path, config: &Path, gpufence_config: &Path) -> Dockerd {
    let log = std::fs::File::create(s.join("dockerd.log")).unwrap();
    let sock = s.join("docker.sock");
    let child = Command::new("dockerd")
        .arg("--config-file")
        .arg(config)
        .arg("--data-root")
        .arg(s.join("data"))
        .arg("--exec-root")
        .arg(s.join("exec"))
        .arg("--pidfile")
        .arg(s.join("docker.pid"))
        .arg("-H")
        .arg(format!("unix://{}", sock.display()))
        .args(["--storage-driver", "vfs"])
        .env("GPUFENCE_CONFIG", gpufence_config)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("dockerd");
    let d = Dockerd { child, sock };
    let deadline = Instant::now() + Duration::from_secs(40);
    while common::run(d.docker().arg("version")).0 != 0 {
        assert!(
            Instant::now() < deadline,
            "dockerd did not start: {}",
            std::fs::read_to_string(s.join("dockerd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    d
}

#[test]
fn docker_20_10_runtime_grants_a_gpu_from_trusted_env_only() {
    let tools = ["dockerd", "docker", "runc", "tar"];
    common::install_with_make("docker-deps", "docker test", &tools);
    if common::skip_unless(&tools) {
        return;
    }
    let s = common::scratch("deploy-docker");
    let n = runtime_support::node(&s, 2, &[("allocation.trust-env", toml_edit::value(true))]);
    let daemon = s.join("daemon.json");
    let original = "{\n  \"iptables\": false,\n  \"bridge\": \"none\",\n  \"ip-masq\": false,\n  \"ip-forward\": false\n}\n";
    std::fs::write(&daemon, original).unwrap();
    let d = start(&s, &daemon, &n.config);
    let gf = |verb: &str| {
        let mut c = Command::new(common::bin("gpufence"));
        c.args(["runtime", verb, "--runtime", "docker", "--config"])
            .arg(&daemon)
            .arg("--record-dir")
            .arg(s.join("records"));
        if verb == "configure" {
            c.arg("--runtime-binary")
                .arg(common::bin("gpufence-runtime"))
                // This machine's runc 1.1.5 (the version check has its own tests).
                .arg("--allow-vulnerable-runtime");
        }
        let (code, out, err) = common::run(&mut c);
        assert_eq!(code, 0, "{out}{err}");
    };
    gf("configure");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.child.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let rootfs = common::busybox_rootfs(&s.join("img"));
    let tar = s.join("bb.tar");
    let (code, out, err) = common::run(
        Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
    );
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = common::run(d.docker().arg("import").arg(&tar).arg("gpufence-bb:test"));
    assert_eq!(code, 0, "{out}{err}");

    let run = |extra: &[&str]| {
        // The reload is asynchronous: retry while docker does not know the runtime yet.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (code, out, err) = common::run(
                d.docker()
                    .args(["run", "--rm", "--network", "none", "--runtime", "gpufence"])
                    .args(extra)
                    .args(["gpufence-bb:test", "/bin/sh", "-c", PROBE]),
            );
            if code == 0 {
                return facts(&out);
            }
            assert!(
                err.contains("unknown or invalid runtime") && Instant::now() < deadline,
                "{out}{err}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    let f = run(&["-e", "NVIDIA_VISIBLE_DEVICES=1"]);
    assert_eq!(f["gpu1"], "ENXIO", "{f:?}");
    assert_eq!(f["gpu0"], "ABSENT", "{f:?}");
    let f = run(&["--label", "gpufence.dev/devices=1"]);
    assert_eq!(f["gpu1"], "ABSENT", "labels do not reach the spec: {f:?}");
    drop(d);

    gf("unconfigure");
    assert_eq!(std::fs::read_to_string(&daemon).unwrap(), original);
}
