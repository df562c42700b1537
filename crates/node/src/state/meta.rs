//! `state-dir/<id>/status.json`: what `gpufence ps` and the exporter know about a GPU container
//! beyond its live usage — the pod it belongs to (CRI annotations), its devices and limits, and
//! where its init process can be found. Written by the host at create time (runtime or hook),
//! never mounted into the container. Still read as untrusted input (size-capped, strictly
//! typed, display strings cleaned): a host directory is only as safe as the code that wrote it.

use serde::{Deserialize, Serialize};

/// File name inside `state-dir/<id>`.
pub const FILE_NAME: &str = "status.json";
/// Readers refuse anything larger.
pub const MAX_BYTES: usize = 64 * 1024;
/// Longest name kept (Kubernetes names are at most 253 bytes).
const MAX_NAME: usize = 253;

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Meta {
    pub version: u32,
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Unix seconds.
    pub created: u64,
    pub devices: Vec<MetaDevice>,
    #[serde(default)]
    pub locator: Locator,
}

/// One allocated device, in the container's CUDA order (the region's device order).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetaDevice {
    /// The node's index: `1`, or `1:2` for a MIG device.
    pub index: String,
    pub uuid: String,
    /// Memory quota in bytes (`None`: the whole device).
    #[serde(default)]
    pub memory: Option<u64>,
    #[serde(default)]
    pub cores: Option<u8>,
    /// Time-slicing replicas of the device held (kubelet's record, `sharing.replicas`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<Replicas>,
}

/// `held` of the `of` time-slicing replicas kubelet registers for the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replicas {
    pub held: u32,
    pub of: u32,
}

/// Where the container's init process is recorded, so that a reader can reach the container's
/// `/run/gpufence` through `/proc/<pid>/root` and tell a running container from a leftover.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Locator {
    /// Hook mode: the init pid from the OCI state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// `create --pid-file` (absolute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_file: Option<String>,
    /// The real runtime's state root (`<root>/<id>/state.json`, `init_process_pid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_root: Option<String>,
}

/// Pod, namespace and container names from the CRI annotations (containerd, then CRI-O).
fn names(annotations: &std::collections::BTreeMap<String, String>) -> [Option<String>; 3] {
    let get = |keys: [&str; 2]| {
        keys.iter()
            .find_map(|k| annotations.get(*k).map(String::as_str))
            .map(clean)
            .filter(|s| !s.is_empty())
    };
    [
        get([
            "io.kubernetes.cri.sandbox-namespace",
            "io.kubernetes.pod.namespace",
        ]),
        get(["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"]),
        get([
            "io.kubernetes.cri.container-name",
            "io.kubernetes.container.name",
        ]),
    ]
}

/// A name fit for a terminal and a label value: printable, at most [`MAX_NAME`] bytes.
pub fn clean(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > MAX_NAME {
            break;
        }
        out.push(c);
    }
    out
}

impl Meta {
    /// The record for a plan that grants GPUs (`None` otherwise). Pure.
    pub fn from_plan(
        plan: &crate::plan::Plan,
        annotations: &std::collections::BTreeMap<String, String>,
        locator: Locator,
        created: u64,
    ) -> Option<Meta> {
        use crate::allocation::DeviceRef;
        let alloc = plan.allocation.as_ref()?;
        plan.state_dir.as_ref()?;
        let [namespace, pod, container] = names(annotations);
        Some(Meta {
            version: 1,
            id: plan.container_id.clone(),
            namespace,
            pod,
            container,
            created,
            devices: alloc
                .devices
                .iter()
                .map(|d| MetaDevice {
                    index: match d.device {
                        DeviceRef::Gpu { index } => index.to_string(),
                        DeviceRef::Mig { gpu, mig } => format!("{gpu}:{mig}"),
                    },
                    uuid: d.uuid.clone(),
                    memory: d.memory_limit,
                    cores: d.cores,
                    replicas: d.replica.as_ref().map(|r| Replicas {
                        held: r.held,
                        of: r.of,
                    }),
                })
                .collect(),
            locator,
        })
    }

    /// Parse a record read from disk; display strings are cleaned again.
    pub fn parse(bytes: &[u8]) -> Result<Meta, String> {
        if bytes.len() > MAX_BYTES {
            return Err(format!("{FILE_NAME} is larger than {MAX_BYTES} bytes"));
        }
        let mut m: Meta = serde_json::from_slice(bytes).map_err(|e| format!("{FILE_NAME}: {e}"))?;
        if m.version != 1 {
            return Err(format!("{FILE_NAME}: version {} unknown", m.version));
        }
        m.devices.truncate(crate::quota::MAX_DEVICES);
        for s in [&mut m.namespace, &mut m.pod, &mut m.container]
            .into_iter()
            .flatten()
        {
            *s = clean(s);
        }
        for d in &mut m.devices {
            d.index = clean(&d.index);
            d.uuid = clean(&d.uuid);
        }
        Ok(m)
    }
}

/// Write the record into the container's state directory (atomically, 0444, never through a
/// symlink: a fresh temp file renamed over the name).
pub fn write(dir: &std::path::Path, meta: &Meta) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let mut f = tempfile::Builder::new()
        .prefix(".status.json.")
        .permissions(std::fs::Permissions::from_mode(0o444))
        .tempfile_in(dir)?;
    f.write_all(&serde_json::to_vec(meta).map_err(std::io::Error::other)?)?;
    f.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o444))?;
    f.persist(dir.join(FILE_NAME)).map_err(|e| e.error)?;
    Ok(())
}

/// Record a container that the plan grants GPUs; failures are logged, never fatal (the record
/// serves display only).
pub fn record(
    plan: &crate::plan::Plan,
    annotations: &std::collections::BTreeMap<String, String>,
    locator: Locator,
) {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (Some(meta), Some(dir)) = (
        Meta::from_plan(plan, annotations, locator, created),
        plan.state_dir.as_ref(),
    ) else {
        return;
    };
    if let Err(e) = write(std::path::Path::new(dir), &meta) {
        tracing::warn!(container = %plan.container_id, error = %e, "status record not written; gpufence ps will not show the container");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_cri_annotations() {
        let a: std::collections::BTreeMap<String, String> = [
            ("io.kubernetes.cri.sandbox-namespace", "team-a"),
            ("io.kubernetes.pod.name", "trainer-0"),
            ("io.kubernetes.container.name", "main\u{1b}[2J"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let [ns, pod, c] = names(&a);
        assert_eq!(ns.as_deref(), Some("team-a"));
        assert_eq!(pod.as_deref(), Some("trainer-0"));
        assert_eq!(c.as_deref(), Some("main[2J"));
        assert_eq!(names(&Default::default()), [None, None, None]);
        assert_eq!(clean(&"x".repeat(1000)).len(), MAX_NAME);
    }

    #[test]
    fn round_trip_and_hostile() {
        let m = Meta {
            version: 1,
            id: "c1".into(),
            pod: Some("p".into()),
            created: 5,
            devices: vec![MetaDevice {
                index: "1:0".into(),
                uuid: "MIG-x".into(),
                memory: Some(4 << 30),
                cores: Some(50),
                replicas: Some(Replicas { held: 1, of: 4 }),
            }],
            locator: Locator {
                pid_file: Some("/b/init.pid".into()),
                ..Locator::default()
            },
            ..Meta::default()
        };
        let text = serde_json::to_vec(&m).unwrap();
        assert_eq!(Meta::parse(&text).unwrap(), m);
        assert!(Meta::parse(b"{").is_err());
        assert!(Meta::parse(br#"{"version":2,"id":"c","created":0,"devices":[]}"#).is_err());
        assert!(Meta::parse(&vec![b' '; MAX_BYTES + 1]).is_err());
        assert!(Meta::parse(br#"{"version":1,"id":"c","created":0,"devices":[],"x":1}"#).is_err());
    }
}
