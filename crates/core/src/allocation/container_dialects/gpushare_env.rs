//! Aliyun gpushare.

use super::nvidia_env::{NVIDIA_VISIBLE_DEVICES, failure_marker};
use super::{Facet, Part};
use crate::allocation::AllocationError;
use crate::allocation::devices::{resolve_list, split_list};
use crate::allocation::input::Inputs;
use crate::config::{Config, Dialect, MemoryUnit};
use crate::inventory::Inventory;

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
