//! HAMi: NVIDIA_VISIBLE_DEVICES (UUIDs) + CUDA_DEVICE_MEMORY_LIMIT_<i> + CUDA_DEVICE_SM_LIMIT.

use super::nvidia_env::{NVIDIA_VISIBLE_DEVICES, failure_marker, nvd_requests_nothing};
use super::{Facet, Part};
use crate::allocation::AllocationError;
use crate::allocation::devices::{resolve_list, split_list};
use crate::allocation::input::Inputs;
use crate::config::Dialect;
use crate::inventory::Inventory;

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
