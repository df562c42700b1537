//! Allocation annotations of podman (libpod) containers.
//!
//! podman copies an image's annotations into every container made from it (`podman build
//! --annotation gpufence.dev/devices=all` is enough), so on a podman host an allocation
//! annotation may come from the image author, not from whoever runs the container. Unless the
//! node opts in (`allocation.trust-libpod-annotations`), such annotations are dropped before
//! any dialect reads them; podman users get GPUs through CDI (`--device gpufence.dev/gpu=N`),
//! which podman resolves itself.
//!
//! A container is libpod-managed when `io.container.manager` is `libpod` or when it carries any
//! `io.podman.annotations.*` key: an image can override the manager's value (podman applies
//! image annotations over its own), but it cannot remove the keys podman always sets.

use std::collections::BTreeMap;

/// The annotation every engine sets to its name (`libpod`, `cri-o`).
pub const MANAGER_KEY: &str = "io.container.manager";
/// Prefix of the keys podman always sets (`…autoremove`, `…init`, `…privileged`, …).
pub const PODMAN_PREFIX: &str = "io.podman.annotations.";

/// Whether podman (libpod) created this container.
pub fn is_libpod(annotations: &BTreeMap<String, String>) -> bool {
    annotations.get(MANAGER_KEY).map(String::as_str) == Some("libpod")
        || annotations.keys().any(|k| k.starts_with(PODMAN_PREFIX))
}

/// An annotation some dialect reads an allocation from.
pub fn is_allocation_key(key: &str) -> bool {
    key.starts_with("gpufence.dev/")
        || key.starts_with("cdi.k8s.io/")
        || key == "aliyun.com/gpu-count"
        || key == super::pod_dialects::hami_pod::ALLOCATED
        || key == super::pod_dialects::hami_pod::VOLCANO_ALLOCATED
        || key == super::pod_dialects::hami_mig::MIG_ALLOCATIONS
        || key == super::pod_dialects::koordinator_pod::ALLOCATED
        || key.starts_with(super::container_dialects::ALIYUN_PREFIX)
        || key.starts_with(super::pod_dialects::kai_pod::PREFIX)
}

/// Remove the allocation annotations of a libpod-managed container unless `trusted`; returns
/// the keys removed (sorted).
pub fn drop_untrusted(annotations: &mut BTreeMap<String, String>, trusted: bool) -> Vec<String> {
    if trusted || !is_libpod(annotations) {
        return Vec::new();
    }
    let dropped: Vec<String> = annotations
        .keys()
        .filter(|k| is_allocation_key(k))
        .cloned()
        .collect();
    for k in &dropped {
        annotations.remove(k);
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn libpod_is_recognised_even_when_the_image_renames_the_manager() {
        assert!(is_libpod(&ann(&[("io.container.manager", "libpod")])));
        assert!(is_libpod(&ann(&[
            ("io.container.manager", "cri-o"),
            ("io.podman.annotations.autoremove", "FALSE"),
        ])));
        assert!(!is_libpod(&ann(&[("io.container.manager", "cri-o")])));
        assert!(!is_libpod(&ann(&[(
            "io.kubernetes.cri.container-type",
            "container"
        )])));
        assert!(!is_libpod(&BTreeMap::new()));
    }

    #[test]
    fn drops_only_allocation_keys_of_untrusted_libpod_containers() {
        let pod = ann(&[
            ("io.container.manager", "libpod"),
            ("gpufence.dev/devices", "all"),
            ("gpufence.dev/memory", "1Gi"),
            ("cdi.k8s.io/x", "gpufence.dev/gpu=0"),
            ("aliyun.com/gpu-count", "1"),
            ("org.opencontainers.image.stopSignal", "15"),
            (
                "scheduling.koordinator.sh/device-allocated",
                r#"{"gpu":[{"minor":0}]}"#,
            ),
            ("volcano.sh/vgpu-ids-new", "GPU-a,NVIDIA,1,0:;"),
        ]);
        let mut a = pod.clone();
        assert_eq!(
            drop_untrusted(&mut a, false),
            vec![
                "aliyun.com/gpu-count",
                "cdi.k8s.io/x",
                "gpufence.dev/devices",
                "gpufence.dev/memory",
                "scheduling.koordinator.sh/device-allocated",
                "volcano.sh/vgpu-ids-new"
            ]
        );
        assert_eq!(
            a.keys().collect::<Vec<_>>(),
            vec![
                "io.container.manager",
                "org.opencontainers.image.stopSignal"
            ]
        );
        // Opted in: untouched.
        let mut a = pod.clone();
        assert!(drop_untrusted(&mut a, true).is_empty());
        assert_eq!(a, pod);
        // Not podman: untouched.
        let mut crio = ann(&[
            ("io.container.manager", "cri-o"),
            ("gpufence.dev/devices", "0"),
        ]);
        let before = crio.clone();
        assert!(drop_untrusted(&mut crio, false).is_empty());
        assert_eq!(crio, before);
    }
}
