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

use super::container_dialects::{
    NVIDIA_DEVICES_MOUNT_DIR, NVIDIA_VISIBLE_DEVICES, nvd_requests_nothing,
};
use super::device_nodes::{NodeKey, devices_of, node_at};
use super::devices::{Resolved, all_devices, describe, resolve_token, split_list};
use super::dra_share::Share;
pub use super::types::Backing;
use super::{AllocationError, DeviceRef, ForeignCdiDevice};
use crate::cdi::LoadedSpec;
use crate::config::TrustAnnotations;
use crate::inventory::Inventory;
use crate::kubelet::{ContainerRecord, DraClaimRecord, KubeletSource, ResourceGrant};

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
    /// Every device node recorded: DeviceSpecs by host path, CDI devices resolved through
    /// their specs.
    pub nodes: Vec<(NodeKey, Backing)>,
    /// The shares of shared DRA devices (`ShareID`): what the driver wrote, or why it cannot
    /// be read.
    pub shares: Vec<(DeviceRef, Result<Share, String>)>,
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
fn grant_tokens(g: &ResourceGrant) -> (Vec<String>, Vec<String>) {
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
    let prefix = format!("{NVIDIA_DEVICES_MOUNT_DIR}/");
    for (container, _, _) in &g.mounts {
        if let Some(id) = container.strip_prefix(&prefix) {
            toks.push(id.trim_end_matches('/').to_string());
        }
    }
    for n in grant_cdi_names(g) {
        let Ok(q) = crate::cdi::parse::parse_qualified_name(&n) else {
            continue;
        };
        if GPU_CDI_KINDS.contains(&q.kind().as_str()) {
            toks.push(q.name.clone());
        } else {
            names.push(n);
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

/// The CDI devices of one Allocate response (`cdi.k8s.io/*` annotations and `cdi_devices`),
/// fully qualified, each once.
fn grant_cdi_names(g: &ResourceGrant) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (k, v) in &g.annotations {
        if k.starts_with(crate::cdi::parse::ANNOTATION_PREFIX)
            && let Ok(list) = crate::cdi::parse::parse_annotation_value(v)
        {
            out.extend(list.iter().map(ToString::to_string));
        }
    }
    out.extend(
        g.cdi_devices
            .iter()
            .filter_map(|n| crate::cdi::parse::parse_qualified_name(n).ok())
            .map(|q| q.to_string()),
    );
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|n| seen.insert(n.clone()));
    out
}

/// A CDI device kubelet recorded, resolved through its spec (the engine resolves it the same
/// way): the spec, the device, its nodes and the devices they grant.
struct CdiResolved<'a> {
    spec: &'a LoadedSpec,
    dev: &'a crate::cdi::Device,
    nodes: Vec<NodeKey>,
    devices: Vec<Resolved>,
}

/// `name` (fully qualified) through the loaded specs; `None` where no spec defines it, or two of
/// the same priority do (the engine refuses it then).
fn resolve_cdi<'a>(
    name: &str,
    specs: &'a [LoadedSpec],
    inv: &Inventory,
) -> Option<CdiResolved<'a>> {
    let q = crate::cdi::parse::parse_qualified_name(name).ok()?;
    let (spec, dev) = crate::cdi::parse::find_device(specs, &q).ok().flatten()?;
    let mut nodes: Vec<NodeKey> = Vec::new();
    for n in dev
        .container_edits
        .device_nodes
        .iter()
        .chain(&spec.spec.container_edits.device_nodes)
    {
        let kind = match n.kind.as_deref() {
            Some("c" | "u") => Some('c'),
            Some("b") => Some('b'),
            _ => None,
        };
        let num = |v: Option<i64>| v.and_then(|v| u32::try_from(v).ok());
        let key = match (kind, num(n.major), num(n.minor)) {
            (Some(k), Some(major), Some(minor)) => Some((k, major, minor)),
            _ => node_at(inv, n.host_path.as_deref().unwrap_or(&n.path)),
        };
        if let Some(k) = key
            && !nodes.contains(&k)
        {
            nodes.push(k);
        }
    }
    let (devices, _) = devices_of(inv, &nodes);
    Some(CdiResolved {
        spec,
        dev,
        nodes,
        devices,
    })
}

/// The node of a resolved device (its GPU's), as the container sees it.
fn gpu_path(inv: &Inventory, d: DeviceRef) -> Option<String> {
    let index = match d {
        DeviceRef::Gpu { index } => index,
        DeviceRef::Mig { gpu, .. } => gpu,
    };
    inv.gpu_by_index(index).map(|g| g.node.path.clone())
}

impl Recorded {
    /// What `record` backs on this node; CDI devices are resolved through `specs` (the
    /// engine's CDI directories). Tokens naming nothing here back nothing.
    pub fn from_record(
        record: &ContainerRecord,
        inv: &Inventory,
        specs: &[LoadedSpec],
    ) -> Recorded {
        let mut out = Recorded {
            dra_unavailable: record.dra_unavailable.clone(),
            ..Recorded::default()
        };
        let mut summary: Vec<String> = Vec::new();
        for g in &record.resources {
            summary.push(out.add_resource(g, inv, specs));
        }
        for c in &record.dra_claims {
            summary.push(out.add_claim(c, inv, specs));
        }
        out.summary = if summary.is_empty() {
            "nothing".to_string()
        } else {
            summary.join("; ")
        };
        out
    }

    /// One device plugin's grant; its line of the summary.
    fn add_resource(&mut self, g: &ResourceGrant, inv: &Inventory, specs: &[LoadedSpec]) -> String {
        let (toks, names) = grant_tokens(g);
        let mut devs: Vec<Resolved> = toks.iter().flat_map(|t| token_devices(t, inv)).collect();
        let backing_all = Backing::DevicePlugin {
            resource: g.resource.clone(),
            ids: g.device_ids.iter().take(MAX_IDS_SHOWN).cloned().collect(),
        };
        // DeviceSpecs, by host path, and CDI devices, through their specs: device nodes.
        let spec_nodes: Vec<NodeKey> = g
            .devices
            .iter()
            .filter_map(|(_, host, _)| node_at(inv, host))
            .collect();
        let mut node_devs = devices_of(inv, &spec_nodes).0;
        for k in &spec_nodes {
            self.add_node(*k, backing_all.clone());
        }
        let mut unresolved: Vec<String> = Vec::new();
        for n in grant_cdi_names(g) {
            match resolve_cdi(&n, specs, inv) {
                Some(r) => {
                    for k in &r.nodes {
                        self.add_node(*k, backing_all.clone());
                    }
                    node_devs.extend(r.devices);
                }
                None if !is_gpu_kind(&n) => unresolved.push(n),
                None => {}
            }
        }
        devs.extend(node_devs);
        for r in &devs {
            // The plugin's ids naming this device, else all of the resource's.
            let mut ids: Vec<String> = g
                .device_ids
                .iter()
                .filter(|id| {
                    id_token(&g.resource, id)
                        .is_some_and(|t| token_devices(t, inv).iter().any(|x| x.device == r.device))
                })
                .cloned()
                .collect();
            if ids.is_empty() {
                ids = g.device_ids.clone();
            }
            ids.truncate(MAX_IDS_SHOWN);
            self.add(
                r.device,
                Backing::DevicePlugin {
                    resource: g.resource.clone(),
                    ids,
                },
            );
        }
        for n in names {
            self.add_name(n, backing_all.clone());
        }
        format!(
            "{} [{}]{}{}",
            g.resource,
            g.device_ids
                .iter()
                .take(MAX_IDS_SHOWN)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            shown_devices(&devs),
            shown_unresolved(&unresolved)
        )
    }

    /// One DRA claim of the pod: its CDI ids as gpufence device tokens (gpufence's and
    /// NVIDIA's kinds) and through their specs, with the share of a shared device; its line of
    /// the summary.
    fn add_claim(&mut self, c: &DraClaimRecord, inv: &Inventory, specs: &[LoadedSpec]) -> String {
        let mut devs: Vec<Resolved> = Vec::new();
        let mut unresolved: Vec<String> = Vec::new();
        for id in &c.cdi_device_ids {
            let Ok(q) = crate::cdi::parse::parse_qualified_name(id) else {
                continue;
            };
            let shared = c.shared_cdi_ids.contains(id);
            let resolved = resolve_cdi(id, specs, inv);
            if resolved.is_none() && !is_gpu_kind(id) {
                unresolved.push(id.clone());
            }
            let share: Option<Result<Share, String>> = shared.then(|| match &resolved {
                None => Err(format!("no CDI spec in the CDI directories (cdi.spec-dirs) defines {id}")),
                Some(r) => match super::dra_share::read(r.spec, r.dev) {
                    Ok(Some(s)) if !s.is_empty() => Ok(s),
                    Ok(_) => Err(format!(
                        "its driver wrote no share into {} (gpufence.dev/memory, gpufence.dev/cores or CUDA_DEVICE_MEMORY_LIMIT_<i>)",
                        r.spec.path.display()
                    )),
                    Err(e) => Err(e),
                },
            });
            let mut here: Vec<Resolved> = Vec::new();
            if GPU_CDI_KINDS.contains(&q.kind().as_str()) {
                here.extend(token_devices(&q.name, inv));
            } else {
                self.add_name(
                    q.to_string(),
                    Backing::DraClaim {
                        claim: c.claim.clone(),
                        device: None,
                        share: None,
                    },
                );
            }
            if let Some(r) = &resolved {
                here.extend(r.devices.iter().cloned());
            }
            let shown_share = share
                .as_ref()
                .and_then(|s| s.as_ref().ok())
                .map(Share::shown);
            for r in &here {
                let b = Backing::DraClaim {
                    claim: c.claim.clone(),
                    device: gpu_path(inv, r.device),
                    share: shown_share.clone(),
                };
                self.add(r.device, b);
                if let Some(s) = &share
                    && !self.shares.iter().any(|(d, _)| *d == r.device)
                {
                    self.shares.push((r.device, s.clone()));
                }
            }
            if let Some(r) = &resolved {
                let b = Backing::DraClaim {
                    claim: c.claim.clone(),
                    device: None,
                    share: None,
                };
                for k in &r.nodes {
                    self.add_node(*k, b.clone());
                }
            }
            devs.extend(here);
        }
        let ids: Vec<String> = c
            .cdi_device_ids
            .iter()
            .map(|id| match unresolved.contains(id) {
                true => format!("{id}: {}", not_in_any_spec()),
                false => id.clone(),
            })
            .collect();
        format!(
            "DRA claim {} [{}]{}",
            c.claim,
            ids.join(", "),
            shown_devices(&devs)
        )
    }

    fn add_node(&mut self, k: NodeKey, b: Backing) {
        if !self.nodes.iter().any(|(x, _)| *x == k) {
            self.nodes.push((k, b));
        }
    }

    /// What backs the device node `k`.
    pub fn backing_of_node(&self, k: NodeKey) -> Option<&Backing> {
        self.nodes.iter().find(|(x, _)| *x == k).map(|(_, b)| b)
    }

    /// The share of `d` (or of its GPU, for a MIG device), where `d` is a shared DRA device.
    pub fn share_of(&self, d: DeviceRef) -> Option<&Result<Share, String>> {
        let parent = match d {
            DeviceRef::Mig { gpu, .. } => Some(DeviceRef::Gpu { index: gpu }),
            DeviceRef::Gpu { .. } => None,
        };
        self.shares
            .iter()
            .find(|(x, _)| *x == d)
            .or_else(|| self.shares.iter().find(|(x, _)| Some(*x) == parent))
            .map(|(_, s)| s)
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

/// Whether a fully qualified CDI name is of a kind whose device names are gpufence device
/// tokens (resolved without a spec).
fn is_gpu_kind(name: &str) -> bool {
    crate::cdi::parse::parse_qualified_name(name)
        .is_ok_and(|q| GPU_CDI_KINDS.contains(&q.kind().as_str()))
}

/// The recorded CDI devices no spec defines, for the summary of a device plugin's grant (a
/// claim's are marked in its list of ids): what kubelet recorded then backs
/// nothing, and the refusal says why (a driver's spec gpufence did not read — not in
/// `cdi.spec-dirs`, or skipped as writable by others: gpufence's log names the file).
fn shown_unresolved(names: &[String]) -> String {
    if names.is_empty() {
        return String::new();
    }
    format!(" ({}: {})", names.join(", "), not_in_any_spec())
}

/// What the summary says of a recorded CDI device no spec defines (a message fragment: a fn,
/// not a key constant — tests/admission_policy.rs scans those).
fn not_in_any_spec() -> &'static str {
    "in no CDI spec read from cdi.spec-dirs"
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
    recorded: Option<&Recorded>,
    devices: &'a [Resolved],
    foreign: &'a [ForeignCdiDevice],
    named_by: impl Fn(Granted<'a>) -> (String, String),
) -> Result<Backings, AllocationError> {
    let granted: Vec<Granted> = devices
        .iter()
        .map(Granted::Device)
        .chain(foreign.iter().map(|f| Granted::Cdi(&f.name)))
        .collect();
    let mut out: Vec<Backing> = Vec::with_capacity(granted.len());
    for g in &granted {
        let backed = recorded.and_then(|rec| match g {
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
                return Err(unbacked(s, recorded, &g.shown(), &key, &value));
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

/// What kubelet recorded for the container of `s`, on this node (`None`: not a CRI container,
/// or no usable record). CDI devices are resolved through `specs`.
pub fn recorded(s: &Subject, specs: &[LoadedSpec]) -> Option<Recorded> {
    match s.source {
        KubeletSource::Record(r) if s.cri => Some(Recorded::from_record(r, s.inventory, specs)),
        _ => None,
    }
}

/// The one line refusing an unbacked grant (`shown`: what was granted).
pub fn unbacked(
    s: &Subject,
    recorded: Option<&Recorded>,
    shown: &str,
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
                shown, r.identity.container_name, rec.summary
            )
        }
        (KubeletSource::Unavailable { checkpoint, why }, _) => format!(
            "{} on a Kubernetes container needs kubelet's record of it \
             (allocation.trust-annotations = {mode}), and kubelet \
             checkpoint {checkpoint} cannot be used: {why}",
            shown
        ),
        _ => format!(
            "{} on a Kubernetes container needs kubelet's record of it \
             (allocation.trust-annotations = {mode}), and this node \
             has no kubelet device-plugin checkpoint directory (kubelet.checkpoint)",
            shown
        ),
    };
    // Koordinator's GPUs are never in kubelet's record: say which mode its pods need.
    let why = if key == super::koordinator::ALLOCATED {
        format!("{}; {why}", super::koordinator::needs_admission())
    } else {
        why
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
                claim: "ns/c".into(),
                device: None,
                share: None,
            }
            .to_string(),
            "kubelet DRA claim ns/c"
        );
        assert_eq!(
            Backing::DraClaim {
                claim: "team-a/train-gpu".into(),
                device: Some("/dev/nvidia1".into()),
                share: Some("8 GiB".into()),
            }
            .to_string(),
            "kubelet DRA claim team-a/train-gpu (device /dev/nvidia1, share 8 GiB)"
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
