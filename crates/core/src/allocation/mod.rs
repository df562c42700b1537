//! What the scheduler decided, normalised from any dialect (gpufence annotations, CDI
//! annotations, HAMi, Aliyun gpushare, NVIDIA device plugin).
//!
//! Reading is pure: it takes the parsed `config.json`, the inventory, the configuration and the
//! CDI specs found on the host (loaded at the edge) and returns one [`Allocation`] or a
//! one-line [`AllocationError`] naming the key, the value and why.

use crate::config::Dialect;
use crate::inventory::Capability;

mod agree;
pub mod backing;
pub mod compute;
pub mod container_dialects;
pub mod device_nodes;
pub mod devices;
mod dra_limits;
pub mod dra_share;
pub mod error;
pub mod input;
pub mod kubelet_env;
pub mod libpod;
pub mod pod_dialects;
pub mod record;
pub mod replicas;
pub mod spec_devices;
pub mod types;

pub use error::{AllocationError, MAX_WHY};

/// Koordinator: koord-scheduler's `scheduling.koordinator.sh/device-allocated` annotation
/// ([`pod_dialects::koordinator_pod`]) and the env koordlet adds beside it
/// ([`container_dialects::koordlet_env`]): what agrees with the plan, and HAMi-core's preload,
/// which gpufence's shim replaces.
pub mod koordinator {
    pub use super::container_dialects::koordlet_env::{
        HAMI_CORE_PROVIDER, ISOLATION_PROVIDER, koordlet_env_agrees, neutralise_hami_core,
        without_hami_core,
    };
    pub use super::pod_dialects::koordinator_pod::{
        ALLOCATED, GpuGrant, needs_admission, parse, parts, read,
    };
}
pub use types::{
    AllocatedDevice, Allocation, DeviceRef, FacetSource, ForeignCdiDevice, Intake, Origin,
};

use container_dialects::Part;
use devices::{Resolved, describe};
use input::Inputs;

pub(crate) use crate::text::short;

/// Annotation keys the dialects read (gpufence's own, CDI's, the schedulers' pod annotations:
/// HAMi's allocation and MIG reservations, gpushare's extender annotations and GPU count, KAI's
/// NvFractions, Koordinator's device allocation, Volcano's vGPU ids), passed into the OCI spec by
/// containerd's `pod_annotations` / `container_annotations` allow-lists.
pub const ANNOTATION_ALLOW_LIST: [&str; 9] = [
    "gpufence.dev/*",
    "cdi.k8s.io/*",
    "aliyun.com/gpu-count",
    "hami.io/vgpu-devices-allocated",
    "ALIYUN_COM_GPU_MEM_*",
    "nvidia.com/container.*",
    "scheduling.koordinator.sh/device-allocated",
    "volcano.sh/vgpu-ids-new",
    "hami.io/vgpu-mig-allocations",
];

/// Default driver capabilities.
pub const DEFAULT_CAPABILITIES: [Capability; 2] = [Capability::Compute, Capability::Utility];

/// Read the allocation from the request parsed at the front door ([`Inputs`]) and what kubelet
/// recorded for the container (loaded at the edge, [`crate::allocation::record::load`]). Pure.
///
/// Each enabled dialect is read into a [`Part`] (env-borne ones from the env kubelet vouches for,
/// [`kubelet_env::view`]); the parts must agree facet by facet ([`agree`]); then untrusted env
/// is neutralised and the normalised [`Allocation`] assembled.
pub fn read_request(
    request: &Inputs,
    inventory: &crate::inventory::Inventory,
    config: &crate::config::Config,
    cdi_specs: &[crate::cdi::LoadedSpec],
    kubelet: &crate::kubelet::KubeletSource,
) -> Result<Intake, AllocationError> {
    let mut intake = Intake::default();
    let mut raw = request.clone();
    let dropped = libpod::drop_untrusted(
        &mut raw.annotations,
        config.allocation.trust_libpod_annotations,
    );
    let koordinator = koordinator::parts(&mut raw, inventory, config)?;
    let view = kubelet_env::view(raw, config, kubelet, &mut intake)?;
    let (inputs, config) = (&view.inputs, &view.config);
    let ac = &config.allocation;
    let record = view.report.as_ref().and_then(|r| r.record.as_ref());
    let env_origin = if view.from_kubelet {
        Origin::Kubelet
    } else {
        Origin::Env
    };
    let (mut parts, mut origins) =
        read_parts(inputs, inventory, config, cdi_specs, env_origin, record)?;
    for (p, o) in koordinator {
        parts.push(p);
        origins.push(o);
    }
    gpushare_needs_kubelet(&view, &parts)?;
    let subject = backing::Subject {
        mode: ac.trust_annotations,
        cri: backing::is_cri(inputs),
        source: kubelet,
        inventory,
    };
    // Grants that arrive as devices (`linux.devices`): always read.
    let borne = spec_devices::read(inputs, inventory);
    spec_devices::policy(
        &subject,
        inputs,
        &borne,
        ac.non_cri_devices,
        &mut intake.notes,
    )?;
    if !borne.devices.is_empty() {
        parts.push(spec_devices::part(&borne));
        origins.push(Origin::Device);
    }
    let devices = agree::devices(&parts)?;
    let mut foreign: Vec<ForeignCdiDevice> = parts.iter().flat_map(|p| p.foreign.clone()).collect();
    let recorded = backing::recorded(&subject, cdi_specs);
    let backings = backing::check(&subject, recorded.as_ref(), &devices, &foreign, |g| {
        granted_by(inputs, &parts, &origins, g)
    })?;
    for (f, b) in foreign.iter_mut().zip(&backings.foreign) {
        f.backing = b.clone();
    }
    spec_devices::check_rest(&subject, recorded.as_ref(), &borne, devices.len())?;
    // Limits: gpufence annotations apply to the combined list.
    if ac.enabled(Dialect::Gpufence) {
        parts.push(container_dialects::gpufence_limits(inputs, &devices)?);
        origins.push(Origin::Annotation);
    }
    let mut memory = agree::per_device(&parts, &devices, |p| p.memory.as_ref())?;
    let mut cores = agree::per_device(&parts, &devices, |p| p.cores.as_ref())?;
    let from_plugin = parts
        .iter()
        .any(|p| p.dialect == Dialect::Nvidia && p.devices.is_some());
    let shares = replicas::apply(
        kubelet,
        from_plugin,
        &devices,
        inventory,
        config,
        &mut memory,
        &mut cores,
    )?;
    let dra = dra_limits::apply(recorded.as_ref(), &devices, &mut memory, &mut cores)?;
    let cores_burst = compute::cores_policy(inputs, &devices, &cores)?;
    let cores_burst = replicas::cores_policy(inputs, &shares.shares, cores_burst, config)?;
    let oversubscribe = agree::oversubscribe(&parts)?;
    if !oversubscribe {
        check_memory_fits(&devices, &memory)?;
    }

    if !dropped.is_empty() {
        intake.notes.push(format!(
            "ignored {} of a podman (libpod) container: podman copies image annotations into the \
             container's (allocation.trust-libpod-annotations = false; use CDI --device)",
            dropped.join(", ")
        ));
    }
    let nvd_consumed = parts.iter().any(|p| {
        matches!(
            p.dialect,
            Dialect::Hami | Dialect::Volcano | Dialect::Gpushare
        ) && !p.is_empty()
    }) || ac.honours(Dialect::Nvidia);
    neutralise(
        inputs,
        config,
        nvd_consumed,
        !devices.is_empty(),
        &mut intake,
    );
    kubelet_env::neutralise_unrecorded(&view, !devices.is_empty(), &mut intake);
    if !devices.is_empty() {
        koordinator::neutralise_hami_core(request, &mut intake);
    }
    kubelet_env::refusal(&view, !devices.is_empty() || !foreign.is_empty())?;
    intake.kubelet = view.report.clone();
    if devices.is_empty() && foreign.is_empty() {
        return Ok(intake);
    }
    intake.notes.extend(shares.notes);
    intake.notes.extend(dra.notes);
    let capabilities = capabilities(inputs, config, &mut intake)?;
    intake.allocation = Some(Allocation {
        dialects: dialects_used(&parts),
        devices: devices
            .iter()
            .enumerate()
            .map(|(i, r)| AllocatedDevice {
                device: r.device,
                uuid: r.uuid.clone(),
                memory_limit: memory.get(i).and_then(|m| m.0),
                cores: cores.get(i).and_then(|c| c.0),
                backing: backings.devices.get(i).cloned().unwrap_or_default(),
                replica: shares.shares.get(i).cloned().flatten(),
            })
            .collect(),
        oversubscribe,
        capabilities,
        foreign_cdi: foreign,
        sources: [sources(&parts, &origins), shares.sources, dra.sources].concat(),
        cores_burst,
    });
    Ok(intake)
}

/// gpushare's annotations describe the pod; which container they are for needs kubelet's
/// record. With kubelet expected (`allocation.trust-env = "kubelet"`) but its record unusable,
/// giving the pod's whole share to whichever container is being created (a sidecar too) is a
/// guess: the container is refused. (Without kubelet at all — trust-env false or true, or no
/// kubelet for this container — the annotation applies as a pod annotation does.)
fn gpushare_needs_kubelet(
    view: &kubelet_env::View,
    parts: &[container_dialects::Part],
) -> Result<(), AllocationError> {
    let unavailable = view.report.as_ref().filter(|r| r.status == "unavailable");
    let Some(r) = unavailable else {
        return Ok(());
    };
    let Some(devices) = parts
        .iter()
        .filter(|p| p.dialect == Dialect::Gpushare)
        .find_map(|p| p.devices.as_ref())
    else {
        return Ok(());
    };
    Err(AllocationError::new(
        &devices.key,
        &devices.value,
        format!(
            "describes the pod, and which container it is for needs kubelet's record of this \
             container; kubelet checkpoint {} cannot be used: {}",
            r.checkpoint.as_deref().unwrap_or("-"),
            r.why.as_deref().unwrap_or("-")
        ),
    ))
}

/// The key and value that granted `g`, for a refusal: the first input other than kubelet's own
/// record that names it (an annotation, a mount), else the first that does.
fn granted_by(
    inputs: &Inputs,
    parts: &[Part],
    origins: &[Origin],
    g: backing::Granted,
) -> (String, String) {
    match g {
        backing::Granted::Device(r) => {
            let naming = |p: &&(&Part, &Origin)| {
                p.0.devices
                    .as_ref()
                    .is_some_and(|f| f.values.iter().any(|x| x.device == r.device))
            };
            let both: Vec<(&Part, &Origin)> = parts.iter().zip(origins).collect();
            let found = both
                .iter()
                .filter(naming)
                .find(|(_, o)| **o != Origin::Kubelet)
                .or_else(|| both.iter().find(naming));
            match found.and_then(|(p, _)| p.devices.as_ref()) {
                Some(f) => (f.key.clone(), f.value.clone()),
                None => ("devices".to_string(), r.uuid.clone()),
            }
        }
        backing::Granted::Cdi(name) => inputs
            .annotations
            .iter()
            .find(|(k, v)| k.starts_with(crate::cdi::parse::ANNOTATION_PREFIX) && v.contains(name))
            .map(|(k, v)| (k.clone(), v.clone()))
            .unwrap_or_else(|| {
                (
                    crate::cdi::parse::ANNOTATION_PREFIX.to_string(),
                    name.to_string(),
                )
            }),
    }
}

/// What every enabled (and, for env-borne dialects, trusted) dialect says, each with where it
/// was read from (`env_origin` for the env-borne ones).
fn read_parts(
    inputs: &Inputs,
    inventory: &crate::inventory::Inventory,
    config: &crate::config::Config,
    cdi_specs: &[crate::cdi::LoadedSpec],
    env_origin: Origin,
    record: Option<&crate::kubelet::ContainerRecord>,
) -> Result<(Vec<Part>, Vec<Origin>), AllocationError> {
    let ac = &config.allocation;
    let mut parts: Vec<(Part, Origin)> = Vec::new();
    if ac.enabled(Dialect::Gpufence) {
        parts.push((
            container_dialects::gpufence_devices(inputs, inventory)?,
            Origin::Annotation,
        ));
    }
    if ac.enabled(Dialect::Cdi) {
        parts.push((
            container_dialects::cdi(inputs, inventory, cdi_specs)?,
            Origin::Annotation,
        ));
    }
    if ac.honours(Dialect::Hami) {
        parts.push((container_dialects::hami(inputs, inventory)?, env_origin));
    }
    if ac.honours(Dialect::Gpushare) {
        parts.push((
            container_dialects::gpushare(inputs, inventory, config)?,
            env_origin,
        ));
    }
    if ac.enabled(Dialect::Nvidia) {
        parts.push((
            container_dialects::nvidia(inputs, inventory, ac.honours(Dialect::Nvidia))?,
            env_origin,
        ));
    }
    for p in pod_dialects::read(inputs, inventory, config, record)? {
        parts.push((p, Origin::Annotation));
    }
    Ok(parts.into_iter().unzip())
}

/// Every facet each part expressed, with its origin (a `mounts[…]` facet is a mount).
fn sources(parts: &[Part], origins: &[Origin]) -> Vec<FacetSource> {
    let mut out = Vec::new();
    for (p, o) in parts.iter().zip(origins) {
        let mut push = |facet: &str, key: &str, value: &str| {
            let origin = if key.starts_with("mounts[") {
                Origin::Mount
            } else {
                *o
            };
            out.push(FacetSource {
                facet: facet.to_string(),
                dialect: p.dialect,
                origin,
                key: key.to_string(),
                value: short(value),
            });
        };
        if let Some(f) = &p.devices {
            push("devices", &f.key, &f.value);
        }
        if let Some(f) = &p.memory {
            push("memory", &f.key, &f.value);
        }
        if let Some(f) = &p.cores {
            push("cores", &f.key, &f.value);
        }
        if let Some(f) = &p.oversubscribe {
            push("oversubscribe", &f.key, &f.value);
        }
    }
    out
}

/// A quota larger than its device is refused (unless the container may spill to host memory).
fn check_memory_fits(
    devices: &[Resolved],
    memory: &[(Option<u64>, String, String)],
) -> Result<(), AllocationError> {
    for (r, (m, key, value)) in devices.iter().zip(memory) {
        if let Some(m) = *m
            && m > r.memory_bytes
        {
            return Err(AllocationError::new(
                key,
                value,
                format!(
                    "{} exceeds the memory of {} ({})",
                    crate::quantity::format_bytes(m),
                    describe(&r.device, &r.uuid),
                    crate::quantity::format_bytes(r.memory_bytes)
                ),
            ));
        }
    }
    Ok(())
}

/// The dialects that expressed something, sorted and deduplicated.
fn dialects_used(parts: &[Part]) -> Vec<Dialect> {
    let mut d: Vec<Dialect> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| p.dialect)
        .collect();
    d.sort();
    d.dedup();
    d
}

/// Driver capabilities: `gpufence.dev/capabilities` (trusted annotation), else
/// `NVIDIA_DRIVER_CAPABILITIES` where the nvidia dialect's env is trusted, else
/// `compute,utility`. `all` means every capability.
fn capabilities(
    inputs: &Inputs,
    config: &crate::config::Config,
    intake: &mut Intake,
) -> Result<Vec<Capability>, AllocationError> {
    let ac = &config.allocation;
    let (key, value) = if let Some(v) = inputs
        .annotations
        .get(container_dialects::ANN_CAPABILITIES)
        .filter(|_| ac.enabled(Dialect::Gpufence))
    {
        (container_dialects::ANN_CAPABILITIES, v.as_str())
    } else if ac.honours(Dialect::Nvidia)
        && let Some(v) = inputs.env_var(container_dialects::NVIDIA_DRIVER_CAPABILITIES)?
    {
        (container_dialects::NVIDIA_DRIVER_CAPABILITIES, v)
    } else {
        if let Some(v) = inputs.env_first(container_dialects::NVIDIA_DRIVER_CAPABILITIES) {
            intake.notes.push(format!(
                "ignored untrusted {}={:?} (nvidia env is not trusted); using {}",
                container_dialects::NVIDIA_DRIVER_CAPABILITIES,
                short(v),
                "compute,utility"
            ));
        }
        return Ok(DEFAULT_CAPABILITIES.to_vec());
    };
    parse_capabilities(value).map_err(|why| AllocationError::new(key, value, why))
}

/// `compute,utility`, `all`; empty means the default.
pub fn parse_capabilities(value: &str) -> Result<Vec<Capability>, String> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(DEFAULT_CAPABILITIES.to_vec());
    }
    let mut caps = Vec::new();
    for item in v.split(',').map(str::trim) {
        if item == "all" {
            caps.extend(Capability::ALL);
            continue;
        }
        match Capability::from_name(item) {
            Some(c) => caps.push(c),
            None => {
                return Err(format!(
                    "unknown capability {:?} (known: all, {})",
                    short(item),
                    Capability::ALL.map(|c| c.name()).join(", ")
                ));
            }
        }
    }
    caps.sort();
    caps.dedup();
    Ok(caps)
}

/// Untrusted GPU env: `NVIDIA_VISIBLE_DEVICES` that no trusted dialect consumed becomes `void`
/// (so no other NVIDIA hook or runtime acts on it either), or, when the container is allocated
/// gpufence devices, is left to the plan, which sets it to their UUIDs; other dialects'
/// variables are reported as ignored. Nothing here grants anything.
fn neutralise(
    inputs: &Inputs,
    config: &crate::config::Config,
    nvd_consumed: bool,
    replaced_by_plan: bool,
    intake: &mut Intake,
) {
    let ac = &config.allocation;
    let why = |d: Dialect| {
        if !ac.enabled(d) {
            format!("the {d} dialect is disabled in allocation.dialects")
        } else {
            format!("{d} env is not trusted (allocation.trust-env)")
        }
    };
    // Every occurrence counts: tools differ on which of duplicated keys wins (the toolkit's env
    // map keeps the last), so one asking for devices anywhere is neutralised.
    let nvd: Vec<&str> = inputs
        .env
        .iter()
        .filter(|(k, _)| k == container_dialects::NVIDIA_VISIBLE_DEVICES)
        .map(|(_, v)| v.as_str())
        .collect();
    let asks = |v: &str| !matches!(v.trim(), "" | "void");
    let asking = nvd.iter().copied().find(|v| asks(v));
    if !nvd_consumed && let Some(v) = asking.or(nvd.first().copied()) {
        if replaced_by_plan {
            // The plan sets NVIDIA_VISIBLE_DEVICES to the allocated UUIDs anyway.
            intake.notes.push(format!(
                "ignored {}={:?} (replaced by the allocated devices): {}",
                container_dialects::NVIDIA_VISIBLE_DEVICES,
                short(v),
                why(Dialect::Nvidia)
            ));
        } else if asks(v) {
            intake.env_overrides.push(format!(
                "{}=void",
                container_dialects::NVIDIA_VISIBLE_DEVICES
            ));
            intake.notes.push(format!(
                "neutralised {}={:?} to void: {}",
                container_dialects::NVIDIA_VISIBLE_DEVICES,
                short(v),
                why(Dialect::Nvidia)
            ));
        }
    }
    if !ac.honours(Dialect::Hami) {
        for k in inputs.env_keys(container_dialects::is_hami_key) {
            intake
                .notes
                .push(format!("ignored {k}: {}", why(Dialect::Hami)));
        }
    }
    if !ac.honours(Dialect::Gpushare) {
        for k in inputs.env_keys(|k| k.starts_with(container_dialects::ALIYUN_PREFIX)) {
            intake
                .notes
                .push(format!("ignored {k}: {}", why(Dialect::Gpushare)));
        }
    }
}
