//! End to end: podman 4.3 (runc, `--network none`, vfs, cgroupfs, ulimits within this machine's
//! hard limits) consumes the spec written by `gpufence cdi generate` for a simulated 2-GPU node and
//! runs a glibc container with `--device gpufence.dev/gpu=1`:
//! * `/dev/nvidia1` opens with ENXIO (allowed by the device cgroup; a fake node has no driver),
//! * no other `/dev/nvidiaN` exists,
//! * the driver files are mounted read-only,
//! * `dlopen("libnvidia-ml.so.1")` works (a C program built with gcc) in an image with its own ld
//!   cache, and the mock NVML inside sees exactly one GPU; the simulated `nvidia-smi` runs —
//!   with the default layout (`folders`) through `LD_LIBRARY_PATH` naming the library folder, no
//!   process per container; with `runtime.driver-layout = "files"` through the ldcache
//!   createContainer hook. Each against a control: the same spec without that edit fails.
//!
//! The CDI kind is fixed (`gpufence.dev/gpu`) and two spec files defining the same device at the
//! same priority make podman drop both; so this test renames the kind in the generated file to
//! one only it uses, and holds [`CDI_LOCK`] (flock) while its file exists (a convention for every
//! test writing specs into /var/run/cdi).

mod common;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The kind this test's spec uses (see below).
const KIND: &str = "gpufence-e2e.dev/gpu";

/// Lock serialising writers of `gpufence.dev/gpu` specs in the CDI directories (any test binary).
pub const CDI_LOCK: &str = "/run/lock/gpufence-cdi-kind.lock";

struct CdiSpec {
    path: PathBuf,
    _lock: File,
}

impl CdiSpec {
    fn lock() -> File {
        std::fs::create_dir_all("/run/lock").unwrap();
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(CDI_LOCK)
            .unwrap();
        // SAFETY: flock on a valid fd; released when the File is dropped.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        f
    }
}

impl Drop for CdiSpec {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

const DLTEST_C: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
typedef int (*init_t)(void);
typedef int (*count_t)(unsigned int *);
int main(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) { printf("DLOPEN FAILED: %s\n", dlerror()); return 1; }
    init_t init = (init_t)dlsym(h, "nvmlInit_v2");
    count_t count = (count_t)dlsym(h, "nvmlDeviceGetCount_v2");
    if (!init || !count) { printf("DLSYM FAILED\n"); return 1; }
    unsigned int n = 0;
    int r = init();
    int c = count(&n);
    printf("DLOPEN OK init=%d count_rc=%d count=%u\n", r, c, n);
    return 0;
}
"#;

fn podman(scratch: &Path) -> Command {
    let mut c = Command::new("podman");
    c.arg("--root")
        .arg(scratch.join("podman/root"))
        .arg("--runroot")
        .arg(scratch.join("podman/run"))
        .args([
            "--storage-driver",
            "vfs",
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "file",
        ])
        .arg("--runtime")
        .arg(common::runc());
    c
}

#[test]
fn podman_consumes_generated_spec() {
    if common::skip_unless(&["podman", "runc", "gcc"]) {
        return;
    }
    consume("folders");
    consume("files");
}

/// The generated spec with `runtime.driver-layout = layout`, consumed by podman.
fn consume(layout: &str) {
    let folders = layout == "folders";
    // Short: podman refuses a runroot over 50 characters.
    let scratch = common::scratch(if folders { "podman-cdi" } else { "podman-cdf" });
    let node = scratch.join("node");
    let cfg = common::sim_node(&node, 2, None);
    let text = std::fs::read_to_string(&cfg).unwrap();
    let text = text.replace(
        "[runtime]",
        &format!("[runtime]\ndriver-layout = \"{layout}\""),
    );
    assert!(text.contains("driver-layout"), "{text}");
    std::fs::write(&cfg, text).unwrap();

    let rootfs = common::glibc_rootfs(&scratch);
    // An image with its own ld cache (the build host's).
    if Path::new("/etc/ld.so.cache").is_file() {
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        std::fs::copy("/etc/ld.so.cache", rootfs.join("etc/ld.so.cache")).unwrap();
    }
    let src = scratch.join("dltest.c");
    std::fs::write(&src, DLTEST_C).unwrap();
    let (rc, _, err) = common::run(
        Command::new("gcc")
            .arg("-o")
            .arg(rootfs.join("bin/dltest"))
            .arg(&src),
    );
    assert_eq!(rc, 0, "gcc: {err}");

    let lock = CdiSpec::lock();
    let spec_path = PathBuf::from(format!(
        "/var/run/cdi/gpufence-test-{}-{}.yaml",
        std::process::id(),
        scratch.file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all("/var/run/cdi").unwrap();
    let spec = CdiSpec {
        path: spec_path.clone(),
        _lock: lock,
    };
    let (rc, _, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&cfg)
            .args(["cdi", "generate", "--output"])
            .arg(&spec.path),
    );
    assert_eq!(rc, 0, "cdi generate: {err}");
    // Another spec of the same kind at the same priority (e.g. the one `make demo` leaves in
    // /var/run/cdi) would make podman drop both: consume the generated file byte for byte except
    // its kind line, renamed to a kind only this test uses.
    let text = std::fs::read_to_string(&spec.path).unwrap();
    assert!(text.contains("\nkind: gpufence.dev/gpu\n"), "{text}");
    let text = text.replace("\nkind: gpufence.dev/gpu\n", &format!("\nkind: {KIND}\n"));
    std::fs::write(&spec.path, text).unwrap();

    let script = r#"
for n in /dev/nvidia*; do echo "NODE $n"; done
dd if=/dev/nvidia1 of=/dev/null bs=1 count=1 2>&1 | head -1 | sed 's/^/OPEN1 /'
ls /usr/lib/x86_64-linux-gnu/ /usr/local/nvidia/lib64/ 2>/dev/null | sed 's/^/LIB /'
grep -E ' (/usr/lib/x86_64-linux-gnu/libnvidia-ml.so[^ ]*|/usr/local/nvidia/lib64) ' /proc/self/mounts | sed 's/^/MOUNT /'
cat /etc/ld.so.conf.d/00-gpufence.conf 2>/dev/null | sed 's/^/CONF /'
echo "LLP $LD_LIBRARY_PATH"
/bin/dltest || true
/usr/bin/nvidia-smi | sed 's/^/SMI /'
echo END
"#;
    let run = |device: &str, tag: &str| {
        let name = format!("gpufence-cdi-{tag}-{}", std::process::id());
        common::run(
            podman(&scratch)
                .args(["run", "--rm", "--name", &name, "--network", "none"])
                .args([
                    "--ulimit",
                    "nofile=20000:20000",
                    "--ulimit",
                    "nproc=4096:4096",
                ])
                .args(["--device", device, "--rootfs"])
                .arg(&rootfs)
                .args(["/bin/sh", "-c", script]),
        )
    };

    // Control: the same spec without the ldcache hook, or without LD_LIBRARY_PATH (under a
    // test-only kind), leaves the library unresolvable by soname — so the positive result
    // below is that edit's doing.
    let mut nohook: gpufence::cdi::Spec =
        yaml_serde::from_str(&std::fs::read_to_string(&spec.path).unwrap()).unwrap();
    if folders {
        assert!(
            nohook.container_edits.hooks.is_empty(),
            "no hook: {nohook:?}"
        );
        assert_eq!(
            nohook.container_edits.env,
            ["LD_LIBRARY_PATH=/usr/local/nvidia/lib64"]
        );
        nohook.container_edits.env.clear();
    } else {
        assert_eq!(nohook.container_edits.hooks.len(), 1);
        nohook.container_edits.hooks.clear();
    }
    nohook.kind = "gpufence-test.dev/nohook".to_string();
    let nohook_path = PathBuf::from(format!("{}-nohook.yaml", spec.path.display()));
    std::fs::write(&nohook_path, yaml_serde::to_string(&nohook).unwrap()).unwrap();
    let (rc, out, err) = run("gpufence-test.dev/nohook=1", "nohook");
    let _ = std::fs::remove_file(&nohook_path);
    assert_eq!(
        rc, 0,
        "podman (control) failed\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert!(
        out.contains("DLOPEN FAILED"),
        "without the hook dlopen must fail:\n{out}"
    );

    let (rc, out, err) = run(&format!("{KIND}=1"), "hook");
    drop(spec);
    assert!(!spec_path.exists());
    assert_eq!(rc, 0, "podman failed\nstdout:\n{out}\nstderr:\n{err}");

    let nodes: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("NODE "))
        .collect();
    let gpus: Vec<&&str> = nodes
        .iter()
        .filter(|n| {
            n.trim_start_matches("/dev/nvidia")
                .chars()
                .all(|c| c.is_ascii_digit())
                && n.len() > "/dev/nvidia".len()
        })
        .collect();
    assert_eq!(gpus, [&"/dev/nvidia1"], "only the allocated GPU:\n{out}");
    for ctl in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] {
        assert!(nodes.contains(&ctl), "{ctl} missing:\n{out}");
    }
    assert!(
        out.contains("OPEN1") && out.contains("No such device or address"),
        "nvidia1 must open with ENXIO:\n{out}"
    );
    for lib in [
        "libnvidia-ml.so.580.65.06",
        "libcuda.so.580.65.06",
        "libnvidia-ml.so.1",
        "libcuda.so.1",
        "gpufence-mock-node.json",
    ] {
        assert!(out.contains(&format!("LIB {lib}")), "{lib} missing:\n{out}");
    }
    let mount = out
        .lines()
        .find(|l| l.starts_with("MOUNT "))
        .unwrap_or_else(|| panic!("no mount line:\n{out}"));
    assert!(
        mount.contains(" ro,") || mount.contains(" ro "),
        "driver file mounted read-only: {mount}"
    );
    if folders {
        assert!(mount.contains(" /usr/local/nvidia/lib64 "), "{mount}");
        assert!(
            out.contains("LLP /usr/local/nvidia/lib64") && !out.contains("CONF "),
            "LD_LIBRARY_PATH, no ld cache refresh:\n{out}"
        );
    } else {
        assert!(
            out.contains("CONF /usr/lib/x86_64-linux-gnu"),
            "ld.so.conf.d drop-in:\n{out}"
        );
    }
    assert!(
        out.contains("DLOPEN OK init=0 count_rc=0 count=1"),
        "dlopen by soname:\n{out}\n{err}"
    );
    assert!(
        out.contains("SMI GPU 0: NVIDIA H100 80GB HBM3") && out.contains("memory.total=81559MiB"),
        "nvidia-smi:\n{out}\n{err}"
    );
    assert!(!out.contains("SMI GPU 1"), "one GPU only:\n{out}");
    assert!(out.contains("END"));
    // The hook logged its decision with the container id; with the folders layout no gpufence
    // process ran.
    let log = std::fs::read_to_string(node.join("gpufence.log")).unwrap_or_default();
    assert_eq!(
        log.contains("ld cache updated"),
        !folders,
        "hook log:\n{log}"
    );
}
