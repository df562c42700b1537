//! `gpufence plan --bundle DIR [--json]` against a simulated node (fake device nodes, mock NVML):
//! text and JSON output, exit 1 with one line on an invalid allocation, foreign CDI specs from
//! `--cdi-dir`, and that nothing is written.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn bundle(
    dir: &Path,
    name: &str,
    annotations: serde_json::Value,
    env: &[&str],
) -> std::path::PathBuf {
    let b = dir.join(name);
    std::fs::create_dir_all(&b).unwrap();
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "env": env, "cwd": "/"},
        "root": {"path": "rootfs"},
        "annotations": annotations,
        "futureField": {"kept": true},
    });
    std::fs::write(
        b.join("config.json"),
        serde_json::to_string_pretty(&spec).unwrap(),
    )
    .unwrap();
    b
}

fn plan_cmd(cfg: &Path, b: &Path, extra: &[&str]) -> (i32, String, String) {
    let mut c = Command::new(bin("gpufence"));
    c.arg("--config")
        .arg(cfg)
        .arg("plan")
        .arg("--bundle")
        .arg(b);
    c.args(extra);
    run(&mut c)
}

#[test]
fn plan_cli_against_a_simulated_node() {
    if skip_unless(&[]) {
        return;
    }
    let dir = scratch("alloc-cli");
    let cfg = sim_node(&dir.join("node"), 2, Some(1));
    let nocdi = dir.join("no-cdi");
    let nocdi_s = nocdi.to_str().unwrap();

    // Text.
    let b = bundle(
        &dir,
        "ctr-text",
        serde_json::json!({"gpufence.dev/devices": "0", "gpufence.dev/memory": "4Gi"}),
        &["NVIDIA_VISIBLE_DEVICES=all"],
    );
    let before = std::fs::read(b.join("config.json")).unwrap();
    let (code, out, err) = plan_cmd(&cfg, &b, &["--cdi-dir", nocdi_s]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("container ctr-text"), "{out}");
    assert!(out.contains("/dev/nvidia0  c 195:0"), "{out}");
    assert!(out.contains("c 195:255 rw"), "{out}");
    assert!(out.contains("GPUFENCE_MEMORY_LIMIT_0=4294967296"), "{out}");
    assert!(
        out.contains("ignored NVIDIA_VISIBLE_DEVICES=\"all\" (replaced by the allocated devices)"),
        "{out}"
    );
    assert!(!out.contains("/dev/nvidia1 "), "GPU 1 not allocated: {out}");
    // What the shim's quota is, and is not (issue 15.9).
    assert!(
        out.contains("isolation: ") && out.contains("driver backend or MIG"),
        "{out}"
    );
    // Dry run: the bundle and the state directory are untouched.
    assert_eq!(std::fs::read(b.join("config.json")).unwrap(), before);
    let cfg_text = std::fs::read_to_string(&cfg).unwrap();
    let state: String = cfg_text
        .lines()
        .find_map(|l| {
            l.strip_prefix("state-dir = ")
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap();
    assert!(!Path::new(&state).join("ctr-text").exists());

    // JSON: the documented shape.
    let (code, out, err) = plan_cmd(&cfg, &b, &["--json", "--id", "abc", "--cdi-dir", nocdi_s]);
    assert_eq!(code, 0, "{err}");
    let p: gpufence::plan::Plan = serde_json::from_str(&out).unwrap();
    assert_eq!(p.container_id, "abc");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for k in [
        "containerId",
        "allocation",
        "edits",
        "cgroupRules",
        "quota",
        "stateDir",
        "hostFiles",
        "envOverrides",
        "notes",
        "isolation",
    ] {
        assert!(v.get(k).is_some(), "missing {k}: {out}");
    }
    assert_eq!(v["allocation"]["devices"][0]["device"]["type"], "gpu");
    assert_eq!(v["allocation"]["devices"][0]["memoryLimit"], 4u64 << 30);
    assert_eq!(v["cgroupRules"][0]["type"], "c");
    assert!(v["stateDir"].as_str().unwrap().ends_with("/abc"));
    assert!(
        v["isolation"]
            .as_str()
            .is_some_and(|i| i.contains("not a hard boundary")),
        "{out}"
    );

    // MIG on the simulated MIG GPU.
    let b = bundle(
        &dir,
        "ctr-mig",
        serde_json::json!({"gpufence.dev/devices": "1:0"}),
        &[],
    );
    let (code, out, err) = plan_cmd(&cfg, &b, &["--json", "--cdi-dir", nocdi_s]);
    assert_eq!(code, 0, "{err}");
    let p: gpufence::plan::Plan = serde_json::from_str(&out).unwrap();
    assert!(
        p.edits
            .device_nodes
            .iter()
            .any(|d| d.path.starts_with("/dev/nvidia-caps/")),
        "{out}"
    );
    assert!(p.quota.unwrap().devices[0].uuid.starts_with("MIG-"));

    // Invalid allocation: exit 1, one line naming the key and value.
    let b = bundle(
        &dir,
        "ctr-bad",
        serde_json::json!({"gpufence.dev/devices": "0", "gpufence.dev/memory": "9000Gi"}),
        &[],
    );
    let (code, out, err) = plan_cmd(&cfg, &b, &["--cdi-dir", nocdi_s]);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("gpufence.dev/memory=\"9000Gi\""), "{err}");
    assert!(out.is_empty());
    let b = bundle(
        &dir,
        "ctr-bad2",
        serde_json::json!({"gpufence.dev/devices": "7"}),
        &[],
    );
    let (code, _, err) = plan_cmd(&cfg, &b, &["--cdi-dir", nocdi_s]);
    assert_eq!(code, 1);
    assert!(
        err.contains("gpufence.dev/devices=\"7\"") && err.contains("no GPU with index 7"),
        "{err}"
    );

    // A compute share on a MIG device: refused at plan time with one line.
    let b = bundle(
        &dir,
        "ctr-mig-cores",
        serde_json::json!({"gpufence.dev/devices": "1:0", "gpufence.dev/cores": "30"}),
        &[],
    );
    let (code, out, err) = plan_cmd(&cfg, &b, &["--cdi-dir", nocdi_s]);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("gpufence.dev/cores=\"30\"") && err.contains("already isolates compute"),
        "{err}"
    );
    // The burst policy reaches the plan's env and quota.
    let b = bundle(
        &dir,
        "ctr-burst",
        serde_json::json!({"gpufence.dev/devices": "0", "gpufence.dev/cores": "30",
                           "gpufence.dev/cores-policy": "burst"}),
        &[],
    );
    let (code, out, err) = plan_cmd(&cfg, &b, &["--json", "--cdi-dir", nocdi_s]);
    assert_eq!(code, 0, "{err}");
    let p: gpufence::plan::Plan = serde_json::from_str(&out).unwrap();
    assert!(p.quota.as_ref().unwrap().cores_burst, "{out}");
    assert!(
        p.edits
            .env
            .contains(&"GPUFENCE_CORES_POLICY=burst".to_string()),
        "{out}"
    );
    assert!(
        p.host_files
            .iter()
            .any(|f| f.contents.contains("cores-policy=burst")),
        "{out}"
    );

    // No allocation.
    let b = bundle(
        &dir,
        "ctr-none",
        serde_json::json!({}),
        &["NVIDIA_VISIBLE_DEVICES=all"],
    );
    let (code, out, _) = plan_cmd(&cfg, &b, &["--cdi-dir", nocdi_s]);
    assert_eq!(code, 0);
    assert!(out.contains("allocation: none"), "{out}");
    assert!(out.contains("NVIDIA_VISIBLE_DEVICES=void"), "{out}");
    assert!(!out.contains("/dev/nvidia"), "{out}");

    // Missing bundle: exit 1.
    let (code, _, err) = plan_cmd(&cfg, &dir.join("nope"), &[]);
    assert_eq!(code, 1, "{err}");

    // Foreign CDI specs, later directory wins; device numbers filled from the host node.
    let lo = dir.join("cdi-etc");
    let hi = dir.join("cdi-run");
    std::fs::create_dir_all(&lo).unwrap();
    std::fs::create_dir_all(&hi).unwrap();
    let spec = |env: &str| {
        format!(
            "cdiVersion: \"0.5.0\"\nkind: example.com/null\ndevices:\n- name: dev0\n  containerEdits:\n    deviceNodes:\n    - path: /dev/xnull\n      hostPath: /dev/null\n    env: [{env}]\n"
        )
    };
    std::fs::write(lo.join("x.yaml"), spec("WHO=etc")).unwrap();
    std::fs::write(hi.join("x.yaml"), spec("WHO=run")).unwrap();
    std::fs::write(lo.join("broken.json"), "{\"cdiVersion\":").unwrap();
    let b = bundle(
        &dir,
        "ctr-cdi",
        serde_json::json!({"cdi.k8s.io/example": "example.com/null=dev0"}),
        &[],
    );
    let (code, out, err) = plan_cmd(
        &cfg,
        &b,
        &[
            "--json",
            "--cdi-dir",
            lo.to_str().unwrap(),
            "--cdi-dir",
            hi.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let p: gpufence::plan::Plan = serde_json::from_str(&out).unwrap();
    assert_eq!(p.edits.env, ["WHO=run"]);
    assert_eq!(p.cgroup_rules[0].to_string(), "c 1:3 rwm");
    let b = bundle(
        &dir,
        "ctr-cdi-missing",
        serde_json::json!({"cdi.k8s.io/example": "example.com/null=dev9"}),
        &[],
    );
    let (code, _, err) = plan_cmd(&cfg, &b, &["--cdi-dir", lo.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("no CDI spec"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gpufence plan --kubelet-checkpoint FILE`: explain a decision offline from a copy of kubelet's
/// checkpoint — where each facet came from, what was neutralised, and the refusal line when the
/// file cannot be used.
#[test]
fn plan_explains_a_decision_from_a_kubelet_checkpoint() {
    if skip_unless(&[]) {
        return;
    }
    use gpufence::kubelet;
    let dir = scratch("alloc-cli-kubelet");
    let cfg = sim_node(&dir.join("node"), 2, None);
    let gpu1 = gpufence::sim::gpu_uuid(1);
    let plugin = [
        ("NVIDIA_VISIBLE_DEVICES", gpu1.as_str()),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m"),
        ("CUDA_DEVICE_SM_LIMIT", "25"),
    ];
    let cp = dir.join("kubelet_internal_checkpoint");
    std::fs::write(
        &cp,
        kubelet::checkpoint_json(vec![kubelet::entry(
            "pod-uid-1",
            "main",
            "nvidia.com/gpu",
            &[&format!("{gpu1}-0")],
            kubelet::encode_alloc_resp(&plugin, &[]),
        )]),
    )
    .unwrap();
    let mut env: Vec<String> = vec![
        "NVIDIA_VISIBLE_DEVICES=all".into(),
        "CUDA_DEVICE_MEMORY_LIMIT_1=80000m".into(),
    ];
    env.extend(plugin.iter().map(|(k, v)| format!("{k}={v}")));
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    let b = bundle(
        &dir,
        "hami",
        serde_json::json!({
            "io.kubernetes.cri.sandbox-uid": "pod-uid-1",
            "io.kubernetes.cri.container-name": "main",
        }),
        &env,
    );
    let cp_s = cp.to_str().unwrap();
    let (code, out, err) = plan_cmd(&cfg, &b, &["--kubelet-checkpoint", cp_s]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("memory 2.9 GiB") || out.contains("3000 MiB") || out.contains("3145728000"),
        "{out}"
    );
    // Both files kubelet's record was read from are named: the checkpoint and the DRA state.
    assert!(
        out.contains(&format!(
            "kubelet: record (checkpoint {cp_s}; DRA state {})",
            gpufence::config::Config::from_toml(&std::fs::read_to_string(&cfg).unwrap(), &cfg)
                .unwrap()
                .kubelet
                .dra_checkpoint
                .display()
        )),
        "{out}"
    );
    assert!(
        out.contains("env recorded in the kubelet checkpoint: CUDA_DEVICE_MEMORY_LIMIT_0"),
        "{out}"
    );
    assert!(
        out.contains("CUDA_DEVICE_MEMORY_LIMIT_1=\"80000m\""),
        "{out}"
    );
    let (code, json, err) = plan_cmd(&cfg, &b, &["--json", "--kubelet-checkpoint", cp_s]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["kubelet"]["status"], "record");
    assert!(v["kubelet"]["draState"].is_string(), "{json}");
    assert_eq!(v["kubelet"]["record"]["identity"]["containerName"], "main");
    assert_eq!(v["allocation"]["devices"][0]["memoryLimit"], 3000u64 << 20);
    let sources = v["allocation"]["sources"].as_array().unwrap();
    assert!(
        sources
            .iter()
            .any(|s| s["facet"] == "cores" && s["origin"] == "kubelet"),
        "{json}"
    );
    assert!(
        v["neutralised"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["key"] == "CUDA_DEVICE_MEMORY_LIMIT_1"),
        "{json}"
    );

    // Another container of the pod (no record): no GPU, NVIDIA_VISIBLE_DEVICES=all -> void.
    let other = bundle(
        &dir,
        "sidecar",
        serde_json::json!({
            "io.kubernetes.cri.sandbox-uid": "pod-uid-1",
            "io.kubernetes.cri.container-name": "sidecar",
        }),
        &["NVIDIA_VISIBLE_DEVICES=all"],
    );
    let (code, out, err) = plan_cmd(&cfg, &other, &["--kubelet-checkpoint", cp_s]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("allocation: none"), "{out}");
    assert!(out.contains("NVIDIA_VISIBLE_DEVICES=void"), "{out}");

    // A tampered checkpoint: refused in one line naming the file and why.
    let text = std::fs::read_to_string(&cp)
        .unwrap()
        .replace("\"ContainerName\":\"main\"", "\"ContainerName\":\"mainx\"");
    assert_ne!(text, std::fs::read_to_string(&cp).unwrap());
    let forged = dir.join("forged");
    std::fs::write(&forged, text).unwrap();
    let (code, out, err) = plan_cmd(
        &cfg,
        &b,
        &["--kubelet-checkpoint", forged.to_str().unwrap()],
    );
    assert_eq!(code, 1, "{out}");
    let line = err.trim();
    assert_eq!(line.lines().count(), 1, "{err}");
    assert!(
        line.contains("forged") && line.contains("checksum"),
        "{err}"
    );
}
