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
