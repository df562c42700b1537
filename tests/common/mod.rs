//! Shared helpers for end-to-end tests: artifact paths, root checks, rootfs builders, the
//! simulated node. Tests that need root or a tool skip with a message when it is missing —
//! `make test` runs as root with every tool installed, so there they always run.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>` of this build.
pub fn target_dir() -> PathBuf {
    // CARGO_BIN_EXE_* points into target/<profile>/.
    PathBuf::from(env!("CARGO_BIN_EXE_gpufence"))
        .parent()
        .expect("bin dir")
        .to_path_buf()
}

/// A binary of the root package.
pub fn bin(name: &str) -> PathBuf {
    target_dir().join(name)
}

/// A cdylib of the workspace (`libgpufence.so`, `libgpufence_mock_nvml.so`, …). The Makefile
/// builds the whole workspace before `cargo test`; a missing library is a test failure.
pub fn cdylib(file: &str) -> PathBuf {
    let p = target_dir().join(file);
    assert!(
        p.exists(),
        "{} missing: run `cargo build --workspace` (make test does) first",
        p.display()
    );
    p
}

/// The container engines without known escapes the end-to-end tests run on (runc 1.5.1,
/// containerd 2.3.4, `ctr`): `ENGINES_DIR` (the Makefile sets it), else the project's shared
/// `../shared/engines/bin` beside the checkout (or one level further up); `None` when absent.
pub fn engines_dir() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        std::env::var_os("ENGINES_DIR").map(PathBuf::from),
        Some(root.join("../shared/engines/bin")),
        Some(root.join("../../shared/engines/bin")),
    ]
    .into_iter()
    .flatten()
    .find(|d| d.join("runc").is_file())
    .map(|d| std::fs::canonicalize(&d).unwrap_or(d))
}

/// The runc every end-to-end test runs: the engines' (runc 1.5.1, [`engines_dir`]), else the
/// host's `/usr/sbin/runc` (Debian 12's 1.1.5 lacks escape fixes: said once on stderr).
pub fn runc() -> PathBuf {
    static NOTE: std::sync::Once = std::sync::Once::new();
    match engines_dir() {
        Some(d) => d.join("runc"),
        None => {
            NOTE.call_once(|| {
                eprintln!("note: no ENGINES_DIR with runc 1.5.1: using the host's /usr/sbin/runc")
            });
            PathBuf::from("/usr/sbin/runc")
        }
    }
}

/// `PATH` with the engines first (containerd finds its shim, the shim its runc, through PATH).
pub fn engines_path() -> std::ffi::OsString {
    let old = std::env::var_os("PATH").unwrap_or_default();
    match engines_dir() {
        Some(d) => {
            let mut p = d.into_os_string();
            p.push(":");
            p.push(old);
            p
        }
        None => old,
    }
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool} >/dev/null 2>&1")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Installs tools `make test` leaves out of its up-front set-up because one test alone uses
/// them and they are slow to get (`make package-deps` compiles cargo-deb and cargo-generate-rpm):
/// as root, when any of `tools` is missing, runs `make TARGET` in the repository with `who` in its
/// `>> WHO: installing …` line. Its output goes straight to the terminal, past libtest's capture,
/// so a run shows where its time went. What still misses afterwards is `skip_unless`'s to
/// report (a failure under CI).
pub fn install_with_make(target: &str, who: &str, tools: &[&str]) {
    if !is_root() || tools.iter().all(|t| have(t)) {
        return;
    }
    let status = Command::new("make")
        .args(["-s", "--no-print-directory", target])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("DEPS_FOR", who)
        .stdin(std::process::Stdio::null())
        .status();
    if !status.as_ref().is_ok_and(|s| s.success()) {
        eprintln!("{who}: make {target}: {status:?}");
    }
}

/// Skip (return true) unless root and all tools are present. Under CI (`CI=true`) a missing
/// prerequisite is a failure, not a skip, so a green CI always means the e2e tests ran.
pub fn skip_unless(tools: &[&str]) -> bool {
    let mut missing: Vec<String> = tools
        .iter()
        .filter(|t| !have(t))
        .map(|t| t.to_string())
        .collect();
    if !is_root() {
        missing.push("root".into());
    }
    if missing.is_empty() {
        return false;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("GPUFENCE_E2E_REQUIRED").is_ok()
    {
        panic!("e2e prerequisites missing: {}", missing.join(", "));
    }
    eprintln!("SKIP: missing {}", missing.join(", "));
    true
}

/// A unique scratch directory (kept for inspection under /tmp/gpufence-tests until a later test
/// process sweeps it: directories of test processes that are gone are removed on first use, so
/// repeated runs do not fill the disk).
pub fn scratch(name: &str) -> PathBuf {
    let base = PathBuf::from("/tmp/gpufence-tests");
    std::fs::create_dir_all(&base).unwrap();
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(|| sweep_dead(&base));
    let d = base.join(format!("{name}-{}-{}", std::process::id(), unique()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Remove `<name>-<pid>-<n>` directories whose process no longer exists. A directory with
/// anything mounted below it is left alone (removing through a bind mount would delete the
/// mounted files).
fn sweep_dead(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mount_points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .collect();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let mut parts = name.rsplitn(3, '-');
        let (Some(_n), Some(pid), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = e.path();
        let prefix = format!("{}/", dir.display());
        if mount_points
            .iter()
            .any(|m| *m == dir.to_string_lossy() || m.starts_with(&prefix))
        {
            continue;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Static busybox rootfs (`/bin/busybox` from busybox-static) with applet links.
pub fn busybox_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    for d in [
        "bin", "dev", "proc", "sys", "etc", "tmp", "lib", "usr/lib", "run",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("busybox-static installed");
    for c in [
        "sh", "ls", "cat", "echo", "env", "mount", "grep", "sleep", "id", "head", "stat", "test",
        "printf", "dd", "true", "touch", "rm", "mknod", "readlink", "wc",
    ] {
        let _ = std::os::unix::fs::symlink("busybox", root.join("bin").join(c));
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
    root
}

/// Busybox rootfs plus the host's glibc loader and libc, so dynamically linked test programs
/// (and dlopen of driver libraries through the ld cache) work inside the container.
pub fn glibc_rootfs(dir: &Path) -> PathBuf {
    let root = busybox_rootfs(dir);
    let libdir = root.join("lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&libdir).unwrap();
    std::fs::create_dir_all(root.join("lib64")).unwrap();
    for lib in [
        "libc.so.6",
        "libm.so.6",
        "libgcc_s.so.1",
        "libdl.so.2",
        "libpthread.so.0",
    ] {
        let src = Path::new("/lib/x86_64-linux-gnu").join(lib);
        if src.exists() {
            std::fs::copy(&src, libdir.join(lib)).unwrap();
        }
    }
    std::fs::copy(
        "/lib64/ld-linux-x86-64.so.2",
        root.join("lib64/ld-linux-x86-64.so.2"),
    )
    .unwrap();
    root
}

/// A simulated node built by `gpufence-sim node`; returns the config.toml path it printed.
pub fn sim_node(dir: &Path, gpus: u32, mig_gpu: Option<u32>) -> PathBuf {
    let mut cmd = Command::new(bin("gpufence-sim"));
    cmd.args(["node", "--dir"])
        .arg(dir)
        .args(["--gpus", &gpus.to_string()]);
    if let Some(m) = mig_gpu {
        cmd.args(["--mig-gpu", &m.to_string()]);
    }
    let out = cmd.output().expect("run gpufence-sim");
    assert!(
        out.status.success(),
        "gpufence-sim failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Run a command, return (status code, stdout, stderr).
pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Content digest of a host tree (type, mode, size, contents, link targets), for before/after.
pub fn digest(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        use std::os::unix::fs::MetadataExt;
        let desc = if md.file_type().is_symlink() {
            format!("link {:?}", std::fs::read_link(&p).ok())
        } else if md.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                for e in rd.flatten() {
                    stack.push(e.path());
                }
            }
            format!("dir {:o}", md.mode())
        } else if md.is_file() {
            let data = std::fs::read(&p).unwrap_or_default();
            format!("file {:o} {} {:x}", md.mode(), md.len(), fnv(&data))
        } else {
            format!("other {:o} {}", md.mode(), md.rdev())
        };
        out.insert(p, desc);
    }
    out
}

/// Digest of the host files an escape would target: the root directory's entries, the
/// loader's configuration and the account databases, the system library directory. (Not all of
/// /etc: other test suites running concurrently may legitimately write there, e.g. /etc/cdi.)
pub fn host_digest() -> BTreeMap<PathBuf, String> {
    let mut d = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir("/") {
        for e in rd.flatten() {
            d.insert(e.path(), "entry".to_string());
        }
    }
    for p in [
        "/etc/passwd",
        "/etc/shadow",
        "/etc/group",
        "/etc/ld.so.preload",
        "/etc/ld.so.cache",
        "/etc/ld.so.conf",
        "/etc/ld.so.conf.d",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64",
    ] {
        d.extend(digest(Path::new(p)));
    }
    d
}

pub fn fnv(d: &[u8]) -> u64 {
    d.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    })
}
