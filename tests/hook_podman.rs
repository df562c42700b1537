//! End to end: `gpufence hook` installed with `gpufence hook install` into a hooks directory,
//! real podman 4.3 + runc with `--hooks-dir`, on a node simulated by `gpufence-sim`.
//!
//! Fake GPU nodes are real character devices: opened inside a container they give ENXIO when the
//! device cgroup allows them and EPERM when it denies them.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{digest, host_digest};

const ENXIO: &str = "No such device or address";
const EPERM: &str = "Operation not permitted";

struct Env {
    dir: PathBuf,
    /// podman refuses a runroot longer than 50 characters.
    runroot: PathBuf,
    config: PathBuf,
    hooks: PathBuf,
    rootfs: PathBuf,
}

fn setup(name: &str) -> Option<Env> {
    setup_with(name, None, "", "prestart")
}

/// A simulated node (optionally with a MIG GPU), `extra` appended to its config.toml, the hook
/// installed for `stage`.
fn setup_with(name: &str, mig: Option<u32>, extra: &str, stage: &str) -> Option<Env> {
    if common::skip_unless(&["podman", "runc"]) {
        return None;
    }
    let dir = common::scratch(name);
    let config = common::sim_node(&dir.join("node"), 2, mig);
    // These tests give podman containers their allocation by `--annotation`: the node opts in
    // (podman copies image annotations too; see libpod_image_annotation_grants_nothing).
    let extra = if extra.contains("trust-libpod-annotations") {
        extra.to_string()
    } else if extra.contains("[allocation]") {
        extra.replace(
            "[allocation]",
            "[allocation]\ntrust-libpod-annotations = true",
        )
    } else {
        format!("{extra}\n[allocation]\ntrust-libpod-annotations = true\n")
    };
    {
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str(&extra);
        std::fs::write(&config, text).unwrap();
    }
    let hooks = dir.join("hooks");
    let (code, out, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&config)
            .args(["hook", "install", "--stage", stage, "--dir"])
            .arg(&hooks),
    );
    assert_eq!(code, 0, "hook install: {out}{err}");
    let rootfs = common::busybox_rootfs(&dir);
    let runroot = PathBuf::from(format!(
        "/tmp/gfh-{}-{}",
        std::process::id(),
        dir.file_name().unwrap().to_string_lossy().len() + name.len() * 7 + rand_suffix()
    ));
    std::fs::create_dir_all(&runroot).unwrap();
    Some(Env {
        dir,
        runroot,
        config,
        hooks,
        rootfs,
    })
}

impl Env {
    fn podman(&self, args: &[&str], script: &str) -> (i32, String, String) {
        self.podman_with("runc", true, args, script)
    }

    /// podman with a given `--runtime`, with or without the hooks directory.
    fn podman_with(
        &self,
        runtime: &str,
        hooks: bool,
        args: &[&str],
        script: &str,
    ) -> (i32, String, String) {
        self.podman_from(runtime, hooks, args, None, script)
    }

    /// podman global options for this test's storage, then `sub` (e.g. `["import", …]`).
    fn podman_base(&self, runtime: &str) -> Command {
        // "runc" is the engines' runc 1.5.1 where present (common::runc).
        let runtime = match runtime {
            "runc" => common::runc().display().to_string(),
            other => other.to_string(),
        };
        let mut cmd = Command::new("podman");
        cmd.arg("--root")
            .arg(self.dir.join("podman/root"))
            .arg("--runroot")
            .arg(&self.runroot)
            .args([
                "--storage-driver",
                "vfs",
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
                "--runtime",
                &runtime,
            ]);
        cmd
    }

    /// `podman run` of `image` (None: the busybox `--rootfs`).
    fn podman_from(
        &self,
        runtime: &str,
        hooks: bool,
        args: &[&str],
        image: Option<&str>,
        script: &str,
    ) -> (i32, String, String) {
        let empty = self.dir.join("no-hooks");
        std::fs::create_dir_all(&empty).unwrap();
        let mut cmd = self.podman_base(runtime);
        cmd.arg("--hooks-dir")
            .arg(if hooks { &self.hooks } else { &empty })
            .args([
                "run",
                "--rm",
                "--network",
                "none",
                "--ulimit",
                "nofile=20000:20000",
                "--ulimit",
                "nproc=4096:4096",
            ])
            .args(args);
        match image {
            Some(i) => cmd.arg(i),
            None => cmd.arg("--rootfs").arg(&self.rootfs),
        };
        cmd.args(["/bin/sh", "-c", script]);
        common::run(&mut cmd)
    }

    /// podman with this test's storage and hooks (runc), no subcommand yet.
    fn podman_hooked(&self) -> Command {
        let mut cmd = self.podman_base("runc");
        cmd.arg("--hooks-dir").arg(&self.hooks);
        cmd
    }

    /// A local image (no registry) of the busybox rootfs, built with `podman build
    /// --annotation` for each of `annotations`, as an image author would.
    fn image(&self, tag: &str, annotations: &[&str]) -> String {
        let tar = self.dir.join("rootfs.tar");
        let (c, _, err) = common::run(
            Command::new("tar")
                .arg("-C")
                .arg(&self.rootfs)
                .arg("-cf")
                .arg(&tar)
                .arg("."),
        );
        assert_eq!(c, 0, "{err}");
        let base = format!("localhost/{tag}-base:t");
        let (c, out, err) = common::run(self.podman_hooked().arg("import").arg(&tar).arg(&base));
        assert_eq!(c, 0, "podman import: {out}{err}");
        let ctx = self.dir.join(format!("{tag}-ctx"));
        std::fs::create_dir_all(&ctx).unwrap();
        std::fs::write(ctx.join("Containerfile"), format!("FROM {base}\n")).unwrap();
        let image = format!("localhost/{tag}:t");
        let mut cmd = self.podman_hooked();
        cmd.args(["build", "--network", "none", "-t", &image]);
        for a in annotations {
            cmd.args(["--annotation", a]);
        }
        let (c, out, err) = common::run(cmd.arg(&ctx));
        assert_eq!(c, 0, "podman build: {out}{err}");
        image
    }

    /// `podman run` of `image` (no `--rootfs`).
    fn run_image(&self, args: &[&str], image: &str, script: &str) -> (i32, String, String) {
        common::run(
            self.podman_hooked()
                .args([
                    "run",
                    "--rm",
                    "--network",
                    "none",
                    "--ulimit",
                    "nofile=20000:20000",
                    "--ulimit",
                    "nproc=4096:4096",
                ])
                .args(args)
                .args([image, "/bin/sh", "-c", script]),
        )
    }

    /// A device node made by hand in the rootfs (host side), outside the hook's knowledge.
    fn hand_node(&self, name: &str, major: u64, minor: u64) {
        nix::sys::stat::mknod(
            &self.rootfs.join("tmp").join(name),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(major, minor),
        )
        .unwrap();
    }

    /// An executable running `gpufence-runtime` with this node's config (podman `--runtime`).
    fn runtime_wrapper(&self) -> PathBuf {
        let wrapper = self.dir.join("gpufence-runtime.sh");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nGPUFENCE_CONFIG={} exec {} \"$@\"\n",
                self.config.display(),
                common::bin("gpufence-runtime").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        wrapper
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("node/gpufence.log")).unwrap_or_default()
    }

    fn state_entries(&self) -> Vec<String> {
        std::fs::read_dir(self.dir.join("node/state"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn rand_suffix() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::Relaxed) * 1000
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.runroot);
    }
}

const PROBE: &str = "cat /dev/nvidia0 2>&1; cat /tmp/gpu1 2>&1; \
    echo PRELOAD=$(cat /etc/ld.so.preload 2>&1); \
    ls /usr/lib/x86_64-linux-gnu/ /usr/local/nvidia/lib64/ 2>/dev/null | grep -c libcuda.so.580 ; \
    cat /run/gpufence/quota 2>&1; echo x > /run/gpufence/quota 2>&1 || echo QUOTA-RO; \
    test -s /etc/ld.so.cache && echo LDCACHE-PRESENT; true";

#[test]
fn annotated_container_gets_its_gpu_and_only_it() {
    let Some(e) = setup("hook-podman-basic") else {
        return;
    };
    e.hand_node("gpu1", 195, 1);
    let (code, out, err) = e.podman(&["--annotation", "gpufence.dev/devices=0"], PROBE);
    assert_eq!(code, 0, "{out}{err}\nlog:\n{}", e.log());
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].contains(ENXIO),
        "granted GPU must open to ENXIO: {out}"
    );
    assert!(
        lines[1].contains(EPERM),
        "hand-made GPU node must be EPERM: {out}"
    );
    assert!(
        out.contains("PRELOAD=/usr/lib/gpufence/libgpufence.so"),
        "{out}"
    );
    assert_eq!(lines[3], "1", "driver library mounted: {out}");
    assert!(out.contains("device.0.uuid=GPU-"), "quota file: {out}");
    assert!(out.contains("QUOTA-RO"), "quota must be read-only: {out}");
    assert!(out.contains("LDCACHE-PRESENT"), "ld cache refreshed: {out}");
    // poststop removed the container's state directory.
    assert!(
        e.state_entries()
            .iter()
            .all(|n| !n.chars().all(|c| c.is_ascii_hexdigit()) || n.len() != 64),
        "{:?}",
        e.state_entries()
    );
}

#[test]
fn container_without_annotation_gets_nothing() {
    let Some(e) = setup("hook-podman-none") else {
        return;
    };
    e.hand_node("gpu1", 195, 1);
    e.hand_node("gpu0", 195, 0);
    let (code, out, err) = e.podman(
        &[],
        "ls /dev/nvidia0 2>&1; cat /tmp/gpu0 2>&1; cat /etc/ld.so.preload 2>&1; ls /run/gpufence 2>&1; true",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("libgpufence"), "{out}");
    assert!(
        out.lines().filter(|l| l.contains("No such file")).count() >= 3,
        "{out}"
    );
    assert!(
        out.contains(EPERM),
        "runtime default rules deny GPUs: {out}"
    );
    assert!(!e.log().contains("enforcing plan"), "{}", e.log());
}

#[test]
fn v2_gate_alone_denies_ungranted_gpu_with_permissive_v1_rules() {
    let Some(e) = setup("hook-podman-bpf") else {
        return;
    };
    e.hand_node("gpu1", 195, 1);
    let permissive = ["--device-cgroup-rule", "c 195:* rwm"];
    // Control: with v1 rules allowing every GPU and no hook, the hand-made node opens (ENXIO).
    let (_, out, err) = e.podman(&permissive, "cat /tmp/gpu1 2>&1; true");
    assert!(out.contains(ENXIO), "v1 is permissive: {out}{err}");
    // With the hook: the v2 gate alone denies the GPU that was not granted.
    let mut args = permissive.to_vec();
    args.extend(["--annotation", "gpufence.dev/devices=0"]);
    let (code, out, err) = e.podman(
        &args,
        "cat /dev/nvidia0 2>&1; cat /tmp/gpu1 2>&1; cat /proc/self/cgroup | grep '^0::'",
    );
    assert_eq!(code, 0, "{out}{err}\n{}", e.log());
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].contains(ENXIO), "{out}");
    assert!(lines[1].contains(EPERM), "{out}");
    assert!(e.log().contains("v2 device gate attached"), "{}", e.log());
}

#[test]
fn attack_lib_dir_symlink_to_root() {
    let Some(e) = setup("hook-podman-libroot") else {
        return;
    };
    // Each library at its own path (the `files` layout), under the image's symlinked folder.
    let text = std::fs::read_to_string(&e.config).unwrap();
    std::fs::write(
        &e.config,
        text.replace("[runtime]", "[runtime]\ndriver-layout = \"files\""),
    )
    .unwrap();
    std::fs::create_dir_all(e.rootfs.join("usr/lib")).unwrap();
    std::os::unix::fs::symlink("/", e.rootfs.join("usr/lib/x86_64-linux-gnu")).unwrap();
    let etc = host_digest();
    let (code, out, err) = e.podman(
        &["--annotation", "gpufence.dev/devices=0"],
        "ls / | grep -c libcuda.so.580; cat /dev/nvidia0 2>&1; true",
    );
    // Either refused or confined: never a write outside the rootfs.
    if code == 0 {
        assert!(
            out.starts_with('1'),
            "library confined to the rootfs's /: {out}"
        );
        assert!(out.contains(ENXIO), "{out}");
    } else {
        assert!(err.contains("gpufence") || err.contains("hook"), "{err}");
    }
    assert_eq!(etc, host_digest());
    assert!(!Path::new("/libcuda.so.580.65.06").exists());
}

#[test]
fn attack_preload_symlink_to_host_path() {
    let Some(e) = setup("hook-podman-preload") else {
        return;
    };
    let victim = e.dir.join("victim-preload");
    std::fs::write(&victim, "HOST FILE\n").unwrap();
    std::os::unix::fs::symlink(&victim, e.rootfs.join("etc/ld.so.preload")).unwrap();
    let before = digest(&victim);
    let etc = host_digest();
    let (code, out, err) = e.podman(
        &["--annotation", "gpufence.dev/devices=0"],
        "cat /etc/ld.so.preload",
    );
    assert_eq!(code, 0, "{out}{err}\n{}", e.log());
    assert!(out.contains("/usr/lib/gpufence/libgpufence.so"), "{out}");
    assert_eq!(before, digest(&victim));
    assert_eq!(etc, host_digest());
}

#[test]
fn attack_dev_symlink_to_host_dir() {
    let Some(e) = setup("hook-podman-dev") else {
        return;
    };
    let hostdev = e.dir.join("host-dev");
    std::fs::create_dir_all(&hostdev).unwrap();
    std::fs::write(hostdev.join("marker"), "x").unwrap();
    std::fs::remove_dir_all(e.rootfs.join("dev")).unwrap();
    std::os::unix::fs::symlink(&hostdev, e.rootfs.join("dev")).unwrap();
    // Control run without the hook: runc 1.1.5 itself creates its /dev symlinks (fd, stdin,
    // ptmx, …) through the image's /dev symlink, on the host. That is runc's doing; what must
    // hold is that the hook adds nothing there.
    let (code, out, err) = e.podman(&[], "true");
    assert_eq!(code, 0, "{out}{err}");
    let before = digest(&hostdev);
    let (code, out, err) = e.podman(
        &["--annotation", "gpufence.dev/devices=0"],
        "cat /dev/nvidia0 2>&1; true",
    );
    if code == 0 {
        assert!(out.contains(ENXIO), "{out}");
    } else {
        assert!(!err.is_empty());
    }
    assert_eq!(
        before,
        digest(&hostdev),
        "the hook wrote into the host directory behind /dev"
    );
    assert!(
        !before
            .keys()
            .any(|p| p.to_string_lossy().contains("nvidia")),
        "{before:?}"
    );
}

#[test]
fn hook_ignores_ld_preload_in_the_container_env() {
    if !common::have("gcc") {
        eprintln!("SKIP: gcc");
        return;
    }
    let Some(e) = setup("hook-podman-ldpreload") else {
        return;
    };
    let marker = e.dir.join("PWNED");
    let src = e.dir.join("evil.c");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void f(void) {{ FILE *x = fopen(\"{}\", \"w\"); if (x) fclose(x); }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let so = e.dir.join("evil.so");
    let (c, _, err) = common::run(
        Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&src),
    );
    assert_eq!(c, 0, "{err}");
    // Sanity: the library does write the marker when preloaded.
    let probe = e.dir.join("PROBE");
    let _ = Command::new("/bin/true").env("LD_PRELOAD", &so).status();
    assert!(marker.exists(), "evil.so works");
    std::fs::remove_file(&marker).unwrap();
    let _ = probe;
    let env = format!("LD_PRELOAD={}", so.display());
    let (code, out, err) = e.podman(
        &["--annotation", "gpufence.dev/devices=0", "--env", &env],
        "cat /dev/nvidia0 2>&1; true",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(ENXIO), "{out}");
    assert!(
        !marker.exists(),
        "something ran with the container's LD_PRELOAD"
    );
}

#[test]
fn attack_dotdot_in_annotation_and_cdi_spec_is_refused() {
    let Some(e) = setup("hook-podman-dotdot") else {
        return;
    };
    let etc = host_digest();
    // gpufence annotation
    let (code, out, err) = e.podman(&["--annotation", "gpufence.dev/devices=../0"], "true");
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("gpufence.dev/devices"), "{err}");
    // CDI spec of another kind whose device path climbs out of /dev
    let fake = e.dir.join("fake1");
    nix::sys::stat::mknod(
        &fake,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(195, 1),
    )
    .unwrap();
    let spec_path = PathBuf::from(format!(
        "/var/run/cdi/gpufence-hooktest-{}.json",
        std::process::id()
    ));
    std::fs::create_dir_all("/var/run/cdi").unwrap();
    let spec = serde_json::json!({"cdiVersion": "0.5.0", "kind": "hooktest.example.com/evil",
        "devices": [{"name": "x", "containerEdits": {"deviceNodes": [{
            "path": "/dev/../../etc/gpufence-evil0", "hostPath": fake,
            "type": "c", "major": 195, "minor": 1}]}}]});
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let (code, out, err) = e.podman(
        &[
            "--annotation",
            "cdi.k8s.io/hooktest=hooktest.example.com/evil=x",
        ],
        "ls /etc; true",
    );
    let _ = std::fs::remove_file(&spec_path);
    assert_ne!(code, 0, "{out}{err}");
    assert!(!Path::new("/etc/gpufence-evil0").exists());
    assert!(!e.rootfs.join("etc/gpufence-evil0").exists());
    assert_eq!(etc, host_digest());
}

/// What a container sees of its GPU allocation: device nodes (type, numbers, mode, owner, what
/// opening them gives), gpufence-related mounts with ro/rw, the quota, the preload file.
fn allocation_view(out: &str) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for l in out.lines() {
        if let Some(rest) = l.strip_prefix("MI ") {
            let f: Vec<&str> = rest.split(' ').collect();
            if f.len() < 6 {
                continue;
            }
            let mp = f[4];
            let wanted = mp.starts_with("/usr/")
                || mp.starts_with("/lib")
                || mp == "/etc/ld.so.preload"
                || mp.starts_with("/run/gpufence")
                || mp.starts_with("/dev/nvidia");
            if wanted {
                let ro = f[5].split(',').any(|o| o == "ro");
                v.push(format!("mount {mp} {}", if ro { "ro" } else { "rw" }));
            }
        } else if !l.trim().is_empty() {
            v.push(l.to_string());
        }
    }
    v.sort();
    v.dedup();
    v
}

#[test]
fn hook_and_runtime_give_the_same_allocation() {
    let Some(e) = setup("hook-podman-vs-runtime") else {
        return;
    };
    let wrapper = e.runtime_wrapper();
    let script = "for f in /dev/nvidia*; do echo \"NODE $(stat -c '%n %F %t:%T %a %u:%g' $f) \
        $(cat $f 2>&1 | head -c 80)\"; done; \
        grep -v '^#' /run/gpufence/quota | sed 's/^/QUOTA /'; \
        sed 's/^/PRELOAD /' /etc/ld.so.preload; \
        test -s /etc/ld.so.cache && echo LDCACHE-PRESENT; \
        sed 's/^/LDCONF /' /etc/ld.so.conf.d/*.conf; \
        sed 's/^/MI /' /proc/self/mountinfo";
    let ann = [
        "--annotation",
        "gpufence.dev/devices=1",
        "--annotation",
        "gpufence.dev/memory=4Gi",
        "--annotation",
        "gpufence.dev/cores=50",
    ];
    let (c1, via_hook, err1) = e.podman_with("runc", true, &ann, script);
    assert_eq!(c1, 0, "{via_hook}{err1}\n{}", e.log());
    let (c2, via_runtime, err2) = e.podman_with(wrapper.to_str().unwrap(), false, &ann, script);
    assert_eq!(c2, 0, "{via_runtime}{err2}\n{}", e.log());
    let (h, r) = (allocation_view(&via_hook), allocation_view(&via_runtime));
    assert!(
        h.iter().any(|l| l.starts_with("NODE /dev/nvidia1 ")),
        "{h:#?}"
    );
    assert!(
        h.iter()
            .any(|l| l.contains("QUOTA device.0.memory=4294967296")),
        "{h:#?}"
    );
    assert!(
        h.iter().any(|l| l == "mount /etc/ld.so.preload ro"),
        "{h:#?}"
    );
    assert!(
        h.iter().any(|l| l == "mount /run/gpufence/quota ro"),
        "{h:#?}"
    );
    assert!(
        !h.iter().any(|l| l.starts_with("NODE /dev/nvidia0 ")),
        "{h:#?}"
    );
    assert!(h.iter().any(|l| l == "LDCACHE-PRESENT"), "{h:#?}");
    assert_eq!(h, r, "hook and runtime differ");
}

#[test]
fn create_runtime_stage_works_too() {
    let Some(e) = setup_with("hook-podman-cr", None, "", "createRuntime") else {
        return;
    };
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(e.hooks.join("gpufence.json")).unwrap())
            .unwrap();
    assert_eq!(v["stages"], serde_json::json!(["createRuntime"]));
    e.hand_node("gpu1", 195, 1);
    let (code, out, err) = e.podman(&["--annotation", "gpufence.dev/devices=0"], PROBE);
    assert_eq!(code, 0, "{out}{err}\n{}", e.log());
    assert!(out.lines().next().unwrap_or("").contains(ENXIO), "{out}");
    assert!(out.contains(EPERM), "{out}");
    assert!(e.log().contains("stage=\"createRuntime\""), "{}", e.log());
}

#[test]
fn mig_device_gets_its_capability_nodes_in_a_subdirectory() {
    let Some(e) = setup_with("hook-podman-mig", Some(0), "", "prestart") else {
        return;
    };
    let (code, out, err) = e.podman(
        &["--annotation", "gpufence.dev/devices=0:1"],
        "ls /dev/nvidia-caps/; for f in /dev/nvidia0 /dev/nvidia-caps/*; do cat $f 2>&1; done; \
         grep uuid /run/gpufence/quota",
    );
    assert_eq!(code, 0, "{out}{err}\n{}", e.log());
    assert!(out.contains("nvidia-cap"), "caps nodes: {out}");
    let opened = out.lines().filter(|l| l.contains(ENXIO)).count();
    assert!(opened >= 2, "GPU node and caps nodes open to ENXIO: {out}");
    assert!(!out.contains(EPERM), "{out}");
    assert!(out.contains("uuid=MIG-"), "{out}");
}

#[test]
fn trusted_env_dialect_matches_every_container() {
    let Some(e) = setup_with(
        "hook-podman-env",
        None,
        "\n[allocation]\ntrust-env = [\"nvidia\"]\n",
        "prestart",
    ) else {
        return;
    };
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(e.hooks.join("gpufence.json")).unwrap())
            .unwrap();
    assert_eq!(v["when"], serde_json::json!({"always": true}));
    let (code, out, err) = e.podman(
        &["--env", "NVIDIA_VISIBLE_DEVICES=1"],
        "cat /dev/nvidia1 2>&1; ls /dev/nvidia0 2>&1; true",
    );
    assert_eq!(code, 0, "{out}{err}\n{}", e.log());
    assert!(out.contains(ENXIO), "{out}");
    assert!(
        out.contains("No such file"),
        "only the GPU the env names: {out}"
    );
    // No env, no annotation: the hook runs and grants nothing.
    let (code, out, err) = e.podman(&[], "ls /dev/ | grep -c nvidia; true");
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.trim(), "0", "{out}");
    assert!(e.log().contains("no allocation"), "{}", e.log());
}

#[test]
fn read_only_rootfs_container_works() {
    let Some(e) = setup("hook-podman-ro") else {
        return;
    };
    // (no hand-made node in /tmp: podman's --read-only tmpfs copy-up cannot copy device nodes)
    let (code, out, err) = e.podman(
        &["--read-only", "--annotation", "gpufence.dev/devices=0"],
        PROBE,
    );
    assert_eq!(code, 0, "{out}{err}\n{}", e.log());
    assert!(out.lines().next().unwrap_or("").contains(ENXIO), "{out}");
    assert!(
        out.contains("PRELOAD=/usr/lib/gpufence/libgpufence.so"),
        "{out}"
    );
    assert!(out.contains("LDCACHE-PRESENT"), "{out}");
}

#[test]
fn user_namespace_container_works() {
    let Some(e) = setup("hook-podman-userns") else {
        return;
    };
    // The rootfs must belong to the container's root (uid 200000 on the host).
    let (c, _, err) = common::run(
        Command::new("chown")
            .args(["-R", "-h", "200000:200000"])
            .arg(&e.rootfs),
    );
    assert_eq!(c, 0, "{err}");
    let (code, out, err) = e.podman(
        &[
            "--uidmap",
            "0:200000:65536",
            "--gidmap",
            "0:200000:65536",
            "--annotation",
            "gpufence.dev/devices=0",
        ],
        "cat /dev/nvidia0 2>&1; cat /etc/ld.so.preload; cat /run/gpufence/quota | grep -c uuid",
    );
    if code != 0 && err.contains("uid") && !err.contains("gpufence") {
        eprintln!("SKIP: podman cannot map uids here: {err}");
        return;
    }
    assert_eq!(code, 0, "{out}{err}\n{}", e.log());
    assert!(out.contains(ENXIO), "{out}");
    assert!(out.contains("libgpufence.so"), "{out}");
}

/// Issue 15.4: an image `VOLUME` at `/run/gpufence`, at the quota, at the shim's directory or at
/// `/etc/ld.so.preload` never hides or replaces gpufence's mounts — through the hook and through
/// `gpufence-runtime` (which drops such mounts from `config.json` and mounts parent-first). Before
/// the fix the runtime mounted the image's writable volume at the quota first and the state
/// directory over it, so container root rewrote the host's quota file.
#[test]
fn image_volumes_over_gpufence_paths_do_not_hide_its_mounts() {
    let Some(e) = setup("hook-podman-volumes") else {
        return;
    };
    let tar = e.dir.join("rootfs.tar");
    let (c, o, er) = common::run(
        Command::new("tar")
            .arg("-C")
            .arg(&e.rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
    );
    assert_eq!(c, 0, "{o}{er}");
    let image = "localhost/gpufence-volumes:test";
    let (c, o, er) = common::run(
        e.podman_base("runc")
            .args([
                "import",
                "--change",
                "VOLUME [\"/run/gpufence/quota\", \"/usr/lib/gpufence\"]",
            ])
            .arg(&tar)
            .arg(image),
    );
    assert_eq!(c, 0, "podman import: {o}{er}");
    let wrapper = e.runtime_wrapper();
    let script = "grep -c '^device.0.memory=67108864$' /run/gpufence/quota | sed 's/^/QUOTA-LINES /'; \
        (echo device.0.memory=99999999999 > /run/gpufence/quota) 2>/dev/null && echo QUOTA-WRITTEN; \
        grep ' /run/gpufence/quota ' /proc/mounts | tail -1 | cut -d' ' -f4 | cut -d, -f1 | sed 's/^/QUOTA-MOUNT /'; \
        test -s /usr/lib/gpufence/libgpufence.so && echo SHIM-PRESENT; \
        grep ' /run/gpufence ' /proc/mounts | tail -1 | cut -d' ' -f3 | sed 's/^/STATE-FS /'; true";
    let ann = [
        "--annotation",
        "gpufence.dev/devices=1",
        "--annotation",
        "gpufence.dev/memory=64Mi",
    ];
    for (runtime, hooks) in [("runc", true), (wrapper.to_str().unwrap(), false)] {
        let (code, out, err) = e.podman_from(runtime, hooks, &ann, Some(image), script);
        let ctx = format!("{runtime}: {out}{err}\n{}", e.log());
        assert_eq!(code, 0, "{ctx}");
        assert!(out.contains("QUOTA-LINES 1"), "{ctx}");
        assert!(!out.contains("QUOTA-WRITTEN"), "{ctx}");
        assert!(out.contains("QUOTA-MOUNT ro"), "{ctx}");
        assert!(out.contains("SHIM-PRESENT"), "{ctx}");
        assert!(out.contains("STATE-FS tmpfs"), "{ctx}");
    }
}

/// Issue 15 (7): podman copies an image's annotations into the container's, so an image built
/// with `--annotation gpufence.dev/devices=all` asked for every GPU in hook mode. By default a
/// libpod container's allocation annotations are not trusted: the image gets nothing, and the
/// decision is logged with the container id. A node that opts in gets the old behaviour.
#[test]
fn libpod_image_annotation_grants_nothing() {
    let Some(e) = setup_with(
        "hook-podman-libpod",
        None,
        "\n[allocation]\ntrust-libpod-annotations = false\n",
        "prestart",
    ) else {
        return;
    };
    // The image also tries to pass for CRI-O: podman applies image annotations over its own.
    let image = e.image(
        "gpufence-libpod-evil",
        &["gpufence.dev/devices=all", "io.container.manager=cri-o"],
    );
    let script = "ls /dev | grep -c nvidia; cat /run/gpufence/quota 2>&1; cat /proc/self/cgroup | grep -m1 -o '[0-9a-f]\\{64\\}'; true";
    let (code, out, err) = e.run_image(&[], &image, script);
    assert_eq!(code, 0, "{out}{err}\n{}", e.log());
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "0", "no GPU from an image annotation: {out}");
    assert!(lines[1].contains("No such file"), "no quota: {out}");
    let log = e.log();
    let line = log
        .lines()
        .find(|l| l.contains("ignored gpufence.dev/devices of a podman (libpod) container"))
        .unwrap_or_else(|| panic!("decision not logged:\n{log}"));
    assert!(line.contains("container="), "{line}");
    assert!(!log.contains("enforcing plan"), "{log}");

    // The same image where the node opts in: the annotation is honoured (what the attack got).
    let cfg = std::fs::read_to_string(&e.config).unwrap().replace(
        "trust-libpod-annotations = false",
        "trust-libpod-annotations = true",
    );
    std::fs::write(&e.config, cfg).unwrap();
    let (code, out, err) = e.run_image(&[], &image, "ls /dev | grep -c nvidia[0-9]; true");
    assert_eq!(code, 0, "{out}{err}\n{}", e.log());
    assert_eq!(
        out.trim(),
        "2",
        "opted in: every GPU the image asked for: {out}"
    );
}

/// Issue 15 (2): an image whose `/etc/ld.so.conf` is a FIFO blocked the ld cache refresh
/// (`ldconfig`) in the hook's forked worker forever; the worker kept runc's hook pipes open, so
/// podman never returned. The refresh no longer reads `ld.so.conf` (nor opens anything of the
/// image but regular files), and the worker is bounded by `timeouts.worker` anyway: podman
/// returns at once and the container runs with its GPU.
#[test]
fn blocking_image_does_not_hang_podman() {
    let Some(e) = setup_with(
        "hook-podman-fifo",
        None,
        "\n[timeouts]\nworker = 2\n",
        "prestart",
    ) else {
        return;
    };
    std::fs::create_dir_all(e.rootfs.join("etc")).unwrap();
    nix::unistd::mkfifo(
        &e.rootfs.join("etc/ld.so.conf"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let started = std::time::Instant::now();
    // podman under a watchdog: a hang is a failure, not a stuck test run.
    let mut child = e.podman_hooked();
    child
        .args([
            "run",
            "--rm",
            "--network",
            "none",
            "--ulimit",
            "nofile=20000:20000",
            "--ulimit",
            "nproc=4096:4096",
            "--annotation",
            "gpufence.dev/devices=0",
            "--rootfs",
        ])
        .arg(&e.rootfs)
        .args(["/bin/sh", "-c", "echo STARTED"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = child.spawn().unwrap();
    let mut finished = None;
    while started.elapsed() < std::time::Duration::from_secs(60) {
        if let Some(st) = child.try_wait().unwrap() {
            finished = Some(st);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    if finished.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "podman still running after 60 s (hook worker blocked)\n{}",
            e.log()
        );
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}\n{}", e.log());
    assert!(stdout.contains("STARTED"), "{stdout}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    // The FIFO is still a FIFO: nothing opened it for writing or replaced it.
    let ft = std::fs::symlink_metadata(e.rootfs.join("etc/ld.so.conf"))
        .unwrap()
        .file_type();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&ft));
}

/// `quota.backend = "driver"` in hook mode: the hook sets the driver's memory limit through
/// NVML — in a forked child under the worker deadline, so the hook stays single-threaded for
/// its namespace worker (NVML may start threads) — and the container runs.
#[test]
fn driver_backend_limits_are_set_by_the_hook() {
    let Some(e) = setup_with(
        "hook-podman-drv",
        None,
        "[quota]\nbackend = \"driver\"\n",
        "prestart",
    ) else {
        return;
    };
    // The simulated driver with NVML memory limits, and the inventory re-taken.
    let node = e.dir.join("node");
    let limits = node.join("driver-state/memlimits");
    std::fs::create_dir_all(&limits).unwrap();
    for f in [
        node.join("node.json"),
        node.join("driver/usr/lib/x86_64-linux-gnu/gpufence-mock-node.json"),
    ] {
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
        v["memory_limits_dir"] = limits.display().to_string().into();
        std::fs::write(&f, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    }
    let _ = std::fs::remove_file(node.join("state/inventory.json"));
    let (code, _, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&e.config)
            .arg("inventory"),
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = e.podman(
        &[
            "--annotation",
            "gpufence.dev/devices=0",
            "--annotation",
            "gpufence.dev/memory=100Mi",
        ],
        "echo RAN",
    );
    let log = e.log();
    assert_eq!(code, 0, "{out}{err}\n{log}");
    assert!(out.contains("RAN"), "{out}");
    assert!(log.contains("driver memory limit set"), "{log}");
}
