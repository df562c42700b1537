//! Time-slicing replicas become enforced slices (`sharing.replicas = "equal"`, the default): a
//! container that kubelet records holding r of a GPU's N replicas (NVIDIA's device plugin with
//! `sharing.timeSlicing` or `sharing.mps`: ids `<uuid>::<k>` or `<index>::<k>`, read by
//! [`crate::kubelet::replicas`]) gets floor(memory × r / N) of the device's memory, a hard quota,
//! and 100 × r / N percent of its compute under `sharing.replica-cores-policy` (default `burst`).
//! Because kubelet hands each replica id to one container, the shares of a GPU's containers
//! never sum above the GPU.
//!
//! The share is a ceiling on whatever dialect allocated the device: an annotation
//! (`gpufence.dev/memory`, `gpufence.dev/cores`, `gpufence.dev/cores-policy: hard`) may lower it,
//! never raise it — a higher value is refused in one line. A MIG device gets the share of its
//! own memory and no compute share (MIG isolates compute); so does a MIG device of a GPU held as
//! replicas (the GPU's record backs it). Where kubelet is expected but its
//! record cannot be used, a container whose devices the device plugin allocated (the nvidia
//! dialect: its env or device mounts) is refused: its share cannot be known. (Env-borne ones are
//! refused before, [`super::kubelet_env::refusal`]; annotation-borne grants are the business of
//! `allocation.trust-annotations`.)

use super::container_dialects::ANN_CORES_POLICY;
use super::devices::{Resolved, describe, resolve_token};
use super::input::Inputs;
pub use super::types::ReplicaShare;
use super::{AllocationError, DeviceRef, FacetSource, Origin};
use crate::config::{Config, CoresPolicy, Dialect, ReplicasPolicy};
use crate::inventory::Inventory;
use crate::kubelet::{ContainerRecord, KubeletSource};

/// The key errors about kubelet's record are reported under.
const KEY: &str = "kubelet.checkpoint";

impl ReplicaShare {
    /// `replica 2 of 4 of GPU-… (nvidia.com/gpu) → 20 GiB, 25 % burst` (`uuid`: the device's;
    /// `burst`: the policy, when known).
    pub fn describe(&self, uuid: &str, burst: Option<bool>) -> String {
        let policy = match burst {
            Some(true) => " burst",
            Some(false) => " hard",
            None => "",
        };
        let cores = match self.cores {
            Some(c) => format!("{c} %{policy}"),
            None => "compute isolated by MIG".to_string(),
        };
        format!(
            "replica{} {} of {} of {uuid} ({}) → {}, {cores}",
            if self.held == 1 { "" } else { "s" },
            self.held,
            self.of,
            self.resource,
            gib(self.memory),
        )
    }
}

/// `20 GiB`, `19.91 GiB`.
fn gib(bytes: u64) -> String {
    let g = format!("{:.2}", bytes as f64 / (1u64 << 30) as f64);
    format!("{} GiB", g.trim_end_matches('0').trim_end_matches('.'))
}

/// The share of `held` of `of` replicas of a device of `memory` bytes. Pure.
pub fn share(memory: u64, held: u32, of: u32, mig: bool) -> (u64, Option<u8>) {
    let of = of.max(1);
    let held = held.min(of);
    let mem = (u128::from(memory) * u128::from(held) / u128::from(of)) as u64;
    let cores = (!mig).then(|| ((100 * u64::from(held) / u64::from(of)).max(1)) as u8);
    (mem, cores)
}

/// Per-device limits as the dialects agreed them: `(value, key, value text)`.
pub(super) type Limits<T> = Vec<(Option<T>, String, String)>;

/// What the replica shares did to one container's allocation.
pub(super) struct Applied {
    /// Per device (container order): its share, if it is held as replicas.
    pub shares: Vec<Option<ReplicaShare>>,
    pub sources: Vec<FacetSource>,
    pub notes: Vec<String>,
}

/// The replica shares of `devices` (from kubelet's record) capping `memory` and `cores`.
/// `from_plugin`: the nvidia dialect (the device plugin's env or mounts) named devices.
pub(super) fn apply(
    source: &KubeletSource,
    from_plugin: bool,
    devices: &[Resolved],
    inv: &Inventory,
    config: &Config,
    memory: &mut Limits<u64>,
    cores: &mut Limits<u8>,
) -> Result<Applied, AllocationError> {
    let mut out = Applied {
        shares: vec![None; devices.len()],
        sources: Vec::new(),
        notes: Vec::new(),
    };
    if config.sharing.replicas == ReplicasPolicy::Off || devices.is_empty() {
        return Ok(out);
    }
    let record = match source {
        KubeletSource::Absent => return Ok(out),
        KubeletSource::Unavailable { .. } if !from_plugin => return Ok(out),
        KubeletSource::Unavailable { checkpoint, why } => {
            let names: Vec<String> = devices
                .iter()
                .map(|r| describe(&r.device, &r.uuid))
                .collect();
            return Err(AllocationError::new(
                KEY,
                checkpoint,
                format!(
                    "the device plugin's {} may be time-slicing replicas, whose share needs \
                     kubelet's record of this container (sharing.replicas = \"equal\"), and it \
                     cannot be used: {why}",
                    names.join(", ")
                ),
            ));
        }
        KubeletSource::Record(r) => r,
    };
    let held = resolve(record, inv)?;
    pad(memory, devices.len());
    pad(cores, devices.len());
    for (i, r) in devices.iter().enumerate() {
        // A MIG device of a GPU held as replicas (which backs it) gets r/N of its own memory.
        let parent = match r.device {
            DeviceRef::Mig { gpu, .. } => Some(DeviceRef::Gpu { index: gpu }),
            DeviceRef::Gpu { .. } => None,
        };
        let Some((resource, h, of)) = held
            .iter()
            .find(|(d, ..)| *d == r.device)
            .or_else(|| held.iter().find(|(d, ..)| Some(*d) == parent))
            .map(|x| &x.1)
        else {
            continue;
        };
        let mig = matches!(r.device, DeviceRef::Mig { .. });
        let (mem, share_cores) = share(r.memory_bytes, *h, *of, mig);
        let s = ReplicaShare {
            resource: resource.clone(),
            held: *h,
            of: *of,
            memory: mem,
            cores: share_cores,
        };
        let what = format!("{resource}: {h} of {of} replicas of {}", r.uuid);
        if h < of {
            cap(&mut memory[i], mem, r, &s, &what, gib)?;
            out.sources.push(source_of("memory", &what));
            if let Some(c) = share_cores {
                cap(&mut cores[i], c, r, &s, &what, |c| format!("{c} %"))?;
                out.sources.push(source_of("cores", &what));
            }
        }
        out.notes.push(format!(
            "GPU share from kubelet's record: {}{}",
            s.describe(&r.uuid, None),
            if h >= of {
                " (every replica: the whole device)"
            } else if mig {
                " (memory only: a MIG device isolates compute)"
            } else {
                ""
            }
        ));
        tracing::info!(device = %r.uuid, resource = %resource, held = h, of = of, memory = mem,
            cores = ?share_cores, "time-slicing replica share");
        out.shares[i] = Some(s);
    }
    Ok(out)
}

/// One device held as replicas: `(device, (resource, r, N))`.
type Held = (DeviceRef, (String, u32, u32));

/// Kubelet's holdings resolved to this node's devices.
fn resolve(record: &ContainerRecord, inv: &Inventory) -> Result<Vec<Held>, AllocationError> {
    let err = |why: String| AllocationError::new(KEY, &record.checkpoint, why);
    let mut out: Vec<Held> = Vec::new();
    for h in &record.replicas {
        let r = resolve_token(&h.device, inv).map_err(|e| {
            err(format!(
                "{} replica {}::{}: {e}",
                h.resource, h.device, h.held[0]
            ))
        })?;
        if !h.unregistered.is_empty() {
            let ks: Vec<String> = h
                .unregistered
                .iter()
                .map(|k| format!("{}::{k}", h.device))
                .collect();
            return Err(err(format!(
                "container {} holds {} ({}), which kubelet does not register (it registers {} \
                 replicas of {}): its share cannot be known",
                record.identity.container_name,
                ks.join(","),
                h.resource,
                h.registered,
                h.device
            )));
        }
        if let Some((_, (res, ..))) = out.iter().find(|(d, _)| *d == r.device) {
            return Err(err(format!(
                "{} is held as replicas through {res} and {} (or under two names): one share \
                 per device",
                describe(&r.device, &r.uuid),
                h.resource
            )));
        }
        out.push((
            r.device,
            (h.resource.clone(), h.held.len() as u32, h.registered),
        ));
    }
    Ok(out)
}

fn pad<T>(v: &mut Limits<T>, n: usize) {
    while v.len() < n {
        v.push((None, String::new(), String::new()));
    }
}

fn source_of(facet: &str, what: &str) -> FacetSource {
    FacetSource {
        facet: facet.to_string(),
        dialect: Dialect::Nvidia,
        origin: Origin::Kubelet,
        key: KEY.to_string(),
        value: what.to_string(),
    }
}

/// The share as a ceiling: no limit becomes the share, a lower one stays, a higher one is refused.
fn cap<T: Copy + PartialOrd>(
    slot: &mut (Option<T>, String, String),
    limit: T,
    r: &Resolved,
    s: &ReplicaShare,
    what: &str,
    show: impl Fn(T) -> String,
) -> Result<(), AllocationError> {
    match slot.0 {
        None => *slot = (Some(limit), KEY.to_string(), what.to_string()),
        Some(v) if v > limit => {
            return Err(AllocationError::new(
                &slot.1,
                &slot.2,
                format!(
                    "{} is more than the time-slicing share of {}: {} of {} replicas ({}) = {}; \
                     an annotation may lower the share, never raise it",
                    show(v),
                    describe(&r.device, &r.uuid),
                    s.held,
                    s.of,
                    s.resource,
                    show(limit)
                ),
            ));
        }
        Some(_) => {}
    }
    Ok(())
}

/// The cores policy of a container with replica compute shares: the annotation's, which may
/// only lower (`hard` under `burst`), else `sharing.replica-cores-policy`. `burst` is what
/// [`super::compute::cores_policy`] decided from the annotation alone.
pub(super) fn cores_policy(
    inputs: &Inputs,
    shares: &[Option<ReplicaShare>],
    burst: bool,
    config: &Config,
) -> Result<bool, AllocationError> {
    let any = shares
        .iter()
        .flatten()
        .any(|s| s.cores.is_some() && s.held < s.of);
    if !any {
        return Ok(burst);
    }
    let node = config.sharing.replica_cores_policy == CoresPolicy::Burst;
    match inputs.annotations.get(ANN_CORES_POLICY) {
        None => Ok(node),
        Some(v) if burst && !node => Err(AllocationError::new(
            ANN_CORES_POLICY,
            v,
            "raises the time-slicing compute share's policy (sharing.replica-cores-policy = \
             \"hard\"): an annotation may lower the share, never raise it",
        )),
        Some(_) => Ok(burst),
    }
}
