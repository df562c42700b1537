//! The Kubernetes manifests agree with the image and the CLI: the image is named once (the
//! kustomization, tagged with the crate version `make image` uses), the DaemonSet's arguments
//! and preStop command are ones `gpufence` accepts, and its pod has only CAP_SYS_CHROOT. No root.

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
