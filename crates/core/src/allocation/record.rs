//! The edge where kubelet's record for a container is read: which container of which pod (the
//! CRI annotations), whether the node's policy lets kubelet's record count here, and the
//! checkpoint itself ([`crate::kubelet`] parses it). The allocation checks what it got against
//! this record.

use std::path::{Path, PathBuf};

use super::input::Inputs;
use crate::config::Config;
use crate::kubelet::{self, KubeletSource, PodIdentity};

/// Read kubelet's record for the container of `request` (the edge), wherever something believes
/// it (`trust-env` or `trust-annotations` = `"kubelet"`). `override_path` is
/// `gpufence plan --kubelet-checkpoint FILE`: read even where no kubelet directory exists.
pub fn load(cfg: &Config, request: &Inputs, override_path: Option<&Path>) -> KubeletSource {
    // kubelet's record counts for env and annotations (trust-env / trust-annotations =
    // "kubelet") and for time-slicing shares.
    let ac = &cfg.allocation;
    let wanted = ac.trust_env.is_kubelet()
        || ac.trust_annotations == crate::config::TrustAnnotations::Kubelet
        || cfg.sharing.replicas != crate::config::ReplicasPolicy::Off;
    if !wanted {
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
        Ok(bytes) => match kubelet::from_checkpoint_bytes(&bytes, &id, &shown) {
            KubeletSource::Record(mut r) => {
                with_dra_claims(&mut r, &cfg.kubelet.dra_checkpoint);
                KubeletSource::Record(r)
            }
            other => other,
        },
        Err(why) => KubeletSource::Unavailable {
            checkpoint: shown,
            why,
        },
    }
}

/// The DRA claims kubelet prepared for the record's pod (`kubelet.dra-checkpoint`): none where
/// the node has no DRA state file; a state that cannot be used is said in `dra_unavailable`, so
/// a grant only a claim could back is refused with the reason (fail closed).
fn with_dra_claims(r: &mut kubelet::ContainerRecord, path: &Path) {
    match kubelet::dra::load(path) {
        Ok(state) => {
            r.dra_claims = state
                .claims_for_pod(&r.identity.pod_uid)
                .into_iter()
                .map(|c| kubelet::DraClaimRecord {
                    claim: c.label(),
                    cdi_device_ids: c.cdi_ids().into_iter().map(str::to_string).collect(),
                    shared_cdi_ids: c.shared_cdi_ids().into_iter().map(str::to_string).collect(),
                })
                .collect();
        }
        Err(e) if matches!(e.problem, kubelet::dra::Problem::Missing) => {}
        Err(e) => r.dra_unavailable = Some(e.to_string()),
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

    #[test]
    fn the_pods_dra_claims_join_the_record() {
        let d = tempfile::tempdir().unwrap();
        let cp = d.path().join("kubelet_internal_checkpoint");
        std::fs::write(&cp, kubelet::checkpoint_json(vec![])).unwrap();
        let dra = d.path().join("dra_manager_state");
        let mut cfg = Config::default();
        cfg.kubelet.checkpoint = cp;
        cfg.kubelet.dra_checkpoint = dra.clone();
        let req = Inputs::from_spec(&serde_json::json!({"annotations": {
            kubelet::CRIO_POD_UID: "u", kubelet::CRIO_CONTAINER_NAME: "c"}}))
        .unwrap();
        let record = |cfg: &Config| match load(cfg, &req, None) {
            KubeletSource::Record(r) => r,
            other => panic!("{other:?}"),
        };
        // No DRA state on the node: no claims, nothing unavailable.
        let r = record(&cfg);
        assert!(r.dra_claims.is_empty() && r.dra_unavailable.is_none());

        let data = r#"{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","Entries":[{"ClaimUID":"c-1","ClaimName":"gpu","Namespace":"team","PodUIDs":{"u":{}},"DriverState":{"gpu.nvidia.com":{"Devices":[{"PoolName":"node","DeviceName":"gpu-1","RequestNames":["gpu"],"CDIDeviceIDs":["gpufence.dev/gpu=1"]}]}}},{"ClaimUID":"c-2","ClaimName":"other","Namespace":"team","PodUIDs":{"v":{}},"DriverState":{"gpu.nvidia.com":{"Devices":[{"PoolName":"node","DeviceName":"gpu-2","RequestNames":["gpu"],"CDIDeviceIDs":["gpufence.dev/gpu=2"]}]}}}]}"#;
        std::fs::write(
            &dra,
            kubelet::dra::file_json(data, kubelet::dra::checksum(data)),
        )
        .unwrap();
        let r = record(&cfg);
        assert_eq!(
            r.dra_claims,
            [kubelet::DraClaimRecord {
                claim: "team/gpu".into(),
                cdi_device_ids: vec!["gpufence.dev/gpu=1".into()],
                shared_cdi_ids: vec![],
            }],
            "only this pod's claim"
        );
        // A state kubelet itself would refuse (checksum): unavailable, with the reason.
        std::fs::write(&dra, kubelet::dra::file_json(data, 1)).unwrap();
        let r = record(&cfg);
        assert!(r.dra_claims.is_empty());
        assert!(
            r.dra_unavailable
                .as_deref()
                .is_some_and(|w| w.contains("checksum")),
            "{:?}",
            r.dra_unavailable
        );
    }
}
