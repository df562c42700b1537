//! A simulated 2-GPU node whose kubelet record grants GPU 1 to the pods named, with a
//! containerd 2.3 whose NRI validator requires `gpufence`: what the NRI end-to-end tests
//! (tests/nri_e2e.rs, tests/frameworks_container.rs) start from.

use std::path::{Path, PathBuf};

use super::{Containerd, containerd_config, start_containerd23};
use crate::{common, runtime_support};

/// kubelet's device-manager checkpoint granting GPU 1 to container `app` of `pods`.
pub fn checkpoint_granting_gpu1(checkpoint: &Path, pods: &[&str]) {
    use gpufence::kubelet;
    let gpu1 = gpufence::sim::gpu_uuid(1);
    let entries = pods
        .iter()
        .map(|p| {
            kubelet::entry(
                &format!("{p}-uid"),
                "app",
                "nvidia.com/gpu",
                &[gpu1.as_str()],
                kubelet::encode_alloc_resp(&[("NVIDIA_VISIBLE_DEVICES", gpu1.as_str())], &[]),
            )
        })
        .collect();
    std::fs::write(checkpoint, kubelet::checkpoint_json(entries)).unwrap();
}

/// A scratch dir and a simulated 2-GPU node whose kubelet record grants GPU 1 to container
/// `app` of `pods`.
pub fn kubelet_gpu1_node(name: &str, pods: &[&str]) -> (PathBuf, runtime_support::Node) {
    let s = common::scratch(name);
    let node = kubelet_gpu1_node_in(&s, pods, &[]);
    (s, node)
}

/// [`kubelet_gpu1_node`] in scratch dir `s`, with `extra` configuration.
pub fn kubelet_gpu1_node_in(
    s: &Path,
    pods: &[&str],
    extra: &[(&str, toml_edit::Item)],
) -> runtime_support::Node {
    let checkpoint = s.join("kubelet/device-plugins/kubelet_internal_checkpoint");
    std::fs::create_dir_all(checkpoint.parent().unwrap()).unwrap();
    checkpoint_granting_gpu1(&checkpoint, pods);
    let mut config = vec![(
        "kubelet.checkpoint",
        toml_edit::value(checkpoint.display().to_string()),
    )];
    config.extend(extra.iter().cloned());
    runtime_support::node(s, 2, &config)
}

/// [`kubelet_gpu1_node`] and a
/// containerd with NRI's validator requiring `gpufence`, the image imported: (scratch, node,
/// containerd dir, its config, containerd).
pub fn gpu1_node(
    bin: &Path,
    name: &str,
    pods: &[&str],
) -> (PathBuf, runtime_support::Node, PathBuf, PathBuf, Containerd) {
    let (s, node) = kubelet_gpu1_node(name, pods);
    let cdir = s.join("containerd");
    let config = containerd_config(bin, &cdir, &["gpufence"]);
    let c = start_containerd23(bin, &cdir, &config);
    super::import_image(&s, &c);
    (s, node, cdir, config, c)
}

/// A GPU pod as kubelet would create it for `name`: GPU 1 through the annotation and the device
/// plugin's env, `memory` of quota.
pub fn gpu1_request(memory: &str, image: &str) -> serde_json::Value {
    serde_json::json!({
        "pod_annotations": {"gpufence.dev/devices": "1", "gpufence.dev/memory": memory},
        "envs": {"NVIDIA_VISIBLE_DEVICES": gpufence::sim::gpu_uuid(1)},
        "image": image,
    })
}
