//! libgpufence.so inside a real runc container on the simulated node (glibc rootfs), set up the
//! way the runtime sets up a GPU container with a memory share: the container's state directory
//! bind-mounted read-write at /run/gpufence with the host-written quota file read-only on top,
//! the shim injected through a bind-mounted /etc/ld.so.preload, the mock driver as
//! /usr/lib/x86_64-linux-gnu/libcuda.so.1, the GPU's device node and cgroup rule, and an
//! unprivileged container user.
//!
//! The runtime (`gpufence-runtime`) was not on main when this was written, so the bundle is
//! edited here with the equivalent mounts; see the module docs of tests/shim_quota.rs for the
//! prerequisites (root, gcc, runc).

mod common;
#[path = "fixtures/cuda_harness.rs"]
mod harness;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use harness::{MIB, Node, field, lines, num};
use serde_json::{Value, json};

fn bind(src: &std::path::Path, dst: &str, ro: bool) -> Value {
    let mut opts = vec!["rbind"];
    if ro {
        opts.push("ro");
    }
    json!({"destination": dst, "type": "bind", "source": src, "options": opts})
}

#[test]
fn quota_holds_inside_a_runc_container() {
    if common::skip_unless(&["runc", "gcc"]) {
        return;
    }
    let Some(node) = Node::new("shim-ctr", &[1024]) else {
        return;
    };
    let dir = &node.dir;
    let id = format!("gpufence-shim-{}", std::process::id());
    let quota = 100 * MIB;

    // host side, as the runtime leaves it: state-dir/<id>/quota
    let state = dir.join("state").join(&id);
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let quota_file = state.join("quota");
    std::fs::write(&quota_file, node.quota(&[(0, 0, quota)])).unwrap();
    let preload = dir.join("ld.so.preload");
    std::fs::write(&preload, "/usr/lib/gpufence/libgpufence.so\n").unwrap();
    // inside the container the device node is at /dev/nvidia0
    let ctr_node = dir.join("node-in-container.json");
    let mut n: Value = serde_json::from_slice(&std::fs::read(&node.node_json).unwrap()).unwrap();
    n["dev_root"] = json!("/");
    std::fs::write(&ctr_node, n.to_string()).unwrap();

    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    let rootfs = common::glibc_rootfs(&bundle);
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let bin = rootfs.join("usr/local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let (plain, direct) = harness::clients();
    std::fs::copy(plain, bin.join("cuda_client")).unwrap();
    std::fs::copy(direct, bin.join("cuda_client_direct")).unwrap();

    let q = quota.to_string();
    let script = format!(
        r#"
C=/usr/local/bin/cuda_client; D=/usr/local/bin/cuda_client_direct
id -u | sed 's/^/uid /'
$C dlsym where info fill 1048576 free
$D direct fill 1048576 free
$C proc vmm 33554432 pool 33554432 info fill 1048576 free
dd if=/dev/zero of=/tmp/counter bs=8 count=1 2>/dev/null
for i in 1 2 3 4 5 6 7 8; do
  $C dlsym random $i 2000 6000000 /tmp/counter {q} > /tmp/r$i 2>&1 || echo "random-failed $i" &
done
wait
cat /tmp/r*
$D direct alloc 83886080 hold > /tmp/h &
HP=$!
while ! grep -q holding /tmp/h; do sleep 0.05; done
$C dlsym info alloc 31457280 | sed 's/^/neighbour /'
$C dlsym nvml | sed 's/^/neighbour /'
kill -9 $HP
wait $HP
$C proc fill 1048576 | sed 's/^/after-kill /'
stat -c 'accounting %a' /run/gpufence/accounting
echo tamper >> /run/gpufence/quota 2>/dev/null && echo quota-writable || echo quota-readonly
"#
    );
    std::fs::write(rootfs.join("test.sh"), script).unwrap();

    Command::new("runc")
        .arg("spec")
        .current_dir(&bundle)
        .status()
        .unwrap();
    let cfg_path = bundle.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["process"]["terminal"] = json!(false);
    cfg["process"]["args"] = json!(["/bin/sh", "/test.sh"]);
    cfg["process"]["user"] = json!({"uid": 1000, "gid": 1000});
    cfg["process"]["env"] = json!([
        "PATH=/usr/local/bin:/bin",
        "GPUFENCE_STATE=/run/gpufence",
        "GPUFENCE_MOCK_NODE=/etc/gpufence-mock-node.json"
    ]);
    cfg["root"] = json!({"path": rootfs, "readonly": false});
    let mounts = cfg["mounts"].as_array_mut().unwrap();
    mounts.push(bind(&state, "/run/gpufence", false));
    mounts.push(bind(&quota_file, "/run/gpufence/quota", true));
    mounts.push(bind(&preload, "/etc/ld.so.preload", true));
    mounts.push(bind(
        &common::cdylib("libgpufence.so"),
        "/usr/lib/gpufence/libgpufence.so",
        true,
    ));
    mounts.push(bind(
        &common::cdylib("libgpufence_mock_cuda.so"),
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        true,
    ));
    mounts.push(bind(
        &common::cdylib("libgpufence_mock_nvml.so"),
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        true,
    ));
    mounts.push(bind(&ctr_node, "/etc/gpufence-mock-node.json", true));
    cfg["linux"]["devices"] = json!([{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0,
        "fileMode": 438, "uid": 0, "gid": 0}]);
    cfg["linux"]["resources"]["devices"]
        .as_array_mut()
        .unwrap()
        .push(json!({"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"}));
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();

    let runc_root = dir.join("runc-root");
    let (rc, out, err) = common::run(
        Command::new("timeout")
            .args(["120", "runc", "--root"])
            .arg(&runc_root)
            .args(["run", "-b"])
            .arg(&bundle)
            .arg(&id),
    );
    let _ = Command::new("runc")
        .arg("--root")
        .arg(&runc_root)
        .args(["delete", "-f", &id])
        .output();
    assert_eq!(rc, 0, "runc failed: {err}\n{out}");
    let ctx = format!("container output:\n{out}\nstderr:\n{err}");

    assert_eq!(num(&out, "uid"), 1000, "{ctx}");
    // all three ways to the driver land in the shim, preloaded by /etc/ld.so.preload
    assert!(out.contains("where cuMemAlloc_v2 libgpufence.so"), "{ctx}");
    assert_eq!(field(&out, "info"), vec![q.clone(), q.clone()], "{ctx}");
    let fills: Vec<&str> = lines(&out, "fill");
    let rest = quota - 64 * MIB;
    assert_eq!(
        fills,
        vec![
            format!("fill {quota}"),
            format!("fill {quota}"),
            format!("fill {rest}")
        ],
        "{ctx}"
    );
    // VMM and pool allocations count: 64 MiB of them leave 36 MiB
    assert!(
        out.contains("vmm 33554432 ok") && out.contains("pool 33554432 ok"),
        "{ctx}"
    );
    assert!(out.contains(&format!("info {rest} {quota}")), "{ctx}");
    // 8 concurrent processes never above the quota together
    let randoms = lines(&out, "random");
    assert_eq!(randoms.len(), 8, "{ctx}");
    assert!(!out.contains("random-failed"), "{ctx}");
    for r in randoms {
        let peak: u64 = r.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(peak <= quota, "{r}\n{ctx}");
    }
    // the holder's 80 MiB is seen by its neighbour, then reclaimed after SIGKILL
    assert!(
        out.contains(&format!("neighbour info {} {quota}", 20 * MIB)),
        "{ctx}"
    );
    assert!(out.contains("neighbour alloc 31457280 err 2"), "{ctx}");
    // nvidia-smi's view (NVML) in another process: the slice and the container's usage
    assert!(
        out.contains(&format!("neighbour nvml {quota} {} {}", 20 * MIB, 80 * MIB)),
        "{ctx}"
    );
    assert!(out.contains(&format!("after-kill fill {quota}")), "{ctx}");
    assert!(out.contains("accounting 666"), "{ctx}");
    assert!(out.contains("quota-readonly"), "{ctx}");
    // the region lives in the host's per-container state directory
    assert!(state.join("accounting").exists());
}
