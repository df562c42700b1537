//! The request the plan's front door reads ([`Inputs`]), built from what NRI says of a container
//! being created — the NRI counterpart of [`Inputs::from_spec`].
//!
//! * **Annotations**: the pod's, overlaid by the container's, as CRI does. NRI's
//!   `PodSandbox.annotations` carries *every* pod annotation, while a runtime handler only sees
//!   those containerd's `pod_annotations` allow-list passes into the spec; so only pod keys
//!   matching [`ANNOTATION_ALLOW_LIST`] (the list `gpufence runtime configure` writes, matched
//!   like containerd's `filepath.Match`) are taken from the pod. The container's own annotations
//!   are its spec's (containerd already filtered them).
//! * **Pod identity** (which kubelet record is this container's): from NRI's own `pod.uid`,
//!   `pod.namespace`, `pod.name` and `ctr.name`, never from an annotation. Any CRI identity
//!   annotation present must agree with them (else the container is refused: a pod naming
//!   another pod's UID is forging its kubelet record), and containerd's keys are then set from
//!   them.
//! * podman's markers (`io.container.manager=libpod`, `io.podman.annotations.*`) are dropped:
//!   an NRI container is a CRI one, whatever a copied pod annotation says.
//! * **Env** `ctr.env`; **mounts** `ctr.mounts`; **user namespace** from `linux.namespaces`.
//!   NRI gives no root path (the NRI applier does not need one).

use std::collections::BTreeMap;

use super::api::{Container, PodSandbox};
use crate::allocation::ANNOTATION_ALLOW_LIST;
use crate::allocation::input::Inputs;
use crate::kubelet::{
    CONTAINERD_CONTAINER_NAME, CONTAINERD_POD_UID, CRIO_CONTAINER_NAME, CRIO_POD_UID,
};

/// containerd's and CRI-O's namespace and pod-name annotations.
const NAMESPACE_KEYS: [&str; 2] = [
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.pod.namespace",
];
const POD_NAME_KEYS: [&str; 2] = ["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"];

/// Why the request could not be read. One line, naming the annotation at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(
        "annotation {key}={value:?} disagrees with the runtime's {what} {actual:?} (an identity \
         annotation cannot name another pod or container)"
    )]
    Identity {
        key: &'static str,
        value: String,
        what: &'static str,
        actual: String,
    },
    /// NRI names no pod UID or no container name: a CRI container always has both, so without
    /// them the container's kubelet record cannot be found — refused rather than taken for a
    /// container outside Kubernetes (whose grants are believed without a record).
    #[error("the runtime names no {0} for this container: kubelet's record cannot be found")]
    NoIdentity(&'static str),
    /// The container's devices cannot be read.
    #[error("{0}")]
    Devices(crate::allocation::AllocationError),
}

/// containerd's `filepath.Match` for the allow-list's patterns: `*` matches any run of
/// characters other than `/`; everything else matches itself.
pub fn pattern_matches(pattern: &str, key: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == key,
        Some((head, tail)) => {
            let Some(rest) = key.strip_prefix(head) else {
                return false;
            };
            // `*` takes 0..n non-'/' characters; try each split (patterns are short).
            let mut end = 0;
            loop {
                if pattern_matches(tail, &rest[end..]) {
                    return true;
                }
                match rest[end..].chars().next() {
                    Some(c) if c != '/' => end += c.len_utf8(),
                    _ => return false,
                }
            }
        }
    }
}

/// Whether a pod annotation reaches the request (the allow-list).
pub fn pod_key_allowed(key: &str) -> bool {
    ANNOTATION_ALLOW_LIST
        .iter()
        .any(|p| pattern_matches(p, key))
}

/// The request for container `ctr` of pod `pod`.
pub fn inputs(pod: &PodSandbox, ctr: &Container) -> Result<Inputs, RequestError> {
    if pod.uid.trim().is_empty() {
        return Err(RequestError::NoIdentity("pod UID"));
    }
    if ctr.name.trim().is_empty() {
        return Err(RequestError::NoIdentity("container name"));
    }
    let mut annotations: BTreeMap<String, String> = pod
        .annotations
        .iter()
        .filter(|(k, _)| pod_key_allowed(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .chain(ctr.annotations.iter().map(|(k, v)| (k.clone(), v.clone())))
        .collect();
    // NRI serves CRI containers only: podman's markers here are a pod's annotations the engine
    // copied into the spec, and would make the container "not CRI" (grants believed without
    // kubelet's record, `allocation::backing::is_cri`). Dropped.
    annotations.retain(|k, v| {
        let manager = k == crate::allocation::libpod::MANAGER_KEY && v == "libpod";
        !manager && !k.starts_with(crate::allocation::libpod::PODMAN_PREFIX)
    });
    let identity: [(&[&'static str], &'static str, &str); 4] = [
        (&[CONTAINERD_POD_UID, CRIO_POD_UID], "pod UID", &pod.uid),
        (
            &[CONTAINERD_CONTAINER_NAME, CRIO_CONTAINER_NAME],
            "container name",
            &ctr.name,
        ),
        (&NAMESPACE_KEYS, "pod namespace", &pod.namespace),
        (&POD_NAME_KEYS, "pod name", &pod.name),
    ];
    for (keys, what, actual) in identity {
        for key in keys {
            if let Some(v) = annotations.get(*key)
                && v != actual
            {
                return Err(RequestError::Identity {
                    key,
                    value: crate::text::short(v),
                    what,
                    actual: actual.to_string(),
                });
            }
        }
    }
    // containerd's keys from NRI's own identity: the pod UID and container name together (a
    // CRI container has both; a container NRI knows no pod UID for names no kubelet record),
    // namespace and pod name where known (for messages and `gpufence ps`).
    let whole = !pod.uid.is_empty() && !ctr.name.is_empty();
    for (i, (keys, _, actual)) in identity.into_iter().enumerate() {
        if !actual.is_empty() && (i >= 2 || whole) {
            annotations.insert(keys[0].to_string(), actual.to_string());
        }
    }
    let env = ctr
        .env
        .iter()
        .filter_map(|e| e.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mounts = ctr
        .mounts
        .iter()
        .map(|m| (m.destination.clone(), m.source.clone()))
        .collect();
    let user_namespace = ctr
        .linux
        .as_ref()
        .is_some_and(|l| l.namespaces.iter().any(|n| n.r#type == "user"));
    let mut inputs = Inputs {
        annotations,
        env,
        mounts,
        user_namespace,
        ..Inputs::default()
    };
    let (devices, rules) = devices_json(ctr);
    inputs
        .read_devices(Some(&devices), Some(&rules))
        .map_err(RequestError::Devices)?;
    Ok(inputs)
}

/// The container's `linux.devices` and `linux.resources.devices` in OCI's JSON shape, as
/// [`Inputs::read_devices`] reads a spec's.
fn devices_json(ctr: &Container) -> (serde_json::Value, serde_json::Value) {
    let linux = ctr.linux.as_ref();
    let devices = linux
        .iter()
        .flat_map(|l| &l.devices)
        .map(|d| serde_json::json!({"path": d.path, "type": d.r#type, "major": d.major, "minor": d.minor}))
        .collect();
    let rules = linux
        .and_then(|l| l.resources.as_ref())
        .iter()
        .flat_map(|r| &r.devices)
        .map(|r| {
            serde_json::json!({"allow": r.allow,
                "type": (!r.r#type.is_empty()).then_some(&r.r#type),
                "major": r.major.as_ref().map(|m| m.value),
                "minor": r.minor.as_ref().map(|m| m.value),
                "access": r.access})
        })
        .collect();
    (
        serde_json::Value::Array(devices),
        serde_json::Value::Array(rules),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LinuxContainer, LinuxNamespace, Mount};
    use crate::kubelet::PodIdentity;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn pod(ann: &[(&str, &str)]) -> PodSandbox {
        PodSandbox {
            uid: "uid-1".into(),
            name: "trainer".into(),
            namespace: "team-a".into(),
            annotations: map(ann),
            ..Default::default()
        }
    }

    fn ctr(ann: &[(&str, &str)]) -> Container {
        Container {
            id: "c1".into(),
            name: "app".into(),
            annotations: map(ann),
            env: vec!["PATH=/bin".into(), "A=1=2".into(), "NOEQ".into()],
            mounts: vec![Mount {
                destination: "/d".into(),
                source: "/s".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn patterns_match_like_containerd() {
        assert!(pattern_matches("gpufence.dev/*", "gpufence.dev/devices"));
        assert!(pattern_matches("gpufence.dev/*", "gpufence.dev/"));
        assert!(!pattern_matches("gpufence.dev/*", "gpufence.dev/a/b"));
        assert!(!pattern_matches("gpufence.dev/*", "xgpufence.dev/devices"));
        assert!(pattern_matches(
            "ALIYUN_COM_GPU_MEM_*",
            "ALIYUN_COM_GPU_MEM_POD"
        ));
        assert!(pattern_matches(
            "aliyun.com/gpu-count",
            "aliyun.com/gpu-count"
        ));
        assert!(!pattern_matches(
            "aliyun.com/gpu-count",
            "aliyun.com/gpu-count2"
        ));
        assert!(pattern_matches("a*b*c", "aXXbYc"));
        assert!(!pattern_matches("a*b", "a/b"));
    }

    #[test]
    fn only_allow_listed_pod_annotations_and_the_container_s_win() {
        let p = pod(&[
            ("gpufence.dev/devices", "1"),
            ("gpufence.dev/memory", "4Gi"),
            ("io.kubernetes.cri.container-type", "sandbox"),
            ("unrelated.example/key", "x"),
        ]);
        let c = ctr(&[
            ("gpufence.dev/memory", "2Gi"),
            ("io.kubernetes.cri.container-type", "container"),
        ]);
        let i = inputs(&p, &c).unwrap();
        assert_eq!(i.annotations["gpufence.dev/devices"], "1");
        assert_eq!(i.annotations["gpufence.dev/memory"], "2Gi");
        assert_eq!(
            i.annotations["io.kubernetes.cri.container-type"],
            "container"
        );
        assert!(!i.annotations.contains_key("unrelated.example/key"));
        assert_eq!(i.sandbox_kind(), None);
        assert_eq!(
            i.env,
            vec![
                ("PATH".to_string(), "/bin".to_string()),
                ("A".to_string(), "1=2".to_string())
            ]
        );
        assert_eq!(i.mounts, vec![("/d".to_string(), "/s".to_string())]);
        assert!(!i.user_namespace);
        assert_eq!(i.root_path, None);
    }

    #[test]
    fn the_pod_identity_is_nri_s_own() {
        let i = inputs(&pod(&[]), &ctr(&[])).unwrap();
        let id = PodIdentity::from_annotations(&i.annotations)
            .unwrap()
            .unwrap();
        assert_eq!(
            (id.pod_uid.as_str(), id.container_name.as_str()),
            ("uid-1", "app")
        );
        assert_eq!(id.pod.as_deref(), Some("team-a/trainer"));
        // What containerd writes itself agrees: accepted.
        let c = ctr(&[
            (CONTAINERD_POD_UID, "uid-1"),
            (CONTAINERD_CONTAINER_NAME, "app"),
        ]);
        inputs(&pod(&[]), &c).unwrap();
        // Another pod's UID or another container's name in any identity key: refused.
        for (k, v) in [
            (CONTAINERD_POD_UID, "victim-uid"),
            (CRIO_POD_UID, "victim-uid"),
            (CONTAINERD_CONTAINER_NAME, "other"),
            (CRIO_CONTAINER_NAME, "other"),
            ("io.kubernetes.pod.namespace", "kube-system"),
        ] {
            let e = inputs(&pod(&[]), &ctr(&[(k, v)])).unwrap_err().to_string();
            assert!(e.starts_with(&format!("annotation {k}=")), "{e}");
        }
        // A pod annotation of an identity key never reaches the request (not allow-listed).
        let p = pod(&[(CONTAINERD_POD_UID, "victim-uid")]);
        let i = inputs(&p, &ctr(&[])).unwrap();
        assert_eq!(i.annotations[CONTAINERD_POD_UID], "uid-1");
    }

    proptest::proptest! {
        /// Any pod and container NRI may send: never a panic; a pod annotation reaches the
        /// request only when allow-listed; the identity is NRI's or the container is refused.
        #[test]
        fn any_request_is_read_or_refused_never_forged(
            pod_ann in proptest::collection::btree_map("[a-zA-Z0-9./_*-]{0,24}", ".{0,12}", 0..8),
            ctr_ann in proptest::collection::btree_map("[a-zA-Z0-9./_-]{0,24}", ".{0,12}", 0..4),
            uid in "[a-z0-9-]{0,8}",
            name in "[a-z0-9-]{0,8}",
            env in proptest::collection::vec(".{0,16}", 0..6),
        ) {
            let p = PodSandbox { uid: uid.clone(), annotations: pod_ann.clone(), ..Default::default() };
            let c = Container { name: name.clone(), annotations: ctr_ann.clone(), env: env.clone(), ..Default::default() };
            if let Ok(i) = inputs(&p, &c) {
                for k in i.annotations.keys() {
                    let from_nri = [CONTAINERD_POD_UID, CONTAINERD_CONTAINER_NAME].contains(&k.as_str())
                        || NAMESPACE_KEYS.contains(&k.as_str()) || POD_NAME_KEYS.contains(&k.as_str());
                    proptest::prop_assert!(from_nri || ctr_ann.contains_key(k) || pod_key_allowed(k), "{k}");
                }
                if let Some(v) = i.annotations.get(CONTAINERD_POD_UID) {
                    proptest::prop_assert_eq!(v, &uid);
                }
                if let Some(v) = i.annotations.get(CONTAINERD_CONTAINER_NAME) {
                    proptest::prop_assert_eq!(v, &name);
                }
                proptest::prop_assert!(i.env.len() <= env.len());
            }
        }

        /// A pattern without `*` matches only itself; `p*` matches p followed by no `/`.
        #[test]
        fn patterns_are_literal_but_for_the_star(p in "[a-z./]{0,10}", k in "[a-z./]{0,10}") {
            proptest::prop_assert_eq!(pattern_matches(&p, &k), p == k);
            let star = format!("{p}*");
            let expected = k.strip_prefix(p.as_str()).is_some_and(|r| !r.contains('/'));
            proptest::prop_assert_eq!(pattern_matches(&star, &k), expected);
        }
    }

    #[test]
    fn user_namespace_from_linux_namespaces() {
        let mut c = ctr(&[]);
        c.linux = Some(LinuxContainer {
            namespaces: vec![
                LinuxNamespace {
                    r#type: "mount".into(),
                    path: String::new(),
                },
                LinuxNamespace {
                    r#type: "user".into(),
                    path: String::new(),
                },
            ],
            ..Default::default()
        });
        assert!(inputs(&pod(&[]), &c).unwrap().user_namespace);
    }

    #[test]
    fn a_container_without_pod_uid_or_name_is_refused_not_believed() {
        let pod = PodSandbox {
            name: "p".into(),
            namespace: "ns".into(),
            ..Default::default()
        };
        let ctr = Container {
            name: "app".into(),
            ..Default::default()
        };
        assert!(matches!(
            inputs(&pod, &ctr),
            Err(RequestError::NoIdentity("pod UID"))
        ));
        let pod = PodSandbox {
            uid: "u".into(),
            ..pod
        };
        let nameless = Container {
            name: " ".into(),
            ..Default::default()
        };
        assert!(matches!(
            inputs(&pod, &nameless),
            Err(RequestError::NoIdentity("container name"))
        ));
        assert!(inputs(&pod, &ctr).is_ok());
    }

    #[test]
    fn the_containers_devices_and_device_rules_are_read() {
        use crate::allocation::input::SpecDevice;
        use crate::api::{LinuxDevice, LinuxDeviceCgroup, LinuxResources, OptionalInt64};
        let dev = |path: &str, t: &str, minor| LinuxDevice {
            path: path.into(),
            r#type: t.into(),
            major: 195,
            minor,
            ..Default::default()
        };
        let mut c = ctr(&[]);
        c.linux = Some(LinuxContainer {
            devices: vec![dev("/dev/nvidia1", "c", 1), dev("/dev/fifo", "p", 0)],
            resources: Some(LinuxResources {
                devices: vec![LinuxDeviceCgroup {
                    allow: false,
                    access: "rwm".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        });
        let i = inputs(&pod(&[]), &c).unwrap();
        assert_eq!(
            i.devices,
            [SpecDevice {
                path: "/dev/nvidia1".into(),
                kind: 'c',
                major: 195,
                minor: 1
            }]
        );
        assert!(!i.all_devices_allowed);
        // A privileged container's allow-all rule; one naming a device is not.
        fn rules(c: &mut Container) -> &mut Vec<LinuxDeviceCgroup> {
            &mut c
                .linux
                .as_mut()
                .unwrap()
                .resources
                .as_mut()
                .unwrap()
                .devices
        }
        rules(&mut c).push(LinuxDeviceCgroup {
            allow: true,
            access: "rwm".into(),
            ..Default::default()
        });
        assert!(inputs(&pod(&[]), &c).unwrap().all_devices_allowed);
        rules(&mut c).push(LinuxDeviceCgroup {
            allow: false,
            r#type: "c".into(),
            major: Some(OptionalInt64 { value: 195 }),
            minor: None,
            access: "rwm".into(),
        });
        assert!(inputs(&pod(&[]), &c).unwrap().all_devices_allowed);
        // A device NRI cannot have sent (negative major) refuses the container.
        c.linux.as_mut().unwrap().devices[0].major = -1;
        assert!(matches!(
            inputs(&pod(&[]), &c),
            Err(RequestError::Devices(_))
        ));
    }
}
