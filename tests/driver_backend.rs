//! `quota.backend = driver | both | shim` end to end: real runc containers through
//! `gpufence-runtime` on a simulated node whose driver supports NVML memory limits (the node
//! file's `memory_limits_dir`, which a container sees through a bind mount at the same path —
//! standing in for the kernel, which sees every process).
//!
//! Why the driver backend exists: the shim is injected with `shim.inject = "env"`, and a process
//! started with `env -u LD_PRELOAD` escapes it. Under `driver` the escaped process is still held
//! to the quota (the mock CUDA charges every process of the container's cgroup against the limit
//! gpufence set through NVML from the createRuntime hook), and a second process shares the same
//! limit; under `shim` the escaped process gets the whole GPU. The limit is cleared on delete;
//! a limit that cannot be set refuses the container. Needs root, runc and gcc.

mod common;
#[path = "fixtures/cuda_harness.rs"]
mod harness;
mod runtime_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use harness::{MIB, lines};
use runtime_support::{Node, node, runc_list, runtime, unique_id};
use serde_json::json;

/// Give the simulated driver NVML memory limits (state in `<node>/driver-state/memlimits`) and
/// re-take the inventory so it records the capability.
fn enable_memory_limits(n: &Node) -> PathBuf {
    let dir = n.dir.join("driver-state/memlimits");
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        n.dir.join("node.json"),
        n.dir
            .join("driver/usr/lib/x86_64-linux-gnu/gpufence-mock-node.json"),
    ] {
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
        v["memory_limits_dir"] = dir.display().to_string().into();
        std::fs::write(&f, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    }
    let _ = std::fs::remove_file(n.state_dir.join("inventory.json"));
    let (code, out, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&n.config)
            .args(["inventory", "--json"]),
    );
    assert_eq!(code, 0, "gpufence inventory: {err}");
    let inv: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ml = &inv["memoryLimits"];
    assert_eq!(ml["nvmlExports"], true, "{ml}");
    assert_eq!(ml["gpus"].as_array().unwrap().len(), 2, "{ml}");
    assert!(
        ["hybrid", "unified"].contains(&ml["cgroup"].as_str().unwrap()),
        "{ml}"
    );
    dir
}

/// A bundle running `script` in a glibc rootfs holding the direct-link CUDA client, with the
/// allocation annotations and the simulated driver's state mounted at its own path.
fn bundle(s: &Path, name: &str, script: &str, limits: &Path) -> PathBuf {
    let b = runtime_support::bundle(
        s,
        name,
        script,
        &[
            ("gpufence.dev/devices", "1"),
            ("gpufence.dev/memory", "100Mi"),
        ],
        &[],
    );
    let rootfs = common::glibc_rootfs(&b);
    let bin = rootfs.join("usr/local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(&harness::clients().1, bin.join("cuda_client_direct")).unwrap();
    let p = b.join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    cfg["mounts"].as_array_mut().unwrap().push(json!({
        "destination": limits.display().to_string(), "type": "bind",
        "source": limits.display().to_string(), "options": ["rbind", "rw"]}));
    std::fs::write(&p, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    b
}

const SCRIPT: &str = r#"
D=/usr/local/bin/cuda_client_direct
echo "preload $LD_PRELOAD"
$D direct fill 4194304 | sed 's/^/shimmed /'
env -u LD_PRELOAD $D direct fill 4194304 | sed 's/^/escaped /'
env -u LD_PRELOAD $D direct alloc 62914560 hold > /tmp/h &
HP=$!
while ! grep -q holding /tmp/h; do sleep 0.05; done
env -u LD_PRELOAD $D direct fill 4194304 | sed 's/^/neighbour /'
kill -9 $HP
wait $HP 2>/dev/null
env -u LD_PRELOAD $D direct fill 4194304 | sed 's/^/after-kill /'
echo done
"#;

fn limit_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for k in std::fs::read_dir(dir).unwrap().flatten() {
        for f in std::fs::read_dir(k.path()).into_iter().flatten().flatten() {
            if f.file_name().to_string_lossy().starts_with("limit.") {
                out.push(f.path());
            }
        }
    }
    out
}

#[test]
fn driver_limit_holds_a_process_that_escaped_the_shim() {
    if common::skip_unless(&["runc", "gcc"]) {
        return;
    }
    let s = common::scratch("drv-backend");
    let n = node(
        &s,
        2,
        &[
            ("quota.backend", toml_edit::value("driver")),
            ("shim.inject", toml_edit::value("env")),
        ],
    );
    let limits = enable_memory_limits(&n);
    let b = bundle(&s, "bundle", SCRIPT, &limits);

    // The dry run names the backend per device and the createRuntime hook.
    let (code, out, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&n.config)
            .args(["plan", "--json", "--bundle"])
            .arg(&b),
    );
    assert_eq!(code, 0, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["memoryBackends"][0]["backend"], "driver", "{plan}");
    assert_eq!(plan["driverLimits"][0]["hard"], 100 * MIB, "{plan}");
    assert_eq!(
        plan["quota"]["devices"][0]["memory"],
        serde_json::Value::Null,
        "{plan}"
    );
    let hooks = plan["edits"]["hooks"].to_string();
    assert!(
        hooks.contains("createRuntime") && hooks.contains("memory-limits"),
        "{hooks}"
    );

    let root = s.join("runc-root");
    let runc_log = s.join("runc.log");
    let id = unique_id("drv");
    let (code, out, err) = runtime(
        &n,
        &root,
        &runc_log,
        &["run", "--bundle", b.to_str().unwrap(), &id],
    );
    let set_while_running = limit_files(&limits);
    let (dcode, _, derr) = runtime(&n, &root, &runc_log, &["delete", "--force", &id]);
    let log = std::fs::read_to_string(&n.log).unwrap_or_default();
    let ctx = format!("container output:\n{out}\nstderr:\n{err}\nlog:\n{log}");
    assert_eq!(code, 0, "gpufence-runtime run failed: {ctx}");
    assert!(out.lines().any(|l| l == "done"), "{ctx}");
    let q = 100 * MIB;
    // The shim is there (env injection) but holds no memory quota: the driver does, for the
    // shimmed process, for the one that escaped it, and for both together.
    assert!(
        out.contains("preload /usr/lib/gpufence/libgpufence.so"),
        "{ctx}"
    );
    assert_eq!(
        lines(&out, "shimmed fill"),
        [format!("shimmed fill {q}")],
        "{ctx}"
    );
    assert_eq!(
        lines(&out, "escaped fill"),
        [format!("escaped fill {q}")],
        "{ctx}"
    );
    assert_eq!(
        lines(&out, "neighbour fill"),
        [format!("neighbour fill {}", q - 60 * MIB)],
        "{ctx}"
    );
    assert_eq!(
        lines(&out, "after-kill fill"),
        [format!("after-kill fill {q}")],
        "{ctx}"
    );
    assert_eq!(set_while_running.len(), 1, "{ctx}");
    assert!(log.contains("driver memory limit set"), "{ctx}");
    assert!(log.contains("memory_backends=[\"0:driver\"]"), "{ctx}");
    // Delete cleared the limit and the host-only record.
    assert_eq!(dcode, 0, "{derr}");
    assert!(
        limit_files(&limits).is_empty(),
        "limit left after delete: {ctx}"
    );
    assert!(!n.state_dir.join(".memory-limits").join(&id).exists());
    assert!(!runc_list(&root).contains(&id));
}

#[test]
fn under_the_shim_backend_an_escaped_process_gets_the_whole_gpu() {
    if common::skip_unless(&["runc", "gcc"]) {
        return;
    }
    let s = common::scratch("drv-shim");
    let n = node(
        &s,
        2,
        &[
            ("quota.backend", toml_edit::value("shim")),
            ("shim.inject", toml_edit::value("env")),
        ],
    );
    let limits = enable_memory_limits(&n);
    let script = r#"
D=/usr/local/bin/cuda_client_direct
$D direct fill 67108864 | sed 's/^/shimmed /'
env -u LD_PRELOAD $D direct fill 1073741824 | sed 's/^/escaped /'
echo done
"#;
    let b = bundle(&s, "bundle", script, &limits);
    let root = s.join("runc-root");
    let runc_log = s.join("runc.log");
    let id = unique_id("shimonly");
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
    assert_eq!(
        lines(&out, "shimmed fill"),
        [format!("shimmed fill {}", 64 * MIB)],
        "{ctx}"
    );
    // The sim's GPU has 81559 MiB: the escaped process got 79 whole GiB of it.
    assert_eq!(
        lines(&out, "escaped fill"),
        [format!("escaped fill {}", 79u64 << 30)],
        "{ctx}"
    );
    assert!(limit_files(&limits).is_empty());
    assert_eq!(dcode, 0);
}

#[test]
fn a_limit_that_cannot_be_set_refuses_the_container() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("drv-fail");
    let n = node(&s, 2, &[("quota.backend", toml_edit::value("both"))]);
    let limits = enable_memory_limits(&n);
    // The simulated driver's state becomes unusable after the inventory was taken: NVML's
    // setter fails at createRuntime.
    std::fs::remove_dir_all(&limits).unwrap();
    std::fs::write(&limits, "not a directory").unwrap();
    let b = runtime_support::bundle(
        &s,
        "bundle",
        "echo started",
        &[
            ("gpufence.dev/devices", "0"),
            ("gpufence.dev/memory", "1Gi"),
        ],
        &[],
    );
    let root = s.join("runc-root");
    let runc_log = s.join("runc.log");
    let id = unique_id("drvfail");
    let (code, out, err) = runtime(
        &n,
        &root,
        &runc_log,
        &["run", "--bundle", b.to_str().unwrap(), &id],
    );
    let ctx = format!("stdout:\n{out}\nstderr:\n{err}");
    assert_ne!(code, 0, "{ctx}");
    assert!(!out.contains("started"), "{ctx}");
    let runc_err = std::fs::read_to_string(&runc_log).unwrap_or_default() + &err;
    assert!(
        runc_err.contains("memory-limits") || runc_err.contains("createRuntime"),
        "{ctx}\n{runc_err}"
    );
    assert!(!runc_list(&root).contains(&id), "{ctx}");
    assert!(
        !n.state_dir.join(".memory-limits").join(&id).exists(),
        "{ctx}"
    );
    let _ = runtime(&n, &root, &runc_log, &["delete", "--force", &id]);

    // Forcing the driver where the node cannot hold the quota (NVML without the calls) is
    // refused at plan time, naming the key.
    let s2 = common::scratch("drv-unsupported");
    let n2 = node(&s2, 2, &[("quota.backend", toml_edit::value("driver"))]);
    let (code, _, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&n2.config)
            .args(["plan", "--bundle"])
            .arg(&b),
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("quota.backend=\"driver\""), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
