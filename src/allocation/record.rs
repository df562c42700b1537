//! The edge where kubelet's record for a container is read: which container of which pod (the
//! CRI annotations), whether the node's policy lets kubelet's record count here, and the
//! checkpoint itself ([`crate::kubelet`] parses it). The allocation checks what it got against
//! this record.

use std::path::{Path, PathBuf};

use super::input::Inputs;
use crate::config::Config;
use crate::kubelet::{self, KubeletSource, PodIdentity};

/// Read kubelet's record for the container of `request` (the edge). `override_path` is
/// `gpufence plan --kubelet-checkpoint FILE`: read even where no kubelet directory exists.
pub fn load(cfg: &Config, request: &Inputs, override_path: Option<&Path>) -> KubeletSource {
    // kubelet's record counts for env (trust-env = "kubelet") and for time-slicing shares.
    if !cfg.allocation.trust_env.is_kubelet()
        && cfg.sharing.replicas == crate::config::ReplicasPolicy::Off
    {
        return KubeletSource::Absent;
    }
    let path: PathBuf = override_path
        .map(Path::to_path_buf)
        .unwrap_or_else(|| cfg.kubelet.checkpoint.clone());
    let shown = path.display().to_string();
    let ann = &request.annotations;
    if super::libpod::is_libpod(ann) && !cfg.allocation.trust_libpod_annotations {
        // podman copies image annotations: a CRI pod identity there may be the image's claim.
        return KubeletSource::Absent;
    }
    let id = match PodIdentity::from_annotations(ann) {
        Ok(Some(id)) => id,
        Ok(None) => return KubeletSource::Absent,
        Err(why) => {
            return KubeletSource::Unavailable {
                checkpoint: shown,
                why: format!("pod identity: {why}"),
            };
        }
    };
    if override_path.is_none() && !path.parent().is_some_and(Path::is_dir) {
        // No kubelet on this node (its device-plugins directory does not exist).
        return KubeletSource::Absent;
    }
    match kubelet::source::read_checkpoint(&path) {
        Ok(bytes) => kubelet::from_checkpoint_bytes(&bytes, &id, &shown),
        Err(why) => KubeletSource::Unavailable {
            checkpoint: shown,
            why,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_reads_the_checkpoint_but_not_for_podman_containers() {
        let d = tempfile::tempdir().unwrap();
        let cp = d.path().join("kubelet_internal_checkpoint");
        let resp = kubelet::encode_alloc_resp(&[("NVIDIA_VISIBLE_DEVICES", "GPU-a")], &[]);
        std::fs::write(
            &cp,
            kubelet::checkpoint_json(vec![kubelet::entry(
                "u",
                "c",
                "nvidia.com/gpu",
                &["a"],
                resp,
            )]),
        )
        .unwrap();
        let mut cfg = Config::default();
        cfg.kubelet.checkpoint = cp.clone();
        let mut spec = serde_json::json!({"annotations": {
            kubelet::CRIO_POD_UID: "u", kubelet::CRIO_CONTAINER_NAME: "c"}});
        assert!(
            matches!(load(&cfg, &Inputs::from_spec(&spec).unwrap(), None), KubeletSource::Record(r) if r.resources.len() == 1)
        );
        // podman copies image annotations: its containers never claim a pod's record.
        spec["annotations"]["io.container.manager"] = "libpod".into();
        assert_eq!(
            load(&cfg, &Inputs::from_spec(&spec).unwrap(), None),
            KubeletSource::Absent
        );
        // No kubelet directory: no kubelet (unless the file is named explicitly).
        spec["annotations"]["io.container.manager"] = "cri-o".into();
        cfg.kubelet.checkpoint = d.path().join("missing-dir/kubelet_internal_checkpoint");
        assert_eq!(
            load(&cfg, &Inputs::from_spec(&spec).unwrap(), None),
            KubeletSource::Absent
        );
        assert!(matches!(
            load(&cfg, &Inputs::from_spec(&spec).unwrap(), Some(&cp)),
            KubeletSource::Record(_)
        ));
        // The directory exists, the file does not: unavailable, naming why.
        cfg.kubelet.checkpoint = d.path().join("gone");
        assert!(
            matches!(load(&cfg, &Inputs::from_spec(&spec).unwrap(), None),
            KubeletSource::Unavailable { why, .. } if why == "does not exist")
        );
    }
}
