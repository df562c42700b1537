//! gpufence-runtime end to end: real runc, simulated node, as root.
//!
//! Proves: the granted GPU opens with ENXIO (allowed by the device cgroup, no driver behind
//! it); other GPUs are absent and EPERM when created by hand; control nodes present; driver files
//! mounted read-only; /etc/ld.so.preload names the shim; the quota file is present and
//! read-only; env set; an invalid allocation leaves no container, config.json byte-identical and
//! the message on stderr and in runc's log; untrusted image env gets no GPU; delete removes the
//! state directory; everything else passes through.

mod common;
mod runtime_support;

use runtime_support::{PROBE, bundle, facts, node, runc_list, runtime, unique_id};

#[test]
fn granted_gpu_and_only_it() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-grant");
    let n = node(&s, 8, &[]);
    // No NVML on the create path: with the cache filled, break the NVML the config names.
    let cfg: toml::Table = toml::from_str(&std::fs::read_to_string(&n.config).unwrap()).unwrap();
    let nvml = std::path::PathBuf::from(cfg["nvml-library"].as_str().unwrap());
    let _ = std::fs::remove_file(&nvml);
    std::os::unix::fs::symlink("/nonexistent/libnvidia-ml.so.1", &nvml).unwrap();
    let b = bundle(
        &s,
        "b",
        PROBE,
        &[
            ("gpufence.dev/devices", "1"),
            ("gpufence.dev/memory", "1Gi"),
        ],
        &[],
    );
    let root = s.join("runc-root");
    let id = unique_id("grant");
    let (code, out, err) = runtime(
        &n,
        &root,
        &s.join("runc.log"),
        &["run", "-b", b.to_str().unwrap(), &id],
    );
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let f = facts(&out);
    assert_eq!(f["done"], "1", "{out}");
    assert_eq!(f["gpu1"], "ENXIO", "granted GPU: {out}");
    for g in [0, 2, 3, 4, 5, 6, 7] {
        assert_eq!(f[&format!("gpu{g}")], "ABSENT", "gpu{g}: {out}");
    }
    assert_eq!(f["mknod0"], "EPERM", "hand-made node of another GPU: {out}");
    assert_eq!(f["ctl"], "ENXIO", "{out}");
    assert_eq!(f["uvm"], "ENXIO", "{out}");
    assert_eq!(f["preload"], "/usr/lib/gpufence/libgpufence.so", "{out}");
    assert_eq!(f["quota_mem"], (1u64 << 30).to_string(), "{out}");
    assert!(f["quota_uuid"].starts_with("GPU-"), "{out}");
    assert_eq!(f["quota_write"], "DENIED", "{out}");
    assert!(
        f["nvml_mount"].contains(" ro,") || f["nvml_mount"].contains(" ro "),
        "driver lib mounted ro: {out}"
    );
    assert_eq!(f["lib_write"], "DENIED", "{out}");
    assert_eq!(f["env_mem"], (1u64 << 30).to_string(), "{out}");
    assert_eq!(f["env_state"], "/run/gpufence", "{out}");

    // The edited spec: unknown field kept, the GPU in linux.devices and the allow rules.
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        spec["linux"]["gpufenceTestUnknown"]["keep"],
        serde_json::json!([1, 2, 3])
    );
    let devs = spec["linux"]["devices"].as_array().unwrap();
    assert!(
        devs.iter()
            .any(|d| d["path"] == "/dev/nvidia1" && d["major"] == 195 && d["minor"] == 1)
    );
    assert!(!devs.iter().any(|d| d["path"] == "/dev/nvidia0"));
    let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r["allow"] == true && r["major"] == 195 && r["minor"] == 1)
    );
    assert!(std::fs::metadata(b.join("config.json")).is_ok());

    // The decision was logged with the container id.
    let log = std::fs::read_to_string(&n.log).unwrap();
    assert!(
        log.lines().any(|l| l.contains(&id) && l.contains("GPU-")),
        "{log}"
    );

    // `run` exited; delete removes the state directory.
    let state = n.state_dir.join(&id);
    assert!(state.join("quota").exists());
    let (code, _, err) = runtime(&n, &root, &s.join("runc.log"), &["delete", "--force", &id]);
    assert_eq!(code, 0, "{err}");
    assert!(!state.exists(), "state dir removed on delete");
    assert!(!runc_list(&root).contains(&id));
}

#[test]
fn invalid_allocation_creates_nothing() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-invalid");
    let n = node(&s, 2, &[]);
    let b = bundle(
        &s,
        "b",
        "echo should-not-run",
        &[("gpufence.dev/devices", "7")],
        &[],
    );
    let before = std::fs::read(b.join("config.json")).unwrap();
    let root = s.join("runc-root");
    let runc_log = s.join("runc.log");
    let id = unique_id("invalid");
    let (code, out, err) = runtime(
        &n,
        &root,
        &runc_log,
        &["create", "--bundle", b.to_str().unwrap(), &id],
    );
    assert_eq!(code, 1, "stdout {out} stderr {err}");
    assert!(!out.contains("should-not-run"));
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {err}");
    assert!(lines[0].contains("gpufence.dev/devices"), "{err}");
    assert_eq!(
        std::fs::read(b.join("config.json")).unwrap(),
        before,
        "config.json byte-identical"
    );
    assert!(!runc_list(&root).contains(&id), "no container left");
    assert!(!n.state_dir.join(&id).exists());
    // runc's log: one JSON error line, the way containerd reads it.
    let log = std::fs::read_to_string(&runc_log).unwrap();
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(last["level"], "error");
    assert!(
        last["msg"]
            .as_str()
            .unwrap()
            .contains("gpufence.dev/devices"),
        "{log}"
    );
    assert!(last["time"].as_str().unwrap().ends_with('Z'));

    // Text log format too.
    let text_log = s.join("runc-text.log");
    let (code, _, _) = common::run(
        std::process::Command::new(common::bin("gpufence-runtime"))
            .env("GPUFENCE_CONFIG", &n.config)
            .arg("--root")
            .arg(&root)
            .arg(format!("--log={}", text_log.display()))
            .args(["create", "-b", b.to_str().unwrap(), &id]),
    );
    assert_eq!(code, 1);
    let t = std::fs::read_to_string(&text_log).unwrap();
    assert!(
        t.starts_with("time=\"") && t.contains(" level=error msg=\""),
        "{t}"
    );
}

#[test]
fn untrusted_env_gets_no_gpu_and_no_allocation_is_invisible() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-env");
    let n = node(&s, 2, &[]);
    let root = s.join("runc-root");

    // Image env NVIDIA_VISIBLE_DEVICES=all, trust-env = false: no GPU.
    let b = bundle(&s, "b", PROBE, &[], &["NVIDIA_VISIBLE_DEVICES=all"]);
    let id = unique_id("env");
    let (code, out, err) = runtime(
        &n,
        &root,
        &s.join("runc.log"),
        &["run", "--bundle", b.to_str().unwrap(), &id],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let f = facts(&out);
    for g in 0..2 {
        assert_eq!(f[&format!("gpu{g}")], "ABSENT", "{out}");
    }
    assert_eq!(f["ctl"], "ABSENT", "{out}");
    assert_eq!(f["preload"], "", "{out}");
    assert_ne!(f["env_nvd"], "all", "untrusted env neutralised: {out}");
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
    assert!(
        spec["linux"]
            .get("devices")
            .is_none_or(|d| d.as_array().unwrap().is_empty())
    );
    let _ = runtime(&n, &root, &s.join("runc.log"), &["delete", "-f", &id]);

    // Nothing asked: config.json is not even rewritten.
    let b2 = bundle(&s, "b2", "echo plain", &[], &[]);
    let before = std::fs::read(b2.join("config.json")).unwrap();
    let id2 = unique_id("plain");
    let (code, out, err) = runtime(
        &n,
        &root,
        &s.join("runc.log"),
        &["run", "-b", b2.to_str().unwrap(), &id2],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "plain");
    assert_eq!(std::fs::read(b2.join("config.json")).unwrap(), before);
    let _ = runtime(&n, &root, &s.join("runc.log"), &["delete", "-f", &id2]);
}

#[test]
fn pass_through_is_exact() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-pass");
    let cfg = s.join("gpufence.toml");
    let runc = common::runc();
    std::fs::write(&cfg, format!("[runtime]\npath = \"{}\"\n", runc.display())).unwrap();
    let wrapped = |args: &[&str]| {
        common::run(
            std::process::Command::new(common::bin("gpufence-runtime"))
                .env("GPUFENCE_CONFIG", &cfg)
                .args(args),
        )
    };
    let plain = |args: &[&str]| common::run(std::process::Command::new(common::runc()).args(args));
    assert_eq!(wrapped(&["--version"]), plain(&["--version"]));
    let root = s.join("root");
    let r = root.to_str().unwrap();
    let (wc, wo, we) = wrapped(&["--root", r, "state", "no-such-container"]);
    let (pc, po, pe) = plain(&["--root", r, "state", "no-such-container"]);
    assert_eq!((wc, wo), (pc, po));
    assert_ne!(wc, 0);
    assert!(
        we.contains("does not exist") && pe.contains("does not exist"),
        "{we} / {pe}"
    );
    // Unknown global flags reach runc untouched (and runc rejects them itself).
    let (wc, _, we) = wrapped(&["--no-such-flag", "list"]);
    let (pc, _, pe) = plain(&["--no-such-flag", "list"]);
    assert_eq!(wc, pc);
    // runc's log line carries a timestamp that may tick between the two runs.
    let msg = |e: &str| {
        e.lines()
            .next()
            .map(|l| l.split_once(" level=").map_or(l, |(_, m)| m).to_string())
    };
    assert_eq!(msg(&we), msg(&pe));
    assert!(msg(&we).is_some_and(|m| m.contains("no-such-flag")), "{we}");

    // runtime.path naming gpufence-runtime itself is refused rather than looping.
    std::fs::write(
        &cfg,
        format!(
            "[runtime]\npath = \"{}\"\n",
            common::bin("gpufence-runtime").display()
        ),
    )
    .unwrap();
    let (code, _, err) = wrapped(&["list"]);
    assert_ne!(code, 0);
    assert!(err.contains("itself"), "{err}");
}

#[test]
fn nvml_in_the_container_sees_only_the_granted_gpu() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-nvml");
    let n = node(&s, 4, &[]);
    let (code, inv, err) = common::run(
        std::process::Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&n.config)
            .args(["inventory", "--json"]),
    );
    assert_eq!(code, 0, "{err}");
    let inv: serde_json::Value = serde_json::from_str(&inv).unwrap();
    let uuids: Vec<String> = inv["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(uuids.len(), 4);
    // nvidia-smi (from the simulated driver root, mounted by the plan) is dynamically linked.
    let b = bundle(
        &s,
        "b",
        "nvidia-smi 2>&1; echo rc=$?",
        &[
            ("gpufence.dev/devices", "2"),
            ("gpufence.dev/memory", "2Gi"),
        ],
        &[],
    );
    common::glibc_rootfs(&b);
    let root = s.join("runc-root");
    let id = unique_id("nvml");
    let (code, out, err) = runtime(
        &n,
        &root,
        &s.join("runc.log"),
        &["run", "-b", b.to_str().unwrap(), &id],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("rc=0"), "nvidia-smi ran: {out}");
    assert!(out.contains(&uuids[2]), "granted GPU visible: {out}");
    for (i, u) in uuids.iter().enumerate() {
        if i != 2 {
            assert!(
                !out.contains(u.as_str()),
                "GPU {i} must be invisible: {out}"
            );
        }
    }
    assert_eq!(
        out.lines().filter(|l| l.starts_with("GPU ")).count(),
        1,
        "{out}"
    );
    let _ = runtime(&n, &root, &s.join("runc.log"), &["delete", "-f", &id]);
}

#[test]
fn shim_by_ld_preload_env() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-envshim");
    let n = node(&s, 2, &[("shim.inject", toml_edit::value("env"))]);
    let b = bundle(
        &s,
        "b",
        "echo \"ldp=$LD_PRELOAD\"; echo \"preload=$(cat /etc/ld.so.preload 2>/dev/null)\"; test -r /usr/lib/gpufence/libgpufence.so && echo shim=present",
        &[("gpufence.dev/devices", "0")],
        &["LD_PRELOAD=/usr/lib/libother.so"],
    );
    let root = s.join("runc-root");
    let id = unique_id("envshim");
    let (code, out, err) = runtime(
        &n,
        &root,
        &s.join("runc.log"),
        &["run", "-b", b.to_str().unwrap(), &id],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let f = facts(&out);
    assert_eq!(
        f["ldp"], "/usr/lib/gpufence/libgpufence.so:/usr/lib/libother.so",
        "{out}"
    );
    assert_eq!(
        f["preload"], "",
        "no ld.so.preload with inject = env: {out}"
    );
    assert_eq!(f["shim"], "present", "{out}");
    let _ = runtime(&n, &root, &s.join("runc.log"), &["delete", "-f", &id]);
}

#[test]
fn broken_config_fails_closed() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-badcfg");
    let b = bundle(&s, "b", "echo ran", &[], &[]);
    let before = std::fs::read(b.join("config.json")).unwrap();
    let cfg = s.join("gpufence.toml");
    std::fs::write(&cfg, "[allocation]\ntrust-env = \"maybe\"\n").unwrap();
    let root = s.join("runc-root");
    let runc_log = s.join("runc.log");
    let id = unique_id("badcfg");
    let (code, out, err) = common::run(
        std::process::Command::new(common::bin("gpufence-runtime"))
            .env("GPUFENCE_CONFIG", &cfg)
            .arg("--root")
            .arg(&root)
            .arg("--log")
            .arg(&runc_log)
            .args([
                "--log-format",
                "json",
                "run",
                "-b",
                b.to_str().unwrap(),
                &id,
            ]),
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(!out.contains("ran"));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(cfg.to_str().unwrap()), "names the file: {err}");
    assert!(
        std::fs::read_to_string(&runc_log)
            .unwrap()
            .contains("gpufence.toml")
    );
    assert_eq!(std::fs::read(b.join("config.json")).unwrap(), before);
    assert!(!runc_list(&root).contains(&id));
}
