//! `allocation.trust-annotations`: what backs each device a container is granted.
//!
//! Pod annotations are written by the pod's author. On a container created through CRI (a
//! Kubernetes pod), under `"kubelet"` (the default) every GPU granted — whatever the dialect that
//! named it (gpufence, cdi, hami, gpushare, kai, nvidia's mounts) — must be among those kubelet
//! recorded for this very container: the device plugins' Allocate responses in kubelet's
//! device-manager checkpoint (env, device specs, mounts, annotations, CDI devices, device ids —
//! time-slicing replica ids `<id>::<k>` mapped to their GPU) and the CDI device ids of the DRA
//! claims prepared for the pod. Annotations choose among and narrow what was recorded; a grant
//! nothing backs refuses the container in one line naming the key, the value and what kubelet
//! recorded. `"admission"` and `true` believe the annotations; containers not created through
//! CRI (podman, ctr, runc) keep their own rules (`trust-libpod-annotations`).
//!
//! [`Recorded::from_record`] turns kubelet's record into devices of this node; [`check`] gives
//! every granted device its [`Backing`] or refuses. Both pure.

use serde::{Deserialize, Serialize};

use super::devices::{Resolved, all_devices, describe, resolve_token, split_list};
use super::dialects::{NVIDIA_DEVICES_MOUNT_DIR, NVIDIA_VISIBLE_DEVICES, nvd_requests_nothing};
use super::{AllocationError, DeviceRef, ForeignCdiDevice};
use crate::config::TrustAnnotations;
use crate::inventory::Inventory;
use crate::kubelet::{ContainerRecord, KubeletSource, ResourceGrant};

/// What backs one granted device (`gpufence plan` shows it for every device).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Backing {
    /// kubelet's device-manager checkpoint: the device plugin of `resource` allocated it to this
    /// container (`ids`: the plugin's device ids that name it, else all of the resource's).
    DevicePlugin { resource: String, ids: Vec<String> },
    /// kubelet's DRA state: a claim prepared for this pod (`namespace/name`).
    DraClaim { claim: String },
    /// `allocation.trust-annotations = "admission"`: the operator's admission policy reserves
    /// the annotation keys to the scheduler.
    Admission,
    /// Believed as written: `trust-annotations = true`, or not a CRI container.
    #[default]
    Trusted,
}

impl std::fmt::Display for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backing::DevicePlugin { resource, ids } => {
                write!(f, "kubelet device plugin {resource} [{}]", ids.join(", "))
            }
            Backing::DraClaim { claim } => write!(f, "kubelet DRA claim {claim}"),
            Backing::Admission => f.write_str("admission policy"),
            Backing::Trusted => f.write_str("trusted"),
        }
    }
}

/// CDI kinds whose device names are gpufence device tokens (`0`, `GPU-…`, `0:1`, `all`).
const GPU_CDI_KINDS: [&str; 2] = [crate::cdi::KIND, "nvidia.com/gpu"];
/// The gpushare device plugin's env naming the GPU index.
const ALIYUN_GPU_IDX: &str = "ALIYUN_COM_GPU_MEM_IDX";
/// Device ids shown per backing at most.
const MAX_IDS_SHOWN: usize = 8;

/// What kubelet recorded for one container, as devices of this node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recorded {
    /// Every recorded device with what recorded it (first record wins).
    pub devices: Vec<(DeviceRef, Backing)>,
    /// Fully qualified CDI names of other kinds (`vendor/class=name`).
    pub cdi_names: Vec<(String, Backing)>,
    /// kubelet's DRA state could not be used (a device not backed otherwise says so).
    pub dra_unavailable: Option<String>,
    /// One line: what kubelet recorded (for the refusal).
    pub summary: String,
}

/// `<id>::<k>` (a time-slicing replica) → `<id>`.
pub fn strip_replica(id: &str) -> &str {
    match id.rsplit_once("::") {
        Some((base, k)) if !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => id,
    }
}

/// The devices one token names (`all`, or one device); nothing when it names none here.
fn token_devices(tok: &str, inv: &Inventory) -> Vec<Resolved> {
    let tok = strip_replica(tok.trim());
    if tok.eq_ignore_ascii_case("all") {
        return all_devices(inv);
    }
    resolve_token(tok, inv).map(|r| vec![r]).unwrap_or_default()
}

/// A device id that names a GPU by itself: a UUID (`GPU-…`, `MIG-…`), or an index where the
/// resource is NVIDIA's (`deviceIDStrategy: index`); replicas as their GPU.
fn id_token<'a>(resource: &str, id: &'a str) -> Option<&'a str> {
    let base = strip_replica(id);
    let upper = base.get(..4).map(str::to_ascii_uppercase);
    let uuid = matches!(upper.as_deref(), Some("GPU-" | "MIG-"));
    let index = !base.is_empty() && base.bytes().all(|b| b.is_ascii_digit());
    (uuid || (index && resource.starts_with("nvidia.com/"))).then_some(base)
}

/// The device tokens and other CDI names one resource's Allocate response and device ids name.
fn grant_tokens(g: &ResourceGrant, inv: &Inventory) -> (Vec<String>, Vec<String>) {
    let mut toks: Vec<String> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    if let Some(v) = g.envs.get(NVIDIA_VISIBLE_DEVICES)
        && !nvd_requests_nothing(v)
        && v.trim() != NVIDIA_DEVICES_MOUNT_DIR
    {
        toks.extend(split_list(v).into_iter().map(str::to_string));
    }
    if let Some(v) = g.envs.get(ALIYUN_GPU_IDX) {
        toks.extend(split_list(v).into_iter().map(str::to_string));
    }
    for (_, host, _) in &g.devices {
        let minor = host
            .strip_prefix("/dev/nvidia")
            .and_then(|m| m.parse::<u32>().ok());
        if let Some(gpu) = minor.and_then(|m| inv.gpus.iter().find(|gpu| gpu.minor == m)) {
            toks.push(gpu.index.to_string());
        }
    }
    let prefix = format!("{NVIDIA_DEVICES_MOUNT_DIR}/");
    for (container, _, _) in &g.mounts {
        if let Some(id) = container.strip_prefix(&prefix) {
            toks.push(id.trim_end_matches('/').to_string());
        }
    }
    let mut cdi: Vec<crate::cdi::parse::QualifiedName> = Vec::new();
    for (k, v) in &g.annotations {
        if k.starts_with(crate::cdi::parse::ANNOTATION_PREFIX)
            && let Ok(list) = crate::cdi::parse::parse_annotation_value(v)
        {
            cdi.extend(list);
        }
    }
    cdi.extend(
        g.cdi_devices
            .iter()
            .filter_map(|n| crate::cdi::parse::parse_qualified_name(n).ok()),
    );
    for q in cdi {
        if GPU_CDI_KINDS.contains(&q.kind().as_str()) {
            toks.push(q.name.clone());
        } else {
            names.push(q.to_string());
        }
    }
    toks.extend(
        g.device_ids
            .iter()
            .filter_map(|id| id_token(&g.resource, id))
            .map(str::to_string),
    );
    (toks, names)
}

impl Recorded {
    /// What `record` backs on this node. Tokens naming nothing here back nothing.
    pub fn from_record(record: &ContainerRecord, inv: &Inventory) -> Recorded {
        let mut out = Recorded {
            dra_unavailable: record.dra_unavailable.clone(),
            ..Recorded::default()
        };
        let mut summary: Vec<String> = Vec::new();
        for g in &record.resources {
            let (toks, names) = grant_tokens(g, inv);
            let devs: Vec<Resolved> = toks.iter().flat_map(|t| token_devices(t, inv)).collect();
            for r in &devs {
                // The plugin's ids naming this device, else all of the resource's.
                let mut ids: Vec<String> = g
                    .device_ids
                    .iter()
                    .filter(|id| {
                        id_token(&g.resource, id).is_some_and(|t| {
                            token_devices(t, inv).iter().any(|x| x.device == r.device)
                        })
                    })
                    .cloned()
                    .collect();
                if ids.is_empty() {
                    ids = g.device_ids.clone();
                }
                ids.truncate(MAX_IDS_SHOWN);
                out.add(
                    r.device,
                    Backing::DevicePlugin {
                        resource: g.resource.clone(),
                        ids,
                    },
                );
            }
            for n in names {
                out.add_name(
                    n,
                    Backing::DevicePlugin {
                        resource: g.resource.clone(),
                        ids: g.device_ids.iter().take(MAX_IDS_SHOWN).cloned().collect(),
                    },
                );
            }
            summary.push(format!(
                "{} [{}]{}",
                g.resource,
                g.device_ids
                    .iter()
                    .take(MAX_IDS_SHOWN)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
                shown_devices(&devs)
            ));
        }
        for c in &record.dra_claims {
            let mut devs: Vec<Resolved> = Vec::new();
            for id in &c.cdi_device_ids {
                let Ok(q) = crate::cdi::parse::parse_qualified_name(id) else {
                    continue;
                };
                let backing = Backing::DraClaim {
                    claim: c.claim.clone(),
                };
                if GPU_CDI_KINDS.contains(&q.kind().as_str()) {
                    for r in token_devices(&q.name, inv) {
                        out.add(r.device, backing.clone());
                        devs.push(r);
                    }
                } else {
                    out.add_name(q.to_string(), backing);
                }
            }
            summary.push(format!(
                "DRA claim {} [{}]{}",
                c.claim,
                c.cdi_device_ids.join(", "),
                shown_devices(&devs)
            ));
        }
        out.summary = if summary.is_empty() {
            "nothing".to_string()
        } else {
            summary.join("; ")
        };
        out
    }

    fn add(&mut self, d: DeviceRef, b: Backing) {
        if !self.devices.iter().any(|(x, _)| *x == d) {
            self.devices.push((d, b));
        }
    }

    fn add_name(&mut self, n: String, b: Backing) {
        if !self.cdi_names.iter().any(|(x, _)| *x == n) {
            self.cdi_names.push((n, b));
        }
    }

    /// What backs `d`: its own record, or (a MIG device) its whole GPU's.
    pub fn backing_of(&self, d: DeviceRef) -> Option<&Backing> {
        let parent = match d {
            DeviceRef::Mig { gpu, .. } => Some(DeviceRef::Gpu { index: gpu }),
            DeviceRef::Gpu { .. } => None,
        };
        self.devices
            .iter()
            .find(|(x, _)| *x == d)
            .or_else(|| self.devices.iter().find(|(x, _)| Some(*x) == parent))
            .map(|(_, b)| b)
    }

    /// What backs the CDI device named `name` (fully qualified).
    pub fn backing_of_name(&self, name: &str) -> Option<&Backing> {
        self.cdi_names
            .iter()
            .find(|(x, _)| x == name)
            .map(|(_, b)| b)
    }
}

fn shown_devices(devs: &[Resolved]) -> String {
    if devs.is_empty() {
        return String::new();
    }
    let d: Vec<String> = devs.iter().map(|r| describe(&r.device, &r.uuid)).collect();
    format!(" = {}", d.join(", "))
}

/// The container as the check sees it.
pub struct Subject<'a> {
    pub mode: TrustAnnotations,
    /// Created through CRI: a pod identity (well-formed or not) on a container that is not a
    /// podman one whose annotations are not believed.
    pub cri: bool,
    /// What kubelet's device-manager checkpoint (and DRA state) say about it.
    pub source: &'a KubeletSource,
    pub inventory: &'a Inventory,
}

/// Whether the container was created through CRI: it carries a pod identity (a malformed one
/// counts: fail closed), whatever else it carries. podman's markers do not make it "not CRI":
/// CRI-O copies a pod's annotations into the spec, so a pod can add `io.container.manager =
/// libpod` and would otherwise have its grants believed without kubelet's record; a podman
/// container whose image carries a CRI identity (podman copies an image's annotations) gets no
/// grant kubelet cannot back — kubelet's record is not read for it — which fails closed.
pub fn is_cri(inputs: &super::input::Inputs) -> bool {
    !matches!(
        crate::kubelet::PodIdentity::from_annotations(&inputs.annotations),
        Ok(None)
    )
}

/// One granted thing, for naming the input that granted it.
#[derive(Debug, Clone, Copy)]
pub enum Granted<'a> {
    Device(&'a Resolved),
    Cdi(&'a str),
}

impl Granted<'_> {
    fn shown(&self) -> String {
        match self {
            Granted::Device(r) => describe(&r.device, &r.uuid),
            Granted::Cdi(n) => format!("CDI device {n}"),
        }
    }
}

/// The backing of every granted device and foreign CDI device, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Backings {
    pub devices: Vec<Backing>,
    pub foreign: Vec<Backing>,
}

/// Give every granted device its backing, or refuse the container (see the module doc).
/// `named_by` answers the key and value that granted a device, for the refusal line.
pub fn check<'a>(
    s: &Subject,
    devices: &'a [Resolved],
    foreign: &'a [ForeignCdiDevice],
    named_by: impl Fn(Granted<'a>) -> (String, String),
) -> Result<Backings, AllocationError> {
    let granted: Vec<Granted> = devices
        .iter()
        .map(Granted::Device)
        .chain(foreign.iter().map(|f| Granted::Cdi(&f.name)))
        .collect();
    let recorded = match s.source {
        KubeletSource::Record(r) if s.cri => Some(Recorded::from_record(r, s.inventory)),
        _ => None,
    };
    let mut out: Vec<Backing> = Vec::with_capacity(granted.len());
    for g in &granted {
        let backed = recorded.as_ref().and_then(|rec| match g {
            Granted::Device(r) => rec.backing_of(r.device),
            Granted::Cdi(n) => rec.backing_of_name(n),
        });
        let b = match (backed, s.mode) {
            (Some(b), _) => b.clone(),
            _ if !s.cri => Backing::Trusted,
            (None, TrustAnnotations::Admission) => Backing::Admission,
            (None, TrustAnnotations::Believed) => Backing::Trusted,
            (None, TrustAnnotations::Kubelet) => {
                let (key, value) = named_by(*g);
                return Err(refusal(s, recorded.as_ref(), g, &key, &value));
            }
        };
        out.push(b);
    }
    let foreign_backings = out.split_off(devices.len());
    Ok(Backings {
        devices: out,
        foreign: foreign_backings,
    })
}

/// The one line refusing an unbacked grant.
fn refusal(
    s: &Subject,
    recorded: Option<&Recorded>,
    g: &Granted,
    key: &str,
    value: &str,
) -> AllocationError {
    // A message fragment (a `let`, not a key constant: tests/admission_policy.rs scans those).
    let mode = TrustAnnotations::Kubelet.as_toml();
    let why = match (s.source, recorded) {
        (KubeletSource::Record(r), Some(rec)) => {
            let pod = r.identity.pod.as_deref().unwrap_or(&r.identity.pod_uid);
            let dra = rec
                .dra_unavailable
                .as_deref()
                .map(|w| format!(" (its DRA state cannot be used: {w})"))
                .unwrap_or_default();
            format!(
                "{} is not among what kubelet recorded for container {} of pod {pod} \
                 (allocation.trust-annotations = {mode}); \
                 kubelet recorded: {}{dra}",
                g.shown(),
                r.identity.container_name,
                rec.summary
            )
        }
        (KubeletSource::Unavailable { checkpoint, why }, _) => format!(
            "{} on a Kubernetes container needs kubelet's record of it \
             (allocation.trust-annotations = {mode}), and kubelet \
             checkpoint {checkpoint} cannot be used: {why}",
            g.shown()
        ),
        _ => format!(
            "{} on a Kubernetes container needs kubelet's record of it \
             (allocation.trust-annotations = {mode}), and this node \
             has no kubelet device-plugin checkpoint directory (kubelet.checkpoint)",
            g.shown()
        ),
    };
    tracing::warn!(key, value, reason = %why, "grant not backed by kubelet: refused");
    AllocationError::new(key, value, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_ids_map_to_their_gpu() {
        assert_eq!(strip_replica("GPU-a::3"), "GPU-a");
        assert_eq!(strip_replica("1::0"), "1");
        assert_eq!(strip_replica("GPU-a::"), "GPU-a::");
        assert_eq!(strip_replica("GPU-a::x"), "GPU-a::x");
        assert_eq!(strip_replica("GPU-a"), "GPU-a");
        assert_eq!(id_token("nvidia.com/gpu", "0::2"), Some("0"));
        assert_eq!(id_token("example.com/fpga", "0"), None);
        assert_eq!(id_token("example.com/x", "GPU-a::1"), Some("GPU-a"));
        assert_eq!(id_token("nvidia.com/gpu", "GPU-a-3"), Some("GPU-a-3"));
        assert_eq!(id_token("nvidia.com/gpu", "tegra"), None);
    }

    #[test]
    fn backing_is_shown_as_the_plan_says_it() {
        let b = Backing::DevicePlugin {
            resource: "nvidia.com/gpu".into(),
            ids: vec!["GPU-a::0".into(), "GPU-a::1".into()],
        };
        assert_eq!(
            b.to_string(),
            "kubelet device plugin nvidia.com/gpu [GPU-a::0, GPU-a::1]"
        );
        assert_eq!(
            Backing::DraClaim {
                claim: "ns/c".into()
            }
            .to_string(),
            "kubelet DRA claim ns/c"
        );
        assert_eq!(Backing::Admission.to_string(), "admission policy");
        assert_eq!(Backing::Trusted.to_string(), "trusted");
        assert_eq!(
            serde_json::to_value(&b).unwrap(),
            serde_json::json!({"kind": "devicePlugin", "resource": "nvidia.com/gpu",
                               "ids": ["GPU-a::0", "GPU-a::1"]})
        );
    }
}
