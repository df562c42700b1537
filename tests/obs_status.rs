//! `gpufence ps` and `gpufence exporter` against real runc containers started by
//! `gpufence-runtime` on the simulated node, with clients allocating concurrently in each.
//!
//! Proves: `ps --json` and a scrape (parsed by the Prometheus Python client's OpenMetrics and
//! text parsers, tests/fixtures/parse_metrics.py) agree with what each client allocated; peak,
//! refusals (count and last size) and processes; the refused process explains itself once on
//! its stderr; the node's allocated quota per GPU and create refusals by reason; a vanished
//! container disappears from both; hostile entries in the state dir (symlink, FIFO) and a
//! damaged accounting region neither hang nor crash the readers; the exporter survives 1000
//! scrapes without growing its fd count or RSS. Needs root, runc, gcc and target/venv with
//! prometheus-client (make deps).

mod common;
#[path = "fixtures/cuda_harness.rs"]
mod harness;
mod runtime_support;

use std::io::{BufRead, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::MIB;
use runtime_support::{Node, node, runtime, unique_id};
use serde_json::Value;

fn python() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/venv/bin/python");
    let ok = Command::new(&p)
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(p)
}

/// Containers and the exporter, torn down whatever happens.
struct Cleanup {
    node: PathBuf,
    root: PathBuf,
    log: PathBuf,
    ids: Vec<String>,
    exporter: Option<Child>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(mut e) = self.exporter.take() {
            let _ = e.kill();
            let _ = e.wait();
        }
        for id in &self.ids {
            let _ = Command::new(common::runc())
                .arg("--root")
                .arg(&self.root)
                .args(["kill", id, "KILL"])
                .status();
            let _ = Command::new(common::bin("gpufence-runtime"))
                .env("GPUFENCE_CONFIG", &self.node)
                .arg("--root")
                .arg(&self.root)
                .arg("--log")
                .arg(&self.log)
                .args(["delete", "--force", id])
                .status();
        }
    }
}

/// Start a detached container running `script` (stdout/stderr to `<bundle>/out`).
fn start(
    n: &Node,
    s: &Path,
    c: &mut Cleanup,
    name: &str,
    script: &str,
    annotations: &[(&str, &str)],
) -> (String, PathBuf) {
    let b = runtime_support::bundle(s, name, script, annotations, &[]);
    let rootfs = common::glibc_rootfs(&b);
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let bin = rootfs.join("usr/local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(&harness::clients().0, bin.join("cuda_client")).unwrap();
    let id = unique_id(name);
    let out = b.join("out");
    let f = std::fs::File::create(&out).unwrap();
    let status = Command::new(common::bin("gpufence-runtime"))
        .env("GPUFENCE_CONFIG", &n.config)
        .arg("--root")
        .arg(&c.root)
        .arg("--log")
        .arg(&c.log)
        .args(["--log-format", "json", "run", "--detach", "--bundle"])
        .arg(&b)
        .arg(&id)
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .status()
        .unwrap();
    c.ids.push(id.clone());
    assert!(
        status.success(),
        "run {name}: {}",
        std::fs::read_to_string(&out).unwrap_or_default()
    );
    (id, out)
}

fn wait_for(out: &Path, word: &str) -> String {
    let t = Instant::now();
    loop {
        let text = std::fs::read_to_string(out).unwrap_or_default();
        if text.lines().any(|l| l == word) {
            return text;
        }
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "no {word:?} in {out:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ps(n: &Node) -> Vec<Value> {
    let (code, out, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&n.config)
            .args(["ps", "--json"]),
    );
    assert_eq!(code, 0, "gpufence ps: {err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["containers"].as_array().unwrap().clone()
}

fn find<'a>(list: &'a [Value], id: &str) -> Option<&'a Value> {
    list.iter().find(|c| c["id"] == id)
}

fn get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    r.split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default()
}

/// Samples of a scrape as parsed by the Python client: (name, labels) → value.
fn parse(py: &Path, body: &str) -> Vec<(String, serde_json::Map<String, Value>, f64)> {
    let mut child = Command::new(py)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parse_metrics.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "parser: {}\n{body}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    v.into_iter()
        .map(|s| {
            (
                s[0].as_str().unwrap().to_string(),
                s[1].as_object().unwrap().clone(),
                s[2].as_f64().unwrap(),
            )
        })
        .collect()
}

fn sample(
    samples: &[(String, serde_json::Map<String, Value>, f64)],
    name: &str,
    container: &str,
) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name && l.get("container").and_then(|c| c.as_str()) == Some(container)
        })
        .map(|s| s.2)
}

fn proc_status(pid: u32) -> (u64, usize) {
    // let the server finish closing the last connection
    std::thread::sleep(Duration::from_millis(300));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    (rss, fds)
}

/// The container's region file as the host can reach it: in the state dir, else through the
/// container's init.
fn region_path(n: &Node, root: &Path, id: &str) -> PathBuf {
    let host = n.state_dir.join(id).join("accounting");
    if host.exists() {
        return host;
    }
    let (_, out, _) = common::run(
        Command::new(common::runc())
            .arg("--root")
            .arg(root)
            .args(["state", id]),
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    PathBuf::from(format!("/proc/{}/root/run/gpufence/accounting", v["pid"]))
}

const HOLD: &str = "C=/usr/local/bin/cuda_client\n";

#[test]
fn ps_and_exporter_agree_with_the_clients() {
    if common::skip_unless(&["runc", "gcc"]) {
        return;
    }
    let Some(py) = python() else {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "target/venv with prometheus-client missing (make deps)"
        );
        eprintln!("SKIP: no target/venv with prometheus-client (make deps)");
        return;
    };
    let s = common::scratch("obs-status");
    // The containers carry CRI names (for the display) but no kubelet: their GPU annotations are
    // believed here (allocation.trust-annotations = true; the trust model has its own tests).
    let n = node(
        &s,
        2,
        &[("allocation.trust-annotations", toml_edit::value(true))],
    );
    let mut c = Cleanup {
        node: n.config.clone(),
        root: s.join("runc-root"),
        log: s.join("runc.log"),
        ids: Vec::new(),
        exporter: None,
    };
    let k8s = |ns: &'static str, pod: &'static str, ctr: &'static str| {
        vec![
            ("io.kubernetes.cri.sandbox-namespace", ns),
            ("io.kubernetes.cri.sandbox-name", pod),
            ("io.kubernetes.cri.container-name", ctr),
        ]
    };
    // A: GPU 0, 100 MiB. Two holders (30 + 20 MiB) and a transient 10 MiB; the 20 MiB holder is
    // refused 90 MiB twice (20 + 90 > 100 whatever the others do) and explains it once.
    let script_a = format!(
        "{HOLD}$C dlsym alloc {} hold > /tmp/c1 2>&1 &\n$C dlsym alloc {} alloc {} alloc {} hold > /tmp/c2 2>&1 &\n\
         $C dlsym alloc {} free > /tmp/c3 2>&1\n\
         while ! grep -q holding /tmp/c1 || ! grep -q holding /tmp/c2; do sleep 0.05; done\n\
         sed 's/^/c2 /' /tmp/c2; echo ready; exec sleep 1000",
        30 * MIB,
        20 * MIB,
        90 * MIB,
        90 * MIB,
        10 * MIB
    );
    let mut ann_a = k8s("team-a", "trainer-0", "main");
    ann_a.extend([
        ("gpufence.dev/devices", "0"),
        ("gpufence.dev/memory", "100Mi"),
    ]);
    let (a, out_a) = start(&n, &s, &mut c, "obs-a", &script_a, &ann_a);
    // B: GPU 1, 64 MiB, no Kubernetes names.
    let script_b = format!(
        "{HOLD}$C dlsym alloc {} hold > /tmp/c1 2>&1 &\nwhile ! grep -q holding /tmp/c1; do sleep 0.05; done\necho ready; exec sleep 1000",
        10 * MIB
    );
    let (b, out_b) = start(
        &n,
        &s,
        &mut c,
        "obs-b",
        &script_b,
        &[
            ("gpufence.dev/devices", "1"),
            ("gpufence.dev/memory", "64Mi"),
        ],
    );
    // C: GPU 1, 200 MiB, four concurrent 25 MiB holders.
    let mut script_c = HOLD.to_string();
    for i in 1..=4 {
        script_c.push_str(&format!(
            "$C dlsym alloc {} hold > /tmp/c{i} 2>&1 &\n",
            25 * MIB
        ));
    }
    script_c.push_str("for i in 1 2 3 4; do while ! grep -q holding /tmp/c$i; do sleep 0.05; done; done\necho ready; exec sleep 1000");
    let mut ann_c = k8s("team-b", "infer-1", "server");
    ann_c.extend([
        ("gpufence.dev/devices", "1"),
        ("gpufence.dev/memory", "200Mi"),
    ]);
    let (cc, out_c) = start(&n, &s, &mut c, "obs-c", &script_c, &ann_c);
    let text_a = wait_for(&out_a, "ready");
    wait_for(&out_b, "ready");
    wait_for(&out_c, "ready");

    // One refused creation (unknown GPU) for the node counter.
    let bad = runtime_support::bundle(&s, "obs-bad", "true", &[("gpufence.dev/devices", "9")], &[]);
    let (code, _, _) = runtime(
        &n,
        &c.root,
        &c.log,
        &[
            "run",
            "--bundle",
            bad.to_str().unwrap(),
            &unique_id("obs-bad"),
        ],
    );
    assert_eq!(code, 1);

    // The refused process said why, once.
    let said: Vec<&str> = text_a
        .lines()
        .filter(|l| l.starts_with("c2 gpufence: "))
        .collect();
    assert_eq!(said.len(), 1, "{text_a}");
    assert!(
        said[0].starts_with("c2 gpufence: cuMemAlloc of 90.0 MiB refused on GPU 0: ")
            && said[0].ends_with(" of this container's 100 MiB quota in use"),
        "{text_a}"
    );
    assert_eq!(
        text_a.matches("alloc 94371840 err 2").count(),
        2,
        "{text_a}"
    );

    // gpufence ps --json
    let list = ps(&n);
    let ca = find(&list, &a).unwrap_or_else(|| panic!("{a} not in {list:?}"));
    let d = &ca["devices"][0];
    assert_eq!(
        (
            ca["namespace"].as_str(),
            ca["pod"].as_str(),
            ca["container"].as_str()
        ),
        (Some("team-a"), Some("trainer-0"), Some("main"))
    );
    assert_eq!(d["index"], "0");
    assert_eq!(d["uuid"], gpufence::sim::gpu_uuid(0));
    assert_eq!(d["limit"], 100 * MIB);
    assert_eq!(d["used"], 50 * MIB, "{ca}");
    let peak = d["peak"].as_u64().unwrap();
    assert!((50 * MIB..=60 * MIB).contains(&peak), "{ca}");
    assert_eq!(d["refusals"], 2);
    assert_eq!(d["last_refused"], 90 * MIB);
    assert_eq!(ca["pids"].as_array().unwrap().len(), 2, "{ca}");
    let cb = find(&list, &b).unwrap();
    assert!(cb["pod"].is_null());
    assert_eq!(
        (
            cb["devices"][0]["used"].as_u64(),
            cb["devices"][0]["refusals"].as_u64()
        ),
        (Some(10 * MIB), Some(0))
    );
    let ccs = find(&list, &cc).unwrap();
    assert_eq!(ccs["devices"][0]["used"], 100 * MIB);
    assert_eq!(ccs["devices"][0]["index"], "1");
    assert_eq!(ccs["pids"].as_array().unwrap().len(), 4);
    // sorted: no-namespace first, then team-a, team-b
    let pos = |id: &str| list.iter().position(|c| c["id"] == id).unwrap();
    assert!(pos(&b) < pos(&a) && pos(&a) < pos(&cc), "{list:?}");
    // the table
    let (code, table, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&n.config)
            .arg("ps"),
    );
    assert_eq!(code, 0, "{err}");
    // `ps` shows the first 12 characters of an id; a short PID makes a shorter id.
    let a_shown: String = a.chars().take(12).collect();
    let row = table
        .lines()
        .find(|l| l.starts_with(&a_shown))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("team-a") && row.contains("50 MiB") && row.contains("100 MiB"),
        "{table}"
    );
    assert_eq!(table.lines().count(), 4, "{table}");

    // --watch --json: one document per refresh.
    let mut w = Command::new(common::bin("gpufence"))
        .arg("--config")
        .arg(&n.config)
        .args(["ps", "--json", "--watch", "--interval", "0.2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut r = std::io::BufReader::new(w.stdout.take().unwrap());
    for _ in 0..2 {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert_eq!(v["containers"].as_array().map(Vec::len), Some(3), "{l}");
    }
    let _ = w.kill();
    let _ = w.wait();

    // The exporter.
    let mut exp = Command::new(common::bin("gpufence"))
        .arg("--config")
        .arg(&n.config)
        .args(["exporter", "--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(exp.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let exp_pid = exp.id();
    c.exporter = Some(exp);
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    let m = parse(&py, &get(&addr, "/metrics"));
    let used = |ctr: &str| sample(&m, "gpufence_container_gpu_memory_used_bytes", ctr);
    assert_eq!(used("main"), Some((50 * MIB) as f64));
    assert_eq!(
        used(&b),
        Some((10 * MIB) as f64),
        "container outside Kubernetes: named by id"
    );
    assert_eq!(used("server"), Some((100 * MIB) as f64));
    assert_eq!(
        sample(&m, "gpufence_container_gpu_memory_limit_bytes", "main"),
        Some((100 * MIB) as f64)
    );
    assert_eq!(
        sample(&m, "gpufence_container_gpu_memory_peak_bytes", "main"),
        Some(peak as f64)
    );
    assert_eq!(
        sample(&m, "gpufence_container_gpu_alloc_refusals_total", "main"),
        Some(2.0)
    );
    let labels = &m
        .iter()
        .find(|s| s.0 == "gpufence_container_gpu_memory_used_bytes" && s.1["container"] == "server")
        .unwrap()
        .1;
    assert_eq!(
        (
            labels["namespace"].as_str(),
            labels["pod"].as_str(),
            labels["gpu_index"].as_str()
        ),
        (Some("team-b"), Some("infer-1"), Some("1"))
    );
    assert_eq!(labels["gpu_uuid"], gpufence::sim::gpu_uuid(1));
    let node_alloc = |i: &str| {
        m.iter()
            .find(|s| s.0 == "gpufence_node_gpu_memory_allocated_bytes" && s.1["gpu_index"] == i)
            .map(|s| s.2)
    };
    assert_eq!(node_alloc("0"), Some((100 * MIB) as f64));
    assert_eq!(node_alloc("1"), Some((264 * MIB) as f64));
    let refused = |r: &str| {
        m.iter()
            .find(|s| s.0 == "gpufence_create_refusals_total" && s.1["reason"] == r)
            .map(|s| s.2)
    };
    assert_eq!(refused("allocation"), Some(1.0));
    assert_eq!(refused("host"), Some(0.0));

    // B vanishes: gone from both.
    let (code, _, err) = runtime(&n, &c.root, &c.log, &["delete", "--force", &b]);
    assert_eq!(code, 0, "{err}");
    assert!(find(&ps(&n), &b).is_none());
    let m = parse(&py, &get(&addr, "/metrics"));
    assert!(
        !m.iter()
            .any(|s| s.1.get("container").and_then(|v| v.as_str()) == Some(b.as_str())),
        "{m:?}"
    );
    assert_eq!(node_alloc_of(&m, "1"), Some((200 * MIB) as f64));

    // Hostile entries: a status record that is a symlink, one that is a FIFO; C's region damaged.
    let evil = n.state_dir.join("evil-1");
    std::fs::create_dir_all(&evil).unwrap();
    std::os::unix::fs::symlink(
        n.state_dir.join(&a).join("status.json"),
        evil.join("status.json"),
    )
    .unwrap();
    std::fs::copy(n.state_dir.join(&a).join("quota"), evil.join("quota")).unwrap();
    let fifo = n.state_dir.join("evil-2");
    std::fs::create_dir_all(&fifo).unwrap();
    nix::unistd::mkfifo(
        &fifo.join("status.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let region = region_path(&n, &c.root, &cc);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&region)
        .unwrap();
    f.write_all(&[0xff; 16]).unwrap();
    drop(f);
    let list = ps(&n);
    assert_eq!(list.len(), 2, "{list:?}");
    let broken = find(&list, &cc).unwrap();
    assert!(
        broken["error"]
            .as_str()
            .is_some_and(|e| e.contains("foreign header")),
        "{broken}"
    );
    assert_eq!(broken["devices"][0]["limit"], 200 * MIB);
    let m = parse(&py, &get(&addr, "/metrics"));
    assert_eq!(
        sample(&m, "gpufence_container_gpu_memory_used_bytes", "server"),
        None
    );
    assert_eq!(
        sample(&m, "gpufence_container_gpu_memory_limit_bytes", "server"),
        Some((200 * MIB) as f64)
    );
    assert_eq!(used_of(&m, "main"), Some((50 * MIB) as f64));

    // 1000 scrapes: alive, no fd or memory growth.
    for _ in 0..50 {
        get(&addr, "/metrics");
    }
    let (rss0, fds0) = proc_status(exp_pid);
    for _ in 0..1000 {
        get(&addr, "/metrics");
    }
    let (rss1, fds1) = proc_status(exp_pid);
    assert!(
        c.exporter.as_mut().unwrap().try_wait().unwrap().is_none(),
        "exporter died"
    );
    let fds = || {
        std::fs::read_dir(format!("/proc/{exp_pid}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .collect::<Vec<_>>()
    };
    assert_eq!(fds0, fds1, "exporter fds grew: {:?}", fds());
    assert!(
        rss1 < rss0 + 1024,
        "exporter RSS grew from {rss0} kB to {rss1} kB"
    );
    eprintln!("exporter: RSS {rss0} -> {rss1} kB, fds {fds0} -> {fds1} over 1000 scrapes");
}

fn node_alloc_of(m: &[(String, serde_json::Map<String, Value>, f64)], i: &str) -> Option<f64> {
    m.iter()
        .find(|s| s.0 == "gpufence_node_gpu_memory_allocated_bytes" && s.1["gpu_index"] == i)
        .map(|s| s.2)
}

fn used_of(m: &[(String, serde_json::Map<String, Value>, f64)], ctr: &str) -> Option<f64> {
    sample(m, "gpufence_container_gpu_memory_used_bytes", ctr)
}
