//! Shared set-up for the gpufence-runtime e2e tests: a simulated node with its inventory cache,
//! a gpufence config pointing at it, OCI bundles.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common;

/// A simulated node ready for the runtime: (config path, node dir).
pub struct Node {
    pub config: PathBuf,
    pub dir: PathBuf,
    pub state_dir: PathBuf,
    pub log: PathBuf,
}

/// Build a node of `gpus` GPUs in `scratch/node`, point gpufence at real runc, the built shim
/// and binaries, a log file and state dir in the scratch dir, and fill the inventory cache.
pub fn node(scratch: &Path, gpus: u32, extra: &[(&str, toml_edit::Item)]) -> Node {
    node_mig(scratch, gpus, None, extra)
}

/// [`node`] with MIG enabled on GPU `mig_gpu` (gpufence-sim's seven 1g.10gb instances).
pub fn node_mig(
    scratch: &Path,
    gpus: u32,
    mig_gpu: Option<u32>,
    extra: &[(&str, toml_edit::Item)],
) -> Node {
    let dir = scratch.join("node");
    std::fs::create_dir_all(&dir).unwrap();
    let sim_cfg = common::sim_node(&dir, gpus, mig_gpu);
    let text = std::fs::read_to_string(&sim_cfg).unwrap();
    let mut doc: toml_edit::DocumentMut = text.parse().unwrap();
    let state_dir = scratch.join("state");
    let log = scratch.join("gpufence.log");
    doc["state-dir"] = toml_edit::value(state_dir.display().to_string());
    doc["gpufence-binary"] = toml_edit::value(common::bin("gpufence").display().to_string());
    doc["runtime"]["path"] = toml_edit::value(common::runc().display().to_string());
    doc["shim"]["library"] =
        toml_edit::value(common::cdylib("libgpufence.so").display().to_string());
    doc["log"]["file"] = toml_edit::value(log.display().to_string());
    doc["log"]["level"] = toml_edit::value("debug");
    for (k, v) in extra {
        let mut parts = k.split('.');
        let first = parts.next().unwrap();
        match parts.next() {
            None => doc[first] = v.clone(),
            Some(second) => doc[first][second] = v.clone(),
        }
    }
    let config = scratch.join("gpufence.toml");
    std::fs::write(&config, doc.to_string()).unwrap();
    // The inventory cache (the create path never initialises NVML).
    let (code, _out, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&config)
            .arg("inventory"),
    );
    assert_eq!(code, 0, "gpufence inventory: {err}");
    Node {
        config,
        dir,
        state_dir,
        log,
    }
}

/// An OCI bundle (from `runc spec`) running `script` with `sh -c`, with annotations and env.
pub fn bundle(
    scratch: &Path,
    name: &str,
    script: &str,
    annotations: &[(&str, &str)],
    env: &[&str],
) -> PathBuf {
    let b = scratch.join(name);
    std::fs::create_dir_all(&b).unwrap();
    let rootfs = common::busybox_rootfs(&b);
    let (code, _, err) = common::run(Command::new(common::runc()).args(["spec", "-b"]).arg(&b));
    assert_eq!(code, 0, "runc spec: {err}");
    let p = b.join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    spec["process"]["terminal"] = false.into();
    spec["process"]["args"] = serde_json::json!(["/bin/sh", "-c", script]);
    spec["root"]["path"] = rootfs.display().to_string().into();
    spec["root"]["readonly"] = false.into();
    let envs = spec["process"]["env"].as_array_mut().unwrap();
    for e in env {
        envs.push((*e).into());
    }
    let mut ann = serde_json::Map::new();
    for (k, v) in annotations {
        ann.insert(k.to_string(), (*v).into());
    }
    if !ann.is_empty() {
        spec["annotations"] = ann.into();
    }
    // A field runc and gpufence don't know: must survive the edit.
    spec["linux"]["gpufenceTestUnknown"] = serde_json::json!({"keep": [1, 2, 3]});
    std::fs::write(&p, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    b
}

/// `gpufence-runtime --root R --log L --log-format json ARGS…` with the node's config.
pub fn runtime(node: &Node, root: &Path, runc_log: &Path, args: &[&str]) -> (i32, String, String) {
    common::run(
        Command::new(common::bin("gpufence-runtime"))
            .env("GPUFENCE_CONFIG", &node.config)
            .arg("--root")
            .arg(root)
            .arg("--log")
            .arg(runc_log)
            .args(["--log-format", "json"])
            .args(args),
    )
}

/// `gpufence-runtime run` the bundle as a fresh container (its runc root and log in `scratch`),
/// then `delete --force` it; returns run's (exit code, stdout, stderr).
pub fn run_and_delete(
    node: &Node,
    scratch: &Path,
    bundle: &Path,
    prefix: &str,
) -> (i32, String, String) {
    let root = scratch.join("runc-root");
    let runc_log = scratch.join("runc.log");
    let id = unique_id(prefix);
    let r = runtime(
        node,
        &root,
        &runc_log,
        &["run", "--bundle", bundle.to_str().unwrap(), &id],
    );
    let _ = runtime(node, &root, &runc_log, &["delete", "--force", &id]);
    r
}

/// Container ids of `runc --root R list`.
pub fn runc_list(root: &Path) -> Vec<String> {
    let (_, out, _) = common::run(
        Command::new(common::runc())
            .arg("--root")
            .arg(root)
            .args(["list", "-q"]),
    );
    out.lines().map(str::to_string).collect()
}

pub fn unique_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Probe script: one `key=value` line per fact.
pub const PROBE: &str = r#"
probe() { out=$(dd if="$1" of=/dev/null bs=1 count=1 2>&1); case "$out" in
  *"No such device or address"*) echo ENXIO;; *"Operation not permitted"*) echo EPERM;;
  *"No such file"*) echo ABSENT;; *) echo "OTHER:$out";; esac; }
for n in 0 1 2 3 4 5 6 7; do echo "gpu$n=$(probe /dev/nvidia$n)"; done
echo "ctl=$(probe /dev/nvidiactl)"
echo "uvm=$(probe /dev/nvidia-uvm)"
mknod /tmp/stolen0 c 195 0 2>/dev/null && echo "mknod0=$(probe /tmp/stolen0)" || echo "mknod0=EPERM"
echo "preload=$(cat /etc/ld.so.preload 2>/dev/null | head -1)"
echo "quota_mem=$(grep '^device.0.memory=' /run/gpufence/quota 2>/dev/null | cut -d= -f2)"
echo "quota_uuid=$(grep '^device.0.uuid=' /run/gpufence/quota 2>/dev/null | cut -d= -f2)"
(echo x >> /run/gpufence/quota) 2>/dev/null && echo quota_write=ALLOWED || echo quota_write=DENIED
lib=$(grep -o ' [^ ]*libnvidia-ml.so[^ ]* [^ ]* [^ ]*' /proc/mounts | head -1)
[ -z "$lib" ] && grep -q ' /usr/local/nvidia/lib64 ' /proc/mounts && lib="$(ls /usr/local/nvidia/lib64/libnvidia-ml.so.* | head -1) $(grep ' /usr/local/nvidia/lib64 ' /proc/mounts | head -1 | cut -d' ' -f3,4)"
echo "nvml_mount=$lib"
f=$(echo $lib | cut -d' ' -f1); [ -n "$f" ] && { (echo x >> "$f") 2>/dev/null && echo lib_write=ALLOWED || echo lib_write=DENIED; }
echo "env_mem=$GPUFENCE_MEMORY_LIMIT_0"
echo "env_state=$GPUFENCE_STATE"
echo "env_nvd=$NVIDIA_VISIBLE_DEVICES"
echo done=1
"#;

pub fn facts(out: &str) -> std::collections::BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}
