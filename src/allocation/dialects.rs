//! One reader per dialect. Each turns its inputs into a [`Part`]: the facets of the allocation
//! it expresses (devices, memory, cores, oversubscription), each with the key and value it came
//! from so that a disagreement between dialects names both.

use super::devices::{Resolved, resolve_list, split_list};
use super::input::Inputs;
use super::{AllocationError, ForeignCdiDevice};
use crate::cdi::parse::{self, QualifiedName};
use crate::cdi::{ContainerEdits, LoadedSpec};
use crate::config::{Config, Dialect, MemoryUnit};
use crate::inventory::Inventory;

/// One facet with its source.
#[derive(Debug, Clone, PartialEq)]
pub struct Facet<T> {
    pub values: T,
    pub key: String,
    pub value: String,
}

impl<T> Facet<T> {
    pub fn new(values: T, key: &str, value: &str) -> Self {
        Facet {
            values,
            key: key.to_string(),
            value: value.to_string(),
        }
    }
}

/// What one dialect says about the container.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub dialect: Dialect,
    /// gpufence devices (GPUs and MIG devices of this node), in the dialect's order.
    pub devices: Option<Facet<Vec<Resolved>>>,
    /// Per device (aligned with `devices`); `None` entries = no limit.
    pub memory: Option<Facet<Vec<Option<u64>>>>,
    pub cores: Option<Facet<Vec<Option<u8>>>>,
    pub oversubscribe: Option<Facet<bool>>,
    /// Devices of other CDI kinds.
    pub foreign: Vec<ForeignCdiDevice>,
}

impl Part {
    fn new(dialect: Dialect) -> Part {
        Part {
            dialect,
            devices: None,
            memory: None,
            cores: None,
            oversubscribe: None,
            foreign: Vec::new(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.devices.is_none()
            && self.memory.is_none()
            && self.cores.is_none()
            && self.oversubscribe.is_none()
            && self.foreign.is_empty()
    }
}

// ---------------------------------------------------------------------------------------------
// gpufence.dev/* annotations

pub const ANN_DEVICES: &str = "gpufence.dev/devices";
pub const ANN_MEMORY: &str = "gpufence.dev/memory";
pub const ANN_CORES: &str = "gpufence.dev/cores";
pub const ANN_OVERSUBSCRIBE: &str = "gpufence.dev/oversubscribe";
/// `hard` (default) or `burst`: see `allocation::compute`.
pub const ANN_CORES_POLICY: &str = "gpufence.dev/cores-policy";
/// Extension: driver capabilities (`NVIDIA_DRIVER_CAPABILITIES` syntax) as a trusted annotation.
pub const ANN_CAPABILITIES: &str = "gpufence.dev/capabilities";
/// Every `gpufence.dev/*` annotation gpufence knows; any other key under the prefix is refused,
/// so that a typo (`gpufence.dev/memroy`) never silently drops a limit.
pub const KNOWN_ANNOTATIONS: [&str; 6] = [
    ANN_DEVICES,
    ANN_MEMORY,
    ANN_CORES,
    ANN_CORES_POLICY,
    ANN_OVERSUBSCRIBE,
    ANN_CAPABILITIES,
];
pub const ANN_PREFIX: &str = "gpufence.dev/";

/// The devices of `gpufence.dev/devices` (limits are applied later, against the combined
/// device list, so they also apply to devices another dialect names).
pub fn gpufence_devices(inputs: &Inputs, inv: &Inventory) -> Result<Part, AllocationError> {
    for k in inputs.annotations.keys() {
        if k.starts_with(ANN_PREFIX) && !KNOWN_ANNOTATIONS.contains(&k.as_str()) {
            return Err(AllocationError::new(
                k,
                &inputs.annotations[k],
                format!(
                    "unknown gpufence annotation (known: {})",
                    KNOWN_ANNOTATIONS.join(", ")
                ),
            ));
        }
    }
    let mut part = Part::new(Dialect::Gpufence);
    if let Some(v) = inputs.annotations.get(ANN_DEVICES) {
        let devs = resolve_list(ANN_DEVICES, v, &split_list(v), inv)?;
        part.devices = Some(Facet::new(devs, ANN_DEVICES, v));
    }
    Ok(part)
}

/// `gpufence.dev/memory`, `cores`, `oversubscribe` applied to the final device list.
pub fn gpufence_limits(inputs: &Inputs, devices: &[Resolved]) -> Result<Part, AllocationError> {
    let mut part = Part::new(Dialect::Gpufence);
    let n = devices.len();
    let per_device = |key: &str, v: &str| -> Result<Vec<String>, AllocationError> {
        let items = split_list(v);
        if n == 0 {
            return Err(AllocationError::new(
                key,
                v,
                "no device is allocated to this container (set gpufence.dev/devices)",
            ));
        }
        match items.len() {
            1 => Ok(vec![items[0].to_string(); n]),
            l if l == n => Ok(items.iter().map(|s| s.to_string()).collect()),
            l if l > super::devices::MAX_LIST_ITEMS => Err(AllocationError::new(
                key,
                v,
                format!("too many values for {n} devices"),
            )),
            l => Err(AllocationError::new(
                key,
                v,
                format!("{l} values for {n} devices (give one value, or one per device)"),
            )),
        }
    };
    if let Some(v) = inputs.annotations.get(ANN_MEMORY) {
        let mut out = Vec::with_capacity(n);
        for item in per_device(ANN_MEMORY, v)? {
            let b = crate::quantity::parse_k8s_bytes(&item).map_err(|e| {
                AllocationError::new(
                    ANN_MEMORY,
                    v,
                    format!("{:?}: {e}", crate::allocation::short(&item)),
                )
            })?;
            if b == 0 {
                return Err(AllocationError::new(ANN_MEMORY, v, "a memory quota of 0"));
            }
            out.push(Some(b));
        }
        part.memory = Some(Facet::new(out, ANN_MEMORY, v));
    }
    if let Some(v) = inputs.annotations.get(ANN_CORES) {
        let mut out = Vec::with_capacity(n);
        for item in per_device(ANN_CORES, v)? {
            let c = parse_percent(&item).ok_or_else(|| {
                AllocationError::new(
                    ANN_CORES,
                    v,
                    format!(
                        "{:?} is not a percentage 1–100",
                        crate::allocation::short(&item)
                    ),
                )
            })?;
            out.push(Some(c));
        }
        part.cores = Some(Facet::new(out, ANN_CORES, v));
    }
    if let Some(v) = inputs.annotations.get(ANN_OVERSUBSCRIBE) {
        let b = match v.trim() {
            "true" => true,
            "false" => false,
            _ => {
                return Err(AllocationError::new(
                    ANN_OVERSUBSCRIBE,
                    v,
                    "expected true or false",
                ));
            }
        };
        part.oversubscribe = Some(Facet::new(b, ANN_OVERSUBSCRIBE, v));
    }
    Ok(part)
}

fn parse_percent(s: &str) -> Option<u8> {
    let s = s.trim();
    if s.is_empty() || s.len() > 3 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: u8 = s.parse().ok()?;
    (1..=100).contains(&v).then_some(v)
}

// ---------------------------------------------------------------------------------------------
// cdi.k8s.io/* annotations

/// `cdi.k8s.io/*`: names of kind `gpufence.dev/gpu` resolve against the inventory, other kinds
/// against the loaded specs. Annotations are read in key order, names in value order.
pub fn cdi(
    inputs: &Inputs,
    inv: &Inventory,
    specs: &[LoadedSpec],
) -> Result<Part, AllocationError> {
    let mut part = Part::new(Dialect::Cdi);
    let mut gpu_tokens: Vec<(String, String, String)> = Vec::new(); // (name, key, value)
    for (key, value) in &inputs.annotations {
        if !key.starts_with(parse::ANNOTATION_PREFIX) {
            continue;
        }
        parse::validate_annotation_key(key)
            .map_err(|e| AllocationError::new(key, value, e.to_string()))?;
        let names: Vec<QualifiedName> = parse::parse_annotation_value(value)
            .map_err(|e| AllocationError::new(key, value, e.to_string()))?;
        for q in names {
            if q.kind() == crate::cdi::KIND {
                gpu_tokens.push((q.name.clone(), key.clone(), value.clone()));
                continue;
            }
            let full = q.to_string();
            if part.foreign.iter().any(|f| f.name == full) {
                continue;
            }
            let (spec, dev) = match parse::find_device(specs, &q) {
                Ok(Some(found)) => found,
                Ok(None) => {
                    return Err(AllocationError::new(
                        key,
                        value,
                        format!("no CDI spec in the CDI directories defines {full}"),
                    ));
                }
                Err((a, b)) => {
                    return Err(AllocationError::new(
                        key,
                        value,
                        format!("{full} is defined by both {a} and {b} at the same priority"),
                    ));
                }
            };
            let mut edits: ContainerEdits = dev.container_edits.clone();
            edits.append(&spec.spec.container_edits);
            parse::validate_edits(&edits).map_err(|e| {
                AllocationError::new(key, value, format!("{full} ({}): {e}", spec.path.display()))
            })?;
            part.foreign.push(ForeignCdiDevice {
                name: full,
                spec_path: spec.path.display().to_string(),
                edits,
            });
        }
    }
    if !gpu_tokens.is_empty() {
        // Validate the gpufence devices as one list; errors name the first annotation involved.
        let key = gpu_tokens[0].1.clone();
        let value = if gpu_tokens.iter().all(|t| t.1 == key) {
            gpu_tokens[0].2.clone()
        } else {
            gpu_tokens
                .iter()
                .map(|t| format!("{}={}", crate::cdi::KIND, t.0))
                .collect::<Vec<_>>()
                .join(",")
        };
        let toks: Vec<&str> = gpu_tokens.iter().map(|t| t.0.as_str()).collect();
        let devs = resolve_list(&key, &value, &toks, inv)?;
        part.devices = Some(Facet::new(devs, &key, &value));
    }
    Ok(part)
}

// ---------------------------------------------------------------------------------------------
// NVIDIA device plugin: NVIDIA_VISIBLE_DEVICES and volume mounts

pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
pub const NVIDIA_DRIVER_CAPABILITIES: &str = "NVIDIA_DRIVER_CAPABILITIES";
/// Where the NVIDIA device plugin's `volume-mounts` strategy mounts one file per device.
pub const NVIDIA_DEVICES_MOUNT_DIR: &str = "/var/run/nvidia-container-devices";
/// gpushare's extender failure marker in `NVIDIA_VISIBLE_DEVICES`.
pub const GPUSHARE_FAILURE_PREFIX: &str = "no-gpu-has-";

/// Values of `NVIDIA_VISIBLE_DEVICES` that request no device.
pub fn nvd_requests_nothing(v: &str) -> bool {
    let v = v.trim();
    v.is_empty() || v == "void" || v == "none"
}

fn failure_marker(v: &str) -> Option<AllocationError> {
    v.trim().starts_with(GPUSHARE_FAILURE_PREFIX).then(|| {
        AllocationError::new(
            NVIDIA_VISIBLE_DEVICES,
            v,
            "the gpushare scheduler extender found no GPU for this container",
        )
    })
}

/// The `volume-mounts` strategy: `/var/run/nvidia-container-devices/<id>` mount destinations
/// whose source is `/dev/null`. Those reach `config.json` from the kubelet (the device plugin's
/// Allocate response), so they are trusted like annotations whenever the nvidia dialect is
/// enabled. An image `VOLUME` there is a mount too, but from a host directory: ignored.
pub fn nvidia(
    inputs: &Inputs,
    inv: &Inventory,
    env_trusted: bool,
) -> Result<Part, AllocationError> {
    let mut part = Part::new(Dialect::Nvidia);
    let prefix = format!("{NVIDIA_DEVICES_MOUNT_DIR}/");
    // Only the device plugin's `/dev/null` mounts count (as in nvidia-container-toolkit): an
    // image `VOLUME` under the directory also becomes a mount, from a host directory.
    let ids: Vec<&str> = inputs
        .mounts
        .iter()
        .filter(|(_, src)| std::path::Path::new(src) == std::path::Path::new("/dev/null"))
        .filter_map(|(d, _)| d.strip_prefix(&prefix))
        .map(|d| d.trim_end_matches('/'))
        .collect();
    if !ids.is_empty() {
        let key = format!("mounts[{NVIDIA_DEVICES_MOUNT_DIR}]");
        let value = ids.join(",");
        if ids.iter().any(|i| i.contains('/')) {
            return Err(AllocationError::new(
                &key,
                &value,
                "nested path under the device directory",
            ));
        }
        let devs = resolve_list(&key, &value, &ids, inv)?;
        part.devices = Some(Facet::new(devs, &key, &value));
    }
    if env_trusted && let Some(v) = inputs.env_var(NVIDIA_VISIBLE_DEVICES)? {
        if let Some(e) = failure_marker(v) {
            return Err(e);
        }
        let t = v.trim();
        if !nvd_requests_nothing(t) && t != NVIDIA_DEVICES_MOUNT_DIR {
            let devs = resolve_list(NVIDIA_VISIBLE_DEVICES, v, &split_list(v), inv)?;
            if let Some(m) = &part.devices {
                let a: Vec<_> = m.values.iter().map(|r| r.device).collect();
                let b: Vec<_> = devs.iter().map(|r| r.device).collect();
                if a != b {
                    return Err(AllocationError::new(
                        NVIDIA_VISIBLE_DEVICES,
                        v,
                        format!("disagrees with the device mounts ({}={})", m.key, m.value),
                    ));
                }
            } else {
                part.devices = Some(Facet::new(devs, NVIDIA_VISIBLE_DEVICES, v));
            }
        }
    }
    Ok(part)
}

// ---------------------------------------------------------------------------------------------
// HAMi: NVIDIA_VISIBLE_DEVICES (UUIDs) + CUDA_DEVICE_MEMORY_LIMIT_<i> + CUDA_DEVICE_SM_LIMIT

pub const HAMI_MEMORY: &str = "CUDA_DEVICE_MEMORY_LIMIT";
pub const HAMI_SM: &str = "CUDA_DEVICE_SM_LIMIT";
pub const HAMI_OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";

/// Is this env key one of HAMi's allocation variables?
pub fn is_hami_key(k: &str) -> bool {
    k == HAMI_MEMORY
        || k == HAMI_SM
        || k == HAMI_OVERSUBSCRIBE
        || k.strip_prefix(HAMI_MEMORY)
            .or_else(|| k.strip_prefix(HAMI_SM))
            .is_some_and(|r| r.starts_with('_'))
}

/// Most devices HAMi-core reads limits for.
const HAMI_MAX_DEVICES: usize = 16;

pub fn hami(inputs: &Inputs, inv: &Inventory) -> Result<Part, AllocationError> {
    let mut part = Part::new(Dialect::Hami);
    let keys: Vec<String> = inputs
        .env_keys(is_hami_key)
        .into_iter()
        .map(str::to_string)
        .collect();
    if keys.is_empty() {
        return Ok(part);
    }
    let nvd = inputs.env_var(NVIDIA_VISIBLE_DEVICES)?;
    let Some(nvd) = nvd.filter(|v| !nvd_requests_nothing(v)) else {
        let k = &keys[0];
        return Err(AllocationError::new(
            k,
            inputs.env_first(k).unwrap_or_default(),
            "HAMi limits without NVIDIA_VISIBLE_DEVICES naming the GPUs",
        ));
    };
    if let Some(e) = failure_marker(nvd) {
        return Err(e);
    }
    let toks = split_list(nvd);
    for t in &toks {
        let is_uuid = t
            .get(..4)
            .is_some_and(|p| p.eq_ignore_ascii_case("GPU-") || p.eq_ignore_ascii_case("MIG-"));
        if !is_uuid {
            return Err(AllocationError::new(
                NVIDIA_VISIBLE_DEVICES,
                nvd,
                format!(
                    "HAMi names devices by UUID, not {:?}",
                    crate::allocation::short(t)
                ),
            ));
        }
    }
    let devs = resolve_list(NVIDIA_VISIBLE_DEVICES, nvd, &toks, inv)?;
    let n = devs.len();
    // Per-device keys must name a device of the list.
    for k in &keys {
        for base in [HAMI_MEMORY, HAMI_SM] {
            if let Some(idx) = k.strip_prefix(base).and_then(|r| r.strip_prefix('_')) {
                let v = inputs.env_first(k).unwrap_or_default();
                let i: usize = idx
                    .parse()
                    .ok()
                    .filter(|_| idx.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| AllocationError::new(k, v, "suffix is not a device ordinal"))?;
                if i >= n || i >= HAMI_MAX_DEVICES {
                    return Err(AllocationError::new(
                        k,
                        v,
                        format!(
                            "device ordinal {i} but NVIDIA_VISIBLE_DEVICES names {n} device(s)"
                        ),
                    ));
                }
            }
        }
    }
    // Memory.
    let fallback_mem = inputs.env_var(HAMI_MEMORY)?;
    let mut memory = Vec::with_capacity(n);
    let mut mem_src: Option<(String, String)> = None;
    for i in 0..n {
        let k = format!("{HAMI_MEMORY}_{i}");
        let (key, v) = match inputs.env_var(&k)? {
            Some(v) => (k, v),
            None => match fallback_mem {
                Some(v) => (HAMI_MEMORY.to_string(), v),
                None => {
                    memory.push(None);
                    continue;
                }
            },
        };
        let b = crate::quantity::parse_hami_bytes(v)
            .map_err(|e| AllocationError::new(&key, v, e.to_string()))?;
        if mem_src.is_none() {
            mem_src = Some((key.clone(), v.to_string()));
        }
        memory.push((b != 0).then_some(b));
    }
    if let Some((k, v)) = mem_src {
        part.memory = Some(Facet::new(memory, &k, &v));
    }
    // Cores.
    let fallback_sm = inputs.env_var(HAMI_SM)?;
    let mut cores = Vec::with_capacity(n);
    let mut sm_src: Option<(String, String)> = None;
    for i in 0..n {
        let k = format!("{HAMI_SM}_{i}");
        let (key, v) = match inputs.env_var(&k)? {
            Some(v) => (k, v),
            None => match fallback_sm {
                Some(v) => (HAMI_SM.to_string(), v),
                None => {
                    cores.push(None);
                    continue;
                }
            },
        };
        let t = v.trim();
        if t.is_empty() || t.len() > 9 || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(AllocationError::new(&key, v, "not a whole percentage"));
        }
        let c: u32 = t
            .parse()
            .map_err(|_| AllocationError::new(&key, v, "not a whole percentage"))?;
        if sm_src.is_none() {
            sm_src = Some((key.clone(), v.to_string()));
        }
        // 0 or ≥ 100 means no limit, as HAMi-core reads it.
        cores.push(u8::try_from(c).ok().filter(|c| (1..100).contains(c)));
    }
    if let Some((k, v)) = sm_src {
        part.cores = Some(Facet::new(cores, &k, &v));
    }
    if let Some(v) = inputs.env_var(HAMI_OVERSUBSCRIBE)? {
        let b = match v.trim() {
            "true" | "1" => true,
            "false" | "0" | "" => false,
            _ => {
                return Err(AllocationError::new(
                    HAMI_OVERSUBSCRIBE,
                    v,
                    "expected true or false",
                ));
            }
        };
        part.oversubscribe = Some(Facet::new(b, HAMI_OVERSUBSCRIBE, v));
    }
    part.devices = Some(Facet::new(devs, NVIDIA_VISIBLE_DEVICES, nvd));
    Ok(part)
}

// ---------------------------------------------------------------------------------------------
// Aliyun gpushare

pub const ALIYUN_IDX: &str = "ALIYUN_COM_GPU_MEM_IDX";
pub const ALIYUN_CONTAINER: &str = "ALIYUN_COM_GPU_MEM_CONTAINER";
pub const ALIYUN_DEV: &str = "ALIYUN_COM_GPU_MEM_DEV";
pub const ALIYUN_PREFIX: &str = "ALIYUN_COM_GPU_MEM_";
/// Multi-GPU sharing: the number of cards a pod's memory is spread over (label or annotation).
pub const ALIYUN_GPU_COUNT: &str = "aliyun.com/gpu-count";

fn parse_uint(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

pub fn gpushare(
    inputs: &Inputs,
    inv: &Inventory,
    config: &Config,
) -> Result<Part, AllocationError> {
    let mut part = Part::new(Dialect::Gpushare);
    if let Some(e) = inputs
        .env
        .iter()
        .filter(|(k, _)| k == NVIDIA_VISIBLE_DEVICES)
        .find_map(|(_, v)| failure_marker(v))
    {
        return Err(e);
    }
    let Some(idx) = inputs.env_var(ALIYUN_IDX)? else {
        if let Some(k) = inputs
            .env_keys(|k| k == ALIYUN_CONTAINER || k == ALIYUN_DEV)
            .first()
        {
            return Err(AllocationError::new(
                *k,
                inputs.env_first(k).unwrap_or_default(),
                format!("gpushare memory without {ALIYUN_IDX}"),
            ));
        }
        return Ok(part);
    };
    if idx.trim() == "-1" {
        return Err(AllocationError::new(
            ALIYUN_IDX,
            idx,
            "the gpushare device plugin found no GPU for this container",
        ));
    }
    let toks = split_list(idx);
    if toks.iter().any(|t| parse_uint(t).is_none()) {
        return Err(AllocationError::new(
            ALIYUN_IDX,
            idx,
            "expected a GPU index or a comma list of indexes",
        ));
    }
    let devs = resolve_list(ALIYUN_IDX, idx, &toks, inv)?;
    let m = devs.len() as u64;
    if let Some(c) = inputs.annotations.get(ALIYUN_GPU_COUNT) {
        let count = parse_uint(c).filter(|c| *c > 0).ok_or_else(|| {
            AllocationError::new(ALIYUN_GPU_COUNT, c, "not a positive whole number")
        })?;
        if count != m {
            return Err(AllocationError::new(
                ALIYUN_GPU_COUNT,
                c,
                format!("{ALIYUN_IDX}={idx:?} names {m} GPU(s)"),
            ));
        }
    }
    let (unit, unit_name) = match config.gpushare.memory_unit {
        MemoryUnit::GiB => (1u64 << 30, "GiB"),
        MemoryUnit::MiB => (1u64 << 20, "MiB"),
    };
    let Some(total_s) = inputs.env_var(ALIYUN_CONTAINER)? else {
        return Err(AllocationError::new(
            ALIYUN_IDX,
            idx,
            format!("{ALIYUN_CONTAINER} (this container's memory) is not set"),
        ));
    };
    let total = parse_uint(total_s).ok_or_else(|| {
        AllocationError::new(
            ALIYUN_CONTAINER,
            total_s,
            format!("not a whole number of {unit_name}"),
        )
    })?;
    if total == 0 {
        return Err(AllocationError::new(
            ALIYUN_CONTAINER,
            total_s,
            "a memory quota of 0",
        ));
    }
    if total % m != 0 {
        return Err(AllocationError::new(
            ALIYUN_CONTAINER,
            total_s,
            format!(
                "{total} {unit_name} over {m} GPUs is not a whole number of {unit_name} per GPU"
            ),
        ));
    }
    let per = total / m;
    if let Some(dev_s) = inputs.env_var(ALIYUN_DEV)? {
        let dev = parse_uint(dev_s).ok_or_else(|| {
            AllocationError::new(
                ALIYUN_DEV,
                dev_s,
                format!("not a whole number of {unit_name}"),
            )
        })?;
        if per > dev {
            return Err(AllocationError::new(
                ALIYUN_CONTAINER,
                total_s,
                format!("{per} {unit_name} per GPU exceeds the GPU size {ALIYUN_DEV}={dev}"),
            ));
        }
    }
    let bytes = per
        .checked_mul(unit)
        .ok_or_else(|| AllocationError::new(ALIYUN_CONTAINER, total_s, "too large"))?;
    part.memory = Some(Facet::new(
        vec![Some(bytes); devs.len()],
        ALIYUN_CONTAINER,
        total_s,
    ));
    part.devices = Some(Facet::new(devs, ALIYUN_IDX, idx));
    Ok(part)
}
