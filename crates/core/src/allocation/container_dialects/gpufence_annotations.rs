//! Gpufence.dev/* annotations.

use super::{Facet, Part};
use crate::allocation::AllocationError;
use crate::allocation::devices::{Resolved, resolve_list, split_list};
use crate::allocation::input::Inputs;
use crate::config::Dialect;
use crate::inventory::Inventory;

pub const ANN_DEVICES: &str = "gpufence.dev/devices";
pub const ANN_MEMORY: &str = "gpufence.dev/memory";
pub const ANN_CORES: &str = "gpufence.dev/cores";
pub const ANN_OVERSUBSCRIBE: &str = "gpufence.dev/oversubscribe";
/// `hard` (default) or `burst`: see `allocation::compute`.
pub const ANN_CORES_POLICY: &str = "gpufence.dev/cores-policy";
/// Extension: driver capabilities (`NVIDIA_DRIVER_CAPABILITIES` syntax) as a trusted annotation.
pub const ANN_CAPABILITIES: &str = "gpufence.dev/capabilities";
/// The allocation's request for MPS sharing (`mps`), read by [`crate::mps`] when it plans.
pub const ANN_SHARING: &str = "gpufence.dev/sharing";
/// Every `gpufence.dev/*` annotation gpufence knows; any other key under the prefix is refused,
/// so that a typo (`gpufence.dev/memroy`) never silently drops a limit.
pub const KNOWN_ANNOTATIONS: [&str; 7] = [
    ANN_DEVICES,
    ANN_MEMORY,
    ANN_CORES,
    ANN_CORES_POLICY,
    ANN_OVERSUBSCRIBE,
    ANN_CAPABILITIES,
    ANN_SHARING,
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
            l if l > crate::allocation::devices::MAX_LIST_ITEMS => Err(AllocationError::new(
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
