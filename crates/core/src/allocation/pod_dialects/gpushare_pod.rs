//! The Aliyun gpushare scheduler extender's pod annotations, written at bind time:
//! `ALIYUN_COM_GPU_MEM_IDX` (the GPU index; a comma list for multi-GPU sharing),
//! `ALIYUN_COM_GPU_MEM_POD` (the pod's `aliyun.com/gpu-mem` in the device plugin's unit),
//! `ALIYUN_COM_GPU_MEM_DEV` (the GPU's size in that unit), `ALIYUN_COM_GPU_MEM_ASSIGNED`,
//! `ALIYUN_COM_GPU_MEM_ASSUME_TIME` (ns since the epoch).
//!
//! They describe the pod: with kubelet's record, this container's share is the number of
//! `aliyun.com/gpu-mem` units kubelet allocated to it (one device id per unit), and a container
//! without such an entry gets nothing from them; without the record they apply to the container
//! as a pod annotation does, with the pod's whole amount.

use super::super::AllocationError;
use super::super::container_dialects::{Facet, Part};
use super::super::devices::{resolve_list, split_list};
use super::super::input::Inputs;
use super::number::parse_uint;
use crate::config::{Config, Dialect, MemoryUnit};
use crate::inventory::Inventory;
use crate::kubelet::ContainerRecord;

pub const IDX: &str = "ALIYUN_COM_GPU_MEM_IDX";
pub const POD: &str = "ALIYUN_COM_GPU_MEM_POD";
pub const DEV: &str = "ALIYUN_COM_GPU_MEM_DEV";
pub const ASSIGNED: &str = "ALIYUN_COM_GPU_MEM_ASSIGNED";
pub const ASSUME_TIME: &str = "ALIYUN_COM_GPU_MEM_ASSUME_TIME";
/// The extended resource the gpushare device plugin serves (one device id per memory unit).
pub const RESOURCE: &str = "aliyun.com/gpu-mem";
const KNOWN: [&str; 5] = [IDX, POD, DEV, ASSIGNED, ASSUME_TIME];

/// How errors and sources name an annotation (the env dialect uses the same names).
fn key(k: &str) -> String {
    format!("annotation {k}")
}

pub fn read(
    inputs: &Inputs,
    inv: &Inventory,
    config: &Config,
    record: Option<&ContainerRecord>,
) -> Result<Part, AllocationError> {
    let mut part = Part::new(Dialect::Gpushare);
    let ann = &inputs.annotations;
    for (k, v) in ann.range(super::super::container_dialects::ALIYUN_PREFIX.to_string()..) {
        if !k.starts_with(super::super::container_dialects::ALIYUN_PREFIX) {
            break;
        }
        if !KNOWN.contains(&k.as_str()) {
            return Err(AllocationError::new(
                key(k),
                v,
                format!("unknown gpushare annotation (known: {})", KNOWN.join(", ")),
            ));
        }
    }
    let Some(idx) = ann.get(IDX) else {
        if let Some(p) = ann.get(POD) {
            return Err(AllocationError::new(key(POD), p, format!("without {IDX}")));
        }
        return Ok(part);
    };
    let (unit, unit_name) = match config.gpushare.memory_unit {
        MemoryUnit::GiB => (1u64 << 30, "GiB"),
        MemoryUnit::MiB => (1u64 << 20, "MiB"),
    };
    let whole = |k: &str, v: &str| {
        parse_uint(v.trim()).ok_or_else(|| {
            AllocationError::new(key(k), v, format!("not a whole number of {unit_name}"))
        })
    };
    if idx.trim() == "-1" {
        return Err(AllocationError::new(
            key(IDX),
            idx,
            "the gpushare scheduler extender found no GPU for this pod",
        ));
    }
    let toks = split_list(idx);
    if toks.iter().any(|t| parse_uint(t).is_none()) {
        return Err(AllocationError::new(
            key(IDX),
            idx,
            "expected a GPU index or a comma list of indexes",
        ));
    }
    if let Some(t) = ann.get(ASSUME_TIME)
        && parse_uint(t.trim()).is_none()
    {
        return Err(AllocationError::new(
            key(ASSUME_TIME),
            t,
            "not a time in ns",
        ));
    }
    if let Some(a) = ann.get(ASSIGNED)
        && !matches!(a.trim(), "true" | "false")
    {
        return Err(AllocationError::new(
            key(ASSIGNED),
            a,
            "expected true or false",
        ));
    }
    let Some(pod_s) = ann.get(POD) else {
        return Err(AllocationError::new(
            key(IDX),
            idx,
            format!("{POD} is not set"),
        ));
    };
    let pod = whole(POD, pod_s)?;
    // This container's share: what kubelet allocated to it, else the pod's.
    let (total, total_key, total_value) = match record {
        Some(r) => match r.resources.iter().find(|g| g.resource == RESOURCE) {
            None => return Ok(part),
            Some(g) => {
                let n = g.device_ids.len() as u64;
                if n > pod {
                    return Err(AllocationError::new(
                        key(POD),
                        pod_s,
                        format!(
                            "kubelet allocated {n} {unit_name} of {RESOURCE} to this container, more than the pod's"
                        ),
                    ));
                }
                (
                    n,
                    format!("kubelet {RESOURCE}"),
                    g.device_ids.len().to_string(),
                )
            }
        },
        None => (pod, key(POD), pod_s.clone()),
    };
    let devs = resolve_list(&key(IDX), idx, &toks, inv)?;
    let m = devs.len() as u64;
    if total == 0 || total % m != 0 {
        return Err(AllocationError::new(
            total_key,
            &total_value,
            format!("{total} {unit_name} over {m} GPU(s) is not a positive whole number per GPU"),
        ));
    }
    let per = total / m;
    if let Some(d) = ann.get(DEV)
        && per > whole(DEV, d)?
    {
        return Err(AllocationError::new(
            total_key,
            &total_value,
            format!("{per} {unit_name} per GPU exceeds the GPU size {DEV}={d}"),
        ));
    }
    let bytes = per
        .checked_mul(unit)
        .ok_or_else(|| AllocationError::new(key(POD), pod_s, "too large"))?;
    part.memory = Some(Facet::new(
        vec![Some(bytes); devs.len()],
        &total_key,
        &total_value,
    ));
    part.devices = Some(Facet::new(devs, &key(IDX), idx));
    Ok(part)
}
