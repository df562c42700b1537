//! Compute shares in real runc containers started by `gpufence-runtime` on the simulated node
//! (`gpufence-sim node`), glibc rootfs, unprivileged container user, nothing GPU-related in the
//! bundle but the allocation annotations.
//!
//! The device timeline is node-wide state the sim installs among the driver files and the plan
//! mounts read-write, so containers contend for one simulated GPU: two unlimited containers each
//! get about half of it; `gpufence.dev/cores: "30"` and `"70"` containers get their shares (one
//! replaying a CUDA graph); four processes of a `"40"` container share one budget; a burst
//! container uses the idle GPU, then yields to a neighbour. The client reaches the driver like
//! libcudart (`cuGetProcAddress_v2` by base name). Needs root, runc and gcc.

mod common;
#[path = "fixtures/cuda_harness.rs"]
mod harness;
mod runtime_support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use runtime_support::{Node, node, runtime, unique_id};
use serde_json::json;

/// A bundle on GPU 1 with the client installed, running `script` as uid 1000.
fn bundle(s: &Path, name: &str, script: &str, annotations: &[(&str, &str)]) -> PathBuf {
    let mut ann = vec![("gpufence.dev/devices", "1")];
    ann.extend_from_slice(annotations);
    let b = runtime_support::bundle(s, name, script, &ann, &[]);
    let rootfs = common::glibc_rootfs(&b);
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let bin = rootfs.join("usr/local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(&harness::clients().0, bin.join("cuda_client")).unwrap();
    let p = b.join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    cfg["process"]["user"] = json!({"uid": 1000, "gid": 1000});
    std::fs::write(&p, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    b
}

/// Run containers at the same time (after `delay_ms` each); their outputs, in order.
fn run_together(n: &Node, s: &Path, bundles: &[(PathBuf, u64)]) -> Vec<String> {
    std::thread::scope(|sc| {
        let handles: Vec<_> = bundles
            .iter()
            .map(|(b, delay)| {
                sc.spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(*delay));
                    let root = s.join("runc-root");
                    let log = s.join(format!("runc-{}.log", unique_id("l")));
                    let id = unique_id("cores");
                    let (code, out, err) = runtime(
                        n,
                        &root,
                        &log,
                        &["run", "--bundle", b.to_str().unwrap(), &id],
                    );
                    let _ = runtime(n, &root, &log, &["delete", "--force", &id]);
                    assert_eq!(code, 0, "container failed:\n{out}\n{err}");
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Shares (percent) of the `spin` lines.
fn shares(out: &str) -> Vec<f64> {
    out.lines()
        .filter(|l| l.starts_with("spin "))
        .map(|l| l.split_whitespace().nth(5).unwrap().parse().unwrap())
        .collect()
}

fn near(got: f64, want: f64, tol: f64, ctx: &str) {
    assert!(
        (got - want).abs() <= tol,
        "measured {got:.1} % of the GPU, expected {want} ± {tol}\n{ctx}"
    );
}

const SPIN: &str = "/usr/local/bin/cuda_client proc spin 1000 4 1";

#[test]
fn containers_hold_their_compute_shares_on_one_gpu() {
    if common::skip_unless(&["runc", "gcc"]) {
        return;
    }
    let s = common::scratch("cores-ctr");
    let n = node(&s, 2, &[]);

    // Without limits two containers split the GPU: the timeline is shared across containers.
    let free_a = bundle(&s, "free-a", &format!("{SPIN} plain"), &[]);
    let free_b = bundle(&s, "free-b", &format!("{SPIN} plain"), &[]);
    let outs = run_together(&n, &s, &[(free_a, 0), (free_b, 0)]);
    for o in &outs {
        near(shares(o)[0], 50.0, 8.0, &outs.join("\n"));
    }

    // 30 % and 70 % (the latter replaying a captured graph).
    let c30 = bundle(
        &s,
        "c30",
        &format!("{SPIN} plain"),
        &[("gpufence.dev/cores", "30")],
    );
    let c70 = bundle(
        &s,
        "c70",
        &format!(
            "echo policy=$GPUFENCE_CORES_POLICY; grep cores /run/gpufence/quota; {SPIN} graph"
        ),
        &[("gpufence.dev/cores", "70")],
    );
    let outs = run_together(&n, &s, &[(c30, 0), (c70, 0)]);
    let ctx = outs.join("\n");
    near(shares(&outs[0])[0], 30.0, 5.0, &ctx);
    near(shares(&outs[1])[0], 70.0, 5.0, &ctx);
    assert!(outs[1].contains("policy=hard"), "{ctx}");
    assert!(outs[1].contains("device.0.cores=70"), "{ctx}");

    // Four processes of one container share its 40 %.
    let four = bundle(
        &s,
        "c40",
        &format!("for i in 1 2 3 4; do {SPIN} plain > /tmp/o$i & done; wait; cat /tmp/o*"),
        &[("gpufence.dev/cores", "40")],
    );
    // Burst: alone it uses the idle GPU; when the 70 % container arrives (2.2 s later) it is back
    // at 30 % within a second.
    let burst = bundle(
        &s,
        "burst",
        "/usr/local/bin/cuda_client proc spin 1000 2 0.5 plain spin 1000 3 1 plain",
        &[
            ("gpufence.dev/cores", "30"),
            ("gpufence.dev/cores-policy", "burst"),
        ],
    );
    let hard = bundle(
        &s,
        "hard",
        &format!("{SPIN} plain"),
        &[("gpufence.dev/cores", "70")],
    );
    let outs = run_together(&n, &s, &[(four, 0)]);
    let each = shares(&outs[0]);
    assert_eq!(each.len(), 4, "{}", outs[0]);
    near(each.iter().sum(), 40.0, 5.0, &outs[0]);

    let outs = run_together(&n, &s, &[(burst, 0), (hard, 2200)]);
    let ctx = outs.join("\n");
    let b = shares(&outs[0]);
    assert!(b[0] >= 60.0, "burst alone: {ctx}");
    near(b[1], 30.0, 5.0, &ctx);
    near(shares(&outs[1])[0], 70.0, 5.0, &ctx);
}
