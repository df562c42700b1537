//! KAI scheduler's NvFractions pod annotations, one set per container name:
//! `nvidia.com/container.<name>.gpus.devices` (the GPUs, as `gpufence.dev/devices` names them),
//! `nvidia.com/container.<name>.gpu-memory.limit` (per-GPU hard limit, a Kubernetes quantity),
//! `nvidia.com/container.<name>.gpu-memory.request` (the soft amount; checked against the limit,
//! not enforced), `nvidia.com/container.<name>.gpu-compute.mode` (`time-slicing` or
//! `sm-sharing`; how the GPU's compute is shared, no limit of its own).
//! Annotations of other containers of the pod are ignored; an unknown key for this container is
//! refused (a typo must not drop a limit).

use super::super::container_dialects::{Facet, Part};
use super::super::devices::{resolve_list, split_list};
use super::super::input::Inputs;
use super::super::{AllocationError, short};
use crate::config::Dialect;
use crate::inventory::Inventory;
use crate::kubelet::PodIdentity;

pub const PREFIX: &str = "nvidia.com/container.";
pub const DEVICES: &str = "gpus.devices";
pub const MEMORY_LIMIT: &str = "gpu-memory.limit";
pub const MEMORY_REQUEST: &str = "gpu-memory.request";
pub const COMPUTE_MODE: &str = "gpu-compute.mode";
const KNOWN: [&str; 4] = [DEVICES, MEMORY_LIMIT, MEMORY_REQUEST, COMPUTE_MODE];
const MODES: [&str; 2] = ["time-slicing", "sm-sharing"];

pub fn read(
    inputs: &Inputs,
    inv: &Inventory,
    identity: Option<&PodIdentity>,
) -> Result<Part, AllocationError> {
    let mut part = Part::new(Dialect::Kai);
    let Some(id) = identity else {
        // Without the container's name the annotations cannot be matched: nothing is granted.
        return Ok(part);
    };
    let mine = format!("{PREFIX}{}.", id.container_name);
    let mut got: [Option<(&String, &String)>; 4] = [None; 4];
    for (k, v) in &inputs.annotations {
        let Some(suffix) = k.strip_prefix(&mine) else {
            continue;
        };
        match KNOWN.iter().position(|s| *s == suffix) {
            Some(i) => got[i] = Some((k, v)),
            None => {
                return Err(AllocationError::new(
                    k,
                    v,
                    format!(
                        "unknown KAI annotation for container {} (known: {})",
                        id.container_name,
                        KNOWN.join(", ")
                    ),
                ));
            }
        }
    }
    let [devices, limit, request, mode] = got;
    if let Some((k, v)) = mode
        && !MODES.contains(&v.trim())
    {
        return Err(AllocationError::new(
            k,
            v,
            format!("expected {}", MODES.join(" or ")),
        ));
    }
    let quantity = |(k, v): (&String, &String)| -> Result<u64, AllocationError> {
        let b = crate::quantity::parse_k8s_bytes(v.trim())
            .map_err(|e| AllocationError::new(k, v, e.to_string()))?;
        if b == 0 {
            return Err(AllocationError::new(k, v, "a memory quota of 0"));
        }
        Ok(b)
    };
    let limit_b = limit.map(quantity).transpose()?;
    let request_b = request.map(quantity).transpose()?;
    if let (Some(l), Some(r), Some((k, v))) = (limit_b, request_b, request)
        && r > l
    {
        return Err(AllocationError::new(
            k,
            v,
            format!(
                "request exceeds the limit ({})",
                short(limit.map_or("", |x| x.1))
            ),
        ));
    }
    let Some((dk, dv)) = devices else {
        if let Some((k, v)) = limit.or(request).or(mode) {
            return Err(AllocationError::new(
                k,
                v,
                format!("without {mine}{DEVICES} naming the GPUs"),
            ));
        }
        return Ok(part);
    };
    let devs = resolve_list(dk, dv, &split_list(dv), inv)?;
    if let (Some(b), Some((k, v))) = (limit_b, limit) {
        part.memory = Some(Facet::new(vec![Some(b); devs.len()], k, v));
    }
    part.devices = Some(Facet::new(devs, dk, dv));
    Ok(part)
}
