//! The Kubernetes manifests agree with the image and the CLI: the image is named once (the
//! kustomization, tagged with the crate version `make image` uses), the DaemonSet's arguments
//! and preStop command are ones `gpufence` accepts, and its pod has only CAP_SYS_CHROOT; the
//! NRI DaemonSet variant's command parses and its tolerate key is the one the admission policy
//! reserves. No root.

mod common;

use std::path::Path;
use std::process::Command;

fn yaml(rel: &str) -> yaml_serde::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    yaml_serde::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn strings(v: &yaml_serde::Value) -> Vec<String> {
    v.as_sequence()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn daemonset_kustomization_and_cli_agree() {
    let k = yaml("packaging/k8s/kustomization.yaml");
    let img = &k["images"][0];
    assert_eq!(img["name"].as_str(), Some("gpufence"));
    assert_eq!(img["newTag"].as_str(), Some(env!("CARGO_PKG_VERSION")));

    let ds = yaml("packaging/k8s/daemonset.yaml");
    let pod = &ds["spec"]["template"]["spec"];
    assert!(pod.get("hostPID").is_none() && pod.get("hostNetwork").is_none());
    let containers = pod["containers"].as_sequence().unwrap();
    let c = containers
        .iter()
        .find(|c| c["name"].as_str() == Some("install"))
        .unwrap();
    assert_eq!(
        c["image"].as_str(),
        Some("gpufence"),
        "named only in kustomization.yaml"
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"].as_bool(), Some(false));
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    assert_eq!(strings(&sc["capabilities"]["add"]), ["SYS_CHROOT"]);

    // The image's entrypoint is `gpufence install`: these arguments parse (and stop at the
    // missing host root rather than at an unknown flag).
    let missing = "/nonexistent-gpufence-host";
    let mut args = strings(&c["args"]);
    args[1] = missing.to_string();
    let (code, _, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("install")
            .args(&args)
            .arg("--dry-run"),
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("{missing}: not a directory")),
        "{err}"
    );
    let mut stop = strings(&c["lifecycle"]["preStop"]["exec"]["command"]);
    assert_eq!(stop[0], "/usr/bin/gpufence");
    stop[3] = missing.to_string();
    let (code, _, err) = common::run(Command::new(common::bin("gpufence")).args(&stop[1..]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not a directory"), "{err}");
}

/// The NRI DaemonSet variant: its command parses (and stops at the host root it cannot enter
/// here, not at an unknown flag), it registers as the plugin the validator requires, its pod
/// carries the tolerate key that admission-policy.yaml reserves to its namespace, and it keeps
/// only CAP_SYS_CHROOT.
#[test]
fn nri_daemonset_agrees_with_the_cli_and_the_admission_policy() {
    let ds = yaml("packaging/k8s/nri-plugin.yaml");
    assert_eq!(ds["metadata"]["namespace"].as_str(), Some("kube-system"));
    let tmpl = &ds["spec"]["template"];
    let key = "tolerate-missing-plugins.noderesource.dev";
    assert_eq!(tmpl["metadata"]["annotations"][key].as_str(), Some("true"));
    let policy = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/k8s/admission-policy.yaml"),
    )
    .unwrap();
    assert!(
        policy.contains(&format!("'{key}'")),
        "policy reserves {key}"
    );
    assert!(
        policy.contains("kube-system"),
        "policy lets kube-system carry it"
    );
    let c = &tmpl["spec"]["containers"][0];
    assert_eq!(c["image"].as_str(), Some("gpufence"));
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"].as_bool(), Some(false));
    assert_eq!(strings(&sc["capabilities"]["add"]), ["SYS_CHROOT"]);
    let cmd = strings(&c["command"]);
    assert_eq!(cmd[0], "/usr/bin/gpufence");
    let at = |flag: &str| cmd[cmd.iter().position(|a| a == flag).unwrap() + 1].clone();
    assert_eq!(at("--socket"), gpufence::nri::DEFAULT_SOCKET);
    assert_eq!(at("--name"), "gpufence");
    assert_eq!(at("--index"), gpufence::config::NRI_PLUGIN_INDEX);
    let mut args = cmd[1..].to_vec();
    let root = args.iter().position(|a| a == "--host-root").unwrap() + 1;
    args[root] = "/nonexistent-gpufence-host".into();
    let (code, _, err) = common::run(Command::new(common::bin("gpufence")).args(&args));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--host-root /nonexistent-gpufence-host: chroot"),
        "{err}"
    );
}
