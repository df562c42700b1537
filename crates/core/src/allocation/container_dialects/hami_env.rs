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

/// A memory limit as HAMi-core's `get_limit_from_env` reads it: bytes, or `k`/`m`/`g` ×1024ⁿ;
/// empty is 0 (unset). A leading zero is refused: HAMi-core reads `010` as octal.
fn memory_bytes(v: &str) -> Result<u64, String> {
    if v.trim().is_empty() {
        return Ok(0);
    }
    crate::quantity::parse_hami_bytes(v).map_err(|e| e.to_string())
}

/// An SM limit: a whole percentage; empty is 0 (unset).
fn sm_percent(v: &str) -> Result<u64, String> {
    let t = v.trim();
    if t.is_empty() {
        return Ok(0);
    }
    if t.len() > 9 || !t.bytes().all(|b| b.is_ascii_digit()) || (t.len() > 1 && t.starts_with('0'))
    {
        return Err("not a whole percentage".to_string());
    }
    t.parse().map_err(|_| "not a whole percentage".to_string())
}

/// Where a facet was read: (key, value).
type Source = (String, String);

/// Per device `i` of `n`, as HAMi-core's `do_init_device_memory_limits` /
/// `do_init_device_sm_limits` read them: `<base>_<i>` where it is set and not 0, else the
/// unindexed `<base>` (every device of the container), else 0 (none). With the first source
/// read (key, value), `None` when neither is set for any device.
fn per_device(
    inputs: &Inputs,
    base: &str,
    n: usize,
    parse: impl Fn(&str) -> Result<u64, String>,
) -> Result<(Vec<u64>, Option<Source>), AllocationError> {
    let read = |k: &str| -> Result<Option<(u64, String)>, AllocationError> {
        match inputs.env_var(k)? {
            None => Ok(None),
            Some(v) => Ok(Some((
                parse(v).map_err(|why| AllocationError::new(k, v, why))?,
                v.to_string(),
            ))),
        }
    };
    let fallback = read(base)?;
    let mut out = Vec::with_capacity(n);
    let mut src: Option<Source> = None;
    for i in 0..n {
        let k = format!("{base}_{i}");
        let (value, key, raw) = match read(&k)? {
            Some((b, raw)) if b != 0 => (b, k, raw),
            own => match &fallback {
                Some((b, raw)) => (*b, base.to_string(), raw.clone()),
                None => match own {
                    Some((b, raw)) => (b, k, raw),
                    None => {
                        out.push(0);
                        continue;
                    }
                },
            },
        };
        src.get_or_insert((key, raw));
        out.push(value);
    }
    Ok((out, src))
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
    let (memory, mem_src) = per_device(inputs, HAMI_MEMORY, n, memory_bytes)?;
    if let Some((k, v)) = mem_src {
        part.memory = Some(Facet::new(
            memory.iter().map(|b| (*b != 0).then_some(*b)).collect(),
            &k,
            &v,
        ));
    }
    let (cores, sm_src) = per_device(inputs, HAMI_SM, n, sm_percent)?;
    if let Some((k, v)) = sm_src {
        // 0 or ≥ 100 means no limit, as HAMi-core reads it.
        part.cores = Some(Facet::new(
            cores
                .iter()
                .map(|c| u8::try_from(*c).ok().filter(|c| (1..100).contains(c)))
                .collect(),
            &k,
            &v,
        ));
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
