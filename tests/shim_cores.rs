//! The simulated GPU keeps time, and libgpufence.so holds containers to their compute share,
//! outside containers (the container versions are in tests/shim_cores_container.rs).
//!
//! Shares are device time measured on the simulated timeline: each client counts the
//! `gpufence_spin_1000us` kernels that completed in its measuring window (which opens one second
//! after it starts) and divides their device time by the window. Runs are a few seconds long so
//! that the ±5-point bound is a real assertion on a loaded 2-core machine; independent runs go
//! to different simulated GPUs at the same time.
//!
//! Needs root (fake device nodes) and gcc; `cargo build --workspace` first (the cdylibs).

mod common;
#[path = "fixtures/cuda_harness.rs"]
mod harness;

use std::path::Path;
use std::process::Child;

use harness::{Node, field, output_ok};

/// Quota text giving GPU `gpu` of this node a compute share (and no memory limit).
fn cores_quota(node: &Node, gpu: usize, cores: u32, policy: Option<&str>) -> String {
    let mut q = format!(
        "version=1\noversubscribe=0\ndevice.0.uuid={}\ndevice.0.cores={cores}\n",
        node.gpus[gpu]
    );
    if let Some(p) = policy {
        q.push_str(&format!("cores-policy={p}\n"));
    }
    q
}

/// A spinning client on GPU `gpu` (the only GPU it sees, as ordinal 0).
fn spin(node: &Node, mode: &str, state: &Path, gpu: usize, args: &[&str]) -> Child {
    let mut c = node.client(mode, state, args);
    c.env("CUDA_VISIBLE_DEVICES", gpu.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c.spawn().expect("spawn client")
}

/// The share (percent) of every `spin` line of a finished client.
fn shares(child: Child) -> (Vec<f64>, String) {
    let out = output_ok(child.wait_with_output().unwrap());
    let v = out
        .lines()
        .filter(|l| l.starts_with("spin "))
        .map(|l| l.split_whitespace().nth(5).unwrap().parse().unwrap())
        .collect();
    (v, out)
}

fn assert_near(got: f64, want: f64, tol: f64, what: &str) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: measured {got:.1} % of the GPU, expected {want} ± {tol}"
    );
}

#[test]
fn the_simulated_gpu_keeps_time() {
    let Some(node) = Node::new("cores-time", &[1024]) else {
        return;
    };
    let none = node.state("none", None);
    // One 200 ms kernel: queries answer NOT_READY (600) while it runs, synchronisation waits
    // for it in real time, and two events around it time its device time.
    let out = node.run("proc", &none, &["sem"]);
    let f: Vec<f64> = field(&out, "sem")
        .iter()
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!((f[0], f[1], f[4]), (600.0, 600.0, 0.0), "{out}");
    // The first event completes when recorded on the idle stream and the kernel starts at its
    // launch, as on a GPU: the elapsed time is the device time plus the host's gap between the
    // two calls (tens of µs, more on a loaded machine), never less.
    assert!(f[2] >= 200.0 && f[2] - 200.0 < 5.0, "elapsed {out}");
    assert!(f[3] >= 150.0, "synchronisation did not wait: {out}");

    // Two unshimmed clients on one GPU each get about half of it, and NVML sees them.
    let a = spin(
        &node,
        "proc",
        &none,
        0,
        &["spin", "1000", "3.5", "1", "plain"],
    );
    let b = spin(
        &node,
        "dlsym",
        &none,
        0,
        &["spin", "1000", "3.5", "1", "ex"],
    );
    std::thread::sleep(std::time::Duration::from_millis(2000));
    let util = node.run("proc", &none, &["nvmlutil"]);
    let (sa, oa) = shares(a);
    let (sb, ob) = shares(b);
    assert_near(sa[0], 50.0, 8.0, &format!("first unlimited client\n{oa}"));
    assert_near(sb[0], 50.0, 8.0, &format!("second unlimited client\n{ob}"));
    // nvmlutil RC UTIL RC NPROCS RC NSAMPLES SUM(smUtil)
    let u: Vec<u64> = field(&util, "nvmlutil")
        .iter()
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!((u[0], u[2], u[4]), (0, 0, 0), "{util}");
    assert!(
        u[1] >= 80,
        "device utilisation while two clients spin: {util}"
    );
    assert_eq!(u[3], 2, "running processes: {util}");
    assert_eq!(u[5], 2, "per-process samples: {util}");
    assert!(u[6] >= 70, "per-process utilisation adds up: {util}");
}

#[test]
fn shares_alone_on_every_launch_path() {
    // share, way to the driver, launch form: 10/25/50/75 % and one more, all at once on
    // five GPUs (libcudart-like `proc`, `dlsym` and direct linking; plain, Ex, cooperative,
    // per-thread stream, library kernels and graph replays)
    let cases: [(u32, &str, &str); 6] = [
        (10, "proc", "graph"),
        (25, "dlsym", "lib"),
        (50, "direct", "coop"),
        (75, "proc", "ex"),
        (60, "proc", "ptsz"),
        (40, "direct", "plain"),
    ];
    let Some(node) = Node::new("cores-alone", &[1024; 6]) else {
        return;
    };
    let kids: Vec<(u32, &str, &str, Child)> = cases
        .iter()
        .enumerate()
        .map(|(gpu, (share, mode, how))| {
            let st = node.state(
                &format!("alone-{gpu}"),
                Some(&cores_quota(&node, gpu, *share, None)),
            );
            let c = spin(&node, mode, &st, gpu, &["spin", "1000", "4", "1", how]);
            (*share, *mode, *how, c)
        })
        .collect();
    for (share, mode, how, c) in kids {
        let (s, out) = shares(c);
        assert_near(
            s[0],
            share as f64,
            5.0,
            &format!("{share} % via {mode}/{how}\n{out}"),
        );
    }
}

#[test]
fn contending_containers_and_processes_sharing_one_budget() {
    let Some(node) = Node::new("cores-contend", &[1024, 1024]) else {
        return;
    };
    // GPU 0: 30 % + 70 %, one of them replaying a graph
    let a = node.state("c30", Some(&cores_quota(&node, 0, 30, None)));
    let b = node.state("c70", Some(&cores_quota(&node, 0, 70, None)));
    let ka = spin(&node, "proc", &a, 0, &["spin", "1000", "4", "1", "plain"]);
    let kb = spin(&node, "proc", &b, 0, &["spin", "1000", "4", "1", "graph"]);
    // GPU 1: four processes of one container share its 40 %
    let c = node.state("c40", Some(&cores_quota(&node, 1, 40, None)));
    let four: Vec<Child> = (0..4)
        .map(|_| spin(&node, "dlsym", &c, 1, &["spin", "1000", "4", "1", "plain"]))
        .collect();
    let (sa, oa) = shares(ka);
    let (sb, ob) = shares(kb);
    assert_near(sa[0], 30.0, 5.0, &format!("30 % container\n{oa}"));
    // What `gpufence ps` and the exporter show: the device time charged under the share, in the
    // container's accounting region (4 s at 30 % ≈ 1.2 s, the first second included).
    let region = std::fs::read(a.join("accounting")).unwrap();
    let size = gpufence::status::region::SIZE;
    let usage = gpufence::status::region::decode(&region[..size.min(region.len())], 1).unwrap();
    let ns = usage.devices[0].compute_ns.unwrap_or(0);
    assert!(
        (600_000_000..=2_000_000_000).contains(&ns),
        "compute time recorded for the 30 % container: {ns} ns"
    );
    assert_near(sb[0], 70.0, 5.0, &format!("70 % container (graph)\n{ob}"));
    let each: Vec<f64> = four.into_iter().map(|k| shares(k).0[0]).collect();
    let total: f64 = each.iter().sum();
    assert_near(
        total,
        40.0,
        5.0,
        &format!("four processes together ({each:?})"),
    );
    for s in &each {
        assert!(*s > 2.0, "a process was starved: {each:?}");
    }
}

#[test]
fn burst_uses_idle_time_and_falls_back_within_a_second() {
    let Some(node) = Node::new("cores-burst", &[1024]) else {
        return;
    };
    let a = node.state("burst", Some(&cores_quota(&node, 0, 30, Some("burst"))));
    let b = node.state("hard", Some(&cores_quota(&node, 0, 70, None)));
    // A alone for 2 s (measured from 0.5 s), then 3 s more measured from 1 s in; B (hard 70 %)
    // starts at 2.2 s, so A's second window opens 0.8 s after B arrived.
    let ka = spin(
        &node,
        "proc",
        &a,
        0,
        &[
            "spin", "1000", "2", "0.5", "plain", "spin", "1000", "3", "1", "plain",
        ],
    );
    std::thread::sleep(std::time::Duration::from_millis(2200));
    let kb = spin(&node, "proc", &b, 0, &["spin", "1000", "3", "1", "plain"]);
    let (sa, oa) = shares(ka);
    let (sb, ob) = shares(kb);
    assert!(
        sa[0] >= 60.0,
        "alone, a burst container uses idle time beyond its 30 %: {oa}"
    );
    assert_near(
        sa[1],
        30.0,
        5.0,
        &format!("burst container under contention\n{oa}"),
    );
    assert_near(sb[0], 70.0, 5.0, &format!("hard neighbour\n{ob}"));
}

#[test]
fn sigkill_of_a_throttled_process_frees_its_share() {
    let Some(node) = Node::new("cores-kill", &[1024]) else {
        return;
    };
    let st = node.state("k", Some(&cores_quota(&node, 0, 20, None)));
    // a throttled process (sleeping most of the time at 20 %) is killed mid-run
    let mut victim = spin(&node, "proc", &st, 0, &["spin", "1000", "30", "1", "plain"]);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    victim.kill().unwrap();
    victim.wait().unwrap();
    // the next process of the container gets the whole share at once
    let (s, out) = shares(spin(
        &node,
        "dlsym",
        &st,
        0,
        &["spin", "1000", "3", "1", "plain"],
    ));
    assert_near(s[0], 20.0, 5.0, &format!("after SIGKILL\n{out}"));
}
