//! libgpufence.so inside a real runc container started by `gpufence-runtime` on the simulated node
//! (`gpufence-sim node`), glibc rootfs, unprivileged container user.
//!
//! The bundle's config.json carries nothing GPU-related but the allocation annotations
//! (`gpufence.dev/devices`, `gpufence.dev/memory`): no device nodes, no mounts, no env. Everything
//! the shim needs comes from the runtime's plan — the device nodes and cgroup rules, the driver
//! libraries from the sim's driver root (mock `libcuda.so.1`, `libnvidia-ml.so.1`, the mock node
//! description beside them, `nvidia-smi`) made loadable by the ld-cache hook, the shim through
//! `/etc/ld.so.preload`, the container's own tmpfs at /run/gpufence with the read-only quota file on top,
//! and `GPUFENCE_STATE`.
//!
//! Proves, inside the container: all three ways to the driver land in the shim; one process is
//! held to its quota exactly; 8 concurrent processes allocating random sizes never exceed it
//! together; freed memory is usable again; a SIGKILLed process's memory is reclaimed; VMM and
//! async-pool allocations count; `cuMemGetInfo` and NVML (`nvidia-smi` and the client's own NVML
//! calls) report the slice and the container's usage. Needs root, runc and gcc (see
//! tests/shim_quota.rs for the client).

mod common;
#[path = "fixtures/cuda_harness.rs"]
mod harness;
mod runtime_support;

use std::os::unix::fs::PermissionsExt;

use harness::{MIB, field, lines, num};
use runtime_support::{node, runc_list, runtime, unique_id};
use serde_json::json;

#[test]
fn quota_holds_inside_a_gpufence_runtime_container() {
    if common::skip_unless(&["runc", "gcc"]) {
        return;
    }
    let s = common::scratch("shim-ctr");
    let n = node(&s, 2, &[]);
    let quota = 100 * MIB;
    let q = quota.to_string();

    let script = format!(
        r#"
C=/usr/local/bin/cuda_client; D=/usr/local/bin/cuda_client_direct
id -u | sed 's/^/uid /'
echo "mocknode-env ${{GPUFENCE_MOCK_NODE-unset}}"
for d in /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64; do test -r $d/gpufence-mock-node.json && test -e $d/libcuda.so.1 && echo mocknode-beside-libcuda || true; done
test -e /etc/gpufence-mock-node.json && echo mocknode-in-etc
echo "state-env $GPUFENCE_STATE"
$C dlsym where info fill 1048576 free
$D direct totalmem fill 1048576 free
$C proc vmm 33554432 pool 33554432 info fill 1048576 free
dd if=/dev/zero of=/tmp/counter bs=8 count=1 2>/dev/null
for i in 1 2 3 4 5 6 7 8; do
  $C dlsym random $i 2000 6000000 /tmp/counter {q} > /tmp/r$i 2>&1 || echo "random-failed $i" &
done
wait
cat /tmp/r*
$C dlsym fill 1048576 | sed 's/^/after-random /'
$D direct alloc 83886080 hold > /tmp/h &
HP=$!
while ! grep -q holding /tmp/h; do sleep 0.05; done
$C dlsym info alloc 31457280 | sed 's/^/neighbour /'
$C dlsym nvml | sed 's/^/neighbour /'
nvidia-smi | sed 's/^/smi /'
kill -9 $HP
wait $HP
$C proc fill 1048576 | sed 's/^/after-kill /'
stat -c 'accounting %a' /run/gpufence/accounting
echo tamper >> /run/gpufence/quota 2>/dev/null && echo quota-writable || echo quota-readonly
grep ' /run/gpufence/quota ' /proc/mounts | cut -d' ' -f4 | cut -d, -f1 | sed 's/^/quota-mount /'
touch /run/gpufence/planted 2>/dev/null && echo state-dir-writable || echo state-dir-closed
echo done
"#
    );
    // Only the allocation annotations: everything GPU-related comes from the runtime.
    let b = runtime_support::bundle(
        &s,
        "bundle",
        &script,
        &[
            ("gpufence.dev/devices", "1"),
            ("gpufence.dev/memory", "100Mi"),
        ],
        &[],
    );
    let rootfs = common::glibc_rootfs(&b);
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let bin = rootfs.join("usr/local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let (plain, direct) = harness::clients();
    std::fs::copy(plain, bin.join("cuda_client")).unwrap();
    std::fs::copy(direct, bin.join("cuda_client_direct")).unwrap();
    let cfg_path = b.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["process"]["user"] = json!({"uid": 1000, "gid": 1000});
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    // Nothing GPU-related by hand: no device nodes, no mounts but runc's defaults, no env.
    assert!(cfg["linux"].get("devices").is_none(), "{cfg}");
    assert!(
        cfg["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["type"] != "bind"),
        "{cfg}"
    );
    assert!(
        !cfg["process"]["env"].to_string().contains("GPUFENCE"),
        "{cfg}"
    );

    let root = s.join("runc-root");
    let runc_log = s.join("runc.log");
    let id = unique_id("shim");
    let (code, out, err) = runtime(
        &n,
        &root,
        &runc_log,
        &["run", "--bundle", b.to_str().unwrap(), &id],
    );
    let state = n.state_dir.join(&id);
    let accounting_on_host = state.join("accounting").exists();
    let (dcode, _, derr) = runtime(&n, &root, &runc_log, &["delete", "--force", &id]);
    let ctx = format!("container output:\n{out}\nstderr:\n{err}");
    assert_eq!(code, 0, "gpufence-runtime run failed: {ctx}");
    assert!(out.lines().any(|l| l == "done"), "{ctx}");

    assert_eq!(num(&out, "uid"), 1000, "{ctx}");
    // The mock driver finds the node description beside itself (a driver file of the sim's
    // driver root, mounted by the plan), not through test env.
    assert_eq!(field(&out, "mocknode-env"), ["unset"], "{ctx}");
    assert!(out.contains("mocknode-beside-libcuda"), "{ctx}");
    assert!(!out.contains("mocknode-in-etc"), "{ctx}");
    assert_eq!(field(&out, "state-env"), ["/run/gpufence"], "{ctx}");

    // All three ways to the driver land in the shim, preloaded by /etc/ld.so.preload.
    assert!(out.contains("where cuMemAlloc_v2 libgpufence.so"), "{ctx}");
    assert!(
        out.contains("where cuMemGetInfo_v2 libgpufence.so"),
        "{ctx}"
    );
    assert_eq!(field(&out, "info"), vec![q.clone(), q.clone()], "{ctx}");
    assert_eq!(num(&out, "totalmem"), quota, "{ctx}");
    // One process is held to its quota exactly, and can use all of it: dlsym, direct link, and
    // cuGetProcAddress (after 64 MiB of VMM + pool allocations).
    let rest = quota - 64 * MIB;
    assert_eq!(
        lines(&out, "fill"),
        vec![
            format!("fill {quota}"),
            format!("fill {quota}"),
            format!("fill {rest}")
        ],
        "{ctx}"
    );
    // VMM and pool allocations count.
    assert!(
        out.contains("vmm 33554432 ok") && out.contains("pool 33554432 ok"),
        "{ctx}"
    );
    assert!(out.contains(&format!("info {rest} {quota}")), "{ctx}");
    // 8 concurrent processes never above the quota together, and some of them were refused
    // (so the quota was actually contended).
    let randoms = lines(&out, "random");
    assert_eq!(randoms.len(), 8, "{ctx}");
    assert!(!out.contains("random-failed"), "{ctx}");
    let mut refused = 0u64;
    for r in &randoms {
        let f: Vec<u64> = r
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap())
            .collect();
        assert!(f[0] <= quota, "{r}\n{ctx}");
        refused += f[2];
    }
    assert!(refused > 0, "the random clients never hit the quota: {ctx}");
    // Freed memory (everything each process freed on exit) is usable again.
    assert!(out.contains(&format!("after-random fill {quota}")), "{ctx}");
    // The holder's 80 MiB is seen by its neighbour, then reclaimed after SIGKILL.
    assert!(
        out.contains(&format!("neighbour info {} {quota}", 20 * MIB)),
        "{ctx}"
    );
    assert!(out.contains("neighbour alloc 31457280 err 2"), "{ctx}");
    assert!(
        out.contains(&format!("neighbour nvml {quota} {} {}", 20 * MIB, 80 * MIB)),
        "{ctx}"
    );
    // nvidia-smi from the sim's driver root: only the granted GPU, showing the slice.
    let smi = lines(&out, "smi");
    let gpus: Vec<&&str> = smi.iter().filter(|l| l.starts_with("smi GPU ")).collect();
    assert_eq!(gpus.len(), 1, "{ctx}");
    assert!(
        gpus[0].contains(&gpufence::sim::gpu_uuid(1))
            && gpus[0].ends_with("memory.total=100MiB memory.used=80MiB memory.free=20MiB"),
        "{ctx}"
    );
    assert!(out.contains(&format!("after-kill fill {quota}")), "{ctx}");
    assert!(out.contains("accounting 666"), "{ctx}");
    assert!(out.contains("quota-readonly"), "{ctx}");
    assert_eq!(field(&out, "quota-mount"), ["ro"], "{ctx}");
    // The container user shares the region; nothing else can be created beside it.
    assert!(out.contains("state-dir-closed"), "{ctx}");
    // The region lives in the container's own tmpfs, never in the host's state directory.
    assert!(!accounting_on_host, "{ctx}");
    assert_eq!(dcode, 0, "{derr}");
    assert!(!state.exists(), "state dir removed on delete");
    assert!(!runc_list(&root).contains(&id));
}

/// Issue 15.5: inside a container gpufence prepared, the quota's location is fixed. Moving
/// `GPUFENCE_STATE` (a process, or the image's ENV in hook mode) does not lift the quota, and a
/// quota that went missing (container root with CAP_SYS_ADMIN unmounting it) makes the shim
/// refuse allocations instead of passing them through.
#[test]
fn moved_state_env_or_missing_quota_never_lifts_the_quota() {
    if common::skip_unless(&["runc", "gcc"]) {
        return;
    }
    let s = common::scratch("shim-ctr-env");
    let n = node(&s, 2, &[]);
    let script = r#"
C=/usr/local/bin/cuda_client
mkdir -p /tmp/elsewhere
env -u GPUFENCE_MEMORY_LIMIT_0 GPUFENCE_STATE=/tmp/elsewhere $C dlsym alloc 209715200 | sed 's/^/env-moved /'
env -u GPUFENCE_MEMORY_LIMIT_0 GPUFENCE_STATE= $C dlsym alloc 209715200 | sed 's/^/env-empty /'
$C dlsym alloc 1048576 | sed 's/^/before-umount /'
umount /run/gpufence/quota 2>&1; umount /run/gpufence 2>&1; test -e /run/gpufence/quota || echo unmounted
GPUFENCE_STATE=/tmp/elsewhere $C dlsym alloc 1048576 | sed 's/^/quota-gone /'
echo done
"#;
    let b = runtime_support::bundle(
        &s,
        "bundle",
        script,
        &[
            ("gpufence.dev/devices", "1"),
            ("gpufence.dev/memory", "100Mi"),
        ],
        &["GPUFENCE_MEMORY_LIMIT_0=999999999999"],
    );
    let rootfs = common::glibc_rootfs(&b);
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let bin = rootfs.join("usr/local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(&harness::clients().0, bin.join("cuda_client")).unwrap();
    let cfg_path = b.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    for set in ["bounding", "effective", "permitted"] {
        cfg["process"]["capabilities"][set]
            .as_array_mut()
            .unwrap()
            .push(json!("CAP_SYS_ADMIN"));
    }
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    let (code, out, err) = runtime_support::run_and_delete(&n, &s, &b, "shimenv");
    let ctx = format!("container output:\n{out}\nstderr:\n{err}");
    assert_eq!(code, 0, "{ctx}");
    assert!(out.lines().any(|l| l == "done"), "{ctx}");
    assert!(out.contains("env-moved alloc 209715200 err 2"), "{ctx}");
    assert!(out.contains("env-empty alloc 209715200 err 2"), "{ctx}");
    assert!(out.contains("before-umount alloc 1048576 ok"), "{ctx}");
    assert!(out.contains("unmounted"), "{ctx}");
    assert!(out.contains("quota-gone alloc 1048576 err 2"), "{ctx}");
}
