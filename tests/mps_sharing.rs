//! MPS sharing end to end: a simulated node whose GPUs are shared through an MPS control daemon
//! (the sim's mock `nvidia-cuda-mps-control -d`, node policy `sharing.mps`), containers through
//! `gpufence-runtime` under real runc.
//!
//! The container sees the daemon's pipe directory at `CUDA_MPS_PIPE_DIRECTORY` and its shared
//! memory at `/dev/shm`, and gets `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` / `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
//! from the allocation; the mock CUDA, an MPS client there, is held to them. The shim's quota
//! and MPS's pinned limit agree: the smaller wins, and raising the MPS env from inside the
//! container does not raise the quota. The thread percentage cannot go above the daemon's
//! default. Without a running daemon the container is refused with one line. Needs root, runc
//! and gcc.

mod common;
#[path = "fixtures/cuda_harness.rs"]
mod harness;
mod runtime_support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use harness::{MIB, lines};
use runtime_support::{Node, node, runc_list, runtime, unique_id};

/// A tiny client printing the multiprocessor count CUDA reports (`sm N`).
const SM_CLIENT: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("dlopen %s\n", dlerror()); return 1; }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*attr)(int *, int, int) = (int (*)(int *, int, int))dlsym(h, "cuDeviceGetAttribute");
    int v = 0;
    if (init(0) || attr(&v, 16, 0)) { printf("sm err\n"); return 1; }
    printf("sm %d\n", v);
    return 0;
}
"#;

fn sm_client(dir: &Path) -> PathBuf {
    let src = dir.join("sm.c");
    std::fs::write(&src, SM_CLIENT).unwrap();
    let out = dir.join("sm_client");
    let (rc, _, err) = common::run(
        Command::new("gcc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&out)
            .arg(&src)
            .arg("-ldl"),
    );
    assert_eq!(rc, 0, "gcc: {err}");
    out
}

/// The node's control client with `CUDA_MPS_PIPE_DIRECTORY=pipe`, commands on stdin.
fn control(n: &Node, pipe: &Path, args: &[&str], stdin: &str) -> (bool, String) {
    let mut c = Command::new(n.dir.join("driver/usr/bin/nvidia-cuda-mps-control"))
        .args(args)
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
    )
}

/// The running daemon; `quit` on drop.
struct Daemon<'a> {
    n: &'a Node,
    pipe: PathBuf,
}

impl Drop for Daemon<'_> {
    fn drop(&mut self) {
        let _ = control(self.n, &self.pipe, &[], "quit\n");
    }
}

fn mps_table(s: &Path, gpus: &[&str]) -> toml_edit::Item {
    let mut t = toml_edit::Table::new();
    t["pipe-dir"] = toml_edit::value(s.join("mps/pipe").display().to_string());
    t["shm-dir"] = toml_edit::value(s.join("mps/shm").display().to_string());
    let mut a = toml_edit::Array::new();
    for g in gpus {
        a.push(*g);
    }
    t["gpus"] = toml_edit::value(a);
    toml_edit::Item::Table(t)
}

fn bundle(s: &Path, name: &str, script: &str, extra: &[(&str, &str)]) -> PathBuf {
    let mut ann = vec![
        ("gpufence.dev/devices", "1"),
        ("gpufence.dev/memory", "100Mi"),
        ("gpufence.dev/cores", "30"),
    ];
    ann.extend_from_slice(extra);
    let b = runtime_support::bundle(s, name, script, &ann, &[]);
    let rootfs = common::glibc_rootfs(&b);
    let bin = rootfs.join("usr/local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(&harness::clients().0, bin.join("cuda_client")).unwrap();
    std::fs::copy(sm_client(s), bin.join("sm_client")).unwrap();
    b
}

const SCRIPT: &str = r#"
C=/usr/local/bin/cuda_client
echo "pipe $CUDA_MPS_PIPE_DIRECTORY"
echo "pct $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
echo "pinned $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
test -S "$CUDA_MPS_PIPE_DIRECTORY/control" && echo "control socket"
echo "shm $(cat /dev/shm/marker)"
$C dlsym fill 1048576 | sed 's/^/both /'
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=50M $C dlsym fill 1048576 | sed 's/^/mps-smaller /'
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8G $C dlsym fill 1048576 | sed 's/^/mps-raised /'
/usr/local/bin/sm_client | sed 's/^/own /'
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=90 /usr/local/bin/sm_client | sed 's/^/raised /'
echo done
"#;

#[test]
fn container_on_an_mps_node_gets_pipe_env_and_limits() {
    if common::skip_unless(&["runc", "gcc"]) {
        return;
    }
    let s = common::scratch("mps");
    let n = node(&s, 2, &[("sharing.mps", mps_table(&s, &["all"]))]);
    let pipe = s.join("mps/pipe");
    std::fs::create_dir_all(s.join("mps/shm")).unwrap();
    std::fs::write(s.join("mps/shm/marker"), "from-the-daemon").unwrap();
    let (ok, out) = control(&n, &pipe, &["-d"], "");
    assert!(ok, "daemon: {out}");
    let _daemon = Daemon {
        n: &n,
        pipe: pipe.clone(),
    };
    // The daemon's defaults (as the NVIDIA device plugin sets them): 50 % of the SMs; device 0
    // of a client (the node's GPU 1 for gpufence's probe) 2 GiB.
    let (ok, out) = control(
        &n,
        &pipe,
        &[],
        "set_default_active_thread_percentage 50\nset_default_device_pinned_mem_limit 0 2G\nset_default_device_pinned_mem_limit 1 2G\nget_default_active_thread_percentage\n",
    );
    assert!(ok && out.trim() == "50.0", "{out}");

    let b = bundle(&s, "bundle", SCRIPT, &[]);
    // The dry run reads the daemon's defaults.
    let (code, plan, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&n.config)
            .args(["plan", "--bundle"])
            .arg(&b),
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        plan.contains("daemon defaults: active thread percentage 50.0, pinned memory limits 2G"),
        "{plan}"
    );

    let root = s.join("runc-root");
    let runc_log = s.join("runc.log");
    let id = unique_id("mps");
    let (code, out, err) = runtime(
        &n,
        &root,
        &runc_log,
        &["run", "--bundle", b.to_str().unwrap(), &id],
    );
    let (dcode, _, _) = runtime(&n, &root, &runc_log, &["delete", "--force", &id]);
    let ctx = format!("container output:\n{out}\nstderr:\n{err}");
    assert_eq!(code, 0, "{ctx}");
    assert!(out.lines().any(|l| l == "done"), "{ctx}");
    assert!(out.contains("pipe /tmp/nvidia-mps\n"), "{ctx}");
    assert!(out.contains("pct 30\n"), "{ctx}");
    assert!(out.contains("pinned 0=100M\n"), "{ctx}");
    assert!(out.contains("control socket"), "{ctx}");
    assert!(out.contains("shm from-the-daemon"), "{ctx}");
    let q = 100 * MIB;
    // The shim's quota and MPS's limit agree; the smaller wins either way.
    assert_eq!(
        lines(&out, "both fill"),
        [format!("both fill {q}")],
        "{ctx}"
    );
    assert_eq!(
        lines(&out, "mps-smaller fill"),
        [format!("mps-smaller fill {}", 50 * MIB)],
        "{ctx}"
    );
    assert_eq!(
        lines(&out, "mps-raised fill"),
        [format!("mps-raised fill {q}")],
        "{ctx}"
    );
    // 30 % of 132 SMs; asking for 90 % gets the daemon's 50 % at most.
    assert!(out.contains("own sm 39\n"), "{ctx}");
    assert!(out.contains("raised sm 66\n"), "{ctx}");
    assert_eq!(dcode, 0);
    assert!(!runc_list(&root).contains(&id));
}

#[test]
fn no_daemon_is_a_one_line_refusal() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("mps-absent");
    let n = node(&s, 2, &[("sharing.mps", mps_table(&s, &[]))]);
    std::fs::create_dir_all(s.join("mps/pipe")).unwrap();
    let b = runtime_support::bundle(
        &s,
        "bundle",
        "echo started",
        &[
            ("gpufence.dev/devices", "0"),
            ("gpufence.dev/sharing", "mps"),
        ],
        &[],
    );
    let original = std::fs::read(b.join("config.json")).unwrap();
    let root = s.join("runc-root");
    let runc_log = s.join("runc.log");
    let id = unique_id("mpsabsent");
    let (code, out, err) = runtime(
        &n,
        &root,
        &runc_log,
        &["run", "--bundle", b.to_str().unwrap(), &id],
    );
    assert_ne!(code, 0, "{out}{err}");
    assert!(!out.contains("started"));
    let line = err.trim();
    assert_eq!(line.lines().count(), 1, "{err}");
    assert!(
        line.contains("no MPS control daemon is running") && line.contains(&id),
        "{err}"
    );
    assert!(!runc_list(&root).contains(&id));
    assert_eq!(std::fs::read(b.join("config.json")).unwrap(), original);
    // A node without sharing.mps refuses the request too, naming the annotation.
    let s2 = common::scratch("mps-none");
    let n2 = node(&s2, 2, &[]);
    let (code, _, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&n2.config)
            .args(["plan", "--bundle"])
            .arg(&b),
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("gpufence.dev/sharing=\"mps\""), "{err}");
}
