//! Device lists: `N`, `GPU-<uuid>`, `MIG-<uuid>`, `N:M`, `all`, resolved against the inventory
//! and validated as a whole (unknown, duplicates, MIG with its parent, `all` mixed with others,
//! MIG on a GPU whose MIG mode is disabled).

use super::{AllocationError, DeviceRef};
use crate::inventory::Inventory;
use crate::text::short;

/// A device resolved against the inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub device: DeviceRef,
    pub uuid: String,
    /// The device's memory (whole GPU or MIG slice).
    pub memory_bytes: u64,
}

/// Every device `all` stands for: GPUs with MIG disabled as whole GPUs, GPUs with MIG enabled
/// as their MIG devices (what CUDA enumerates on the host), by index.
pub fn all_devices(inv: &Inventory) -> Vec<Resolved> {
    let mut gpus: Vec<_> = inv.gpus.iter().collect();
    gpus.sort_by_key(|g| g.index);
    let mut out = Vec::new();
    for g in gpus {
        if g.mig_enabled && !g.mig_devices.is_empty() {
            let mut migs: Vec<_> = g.mig_devices.iter().collect();
            migs.sort_by_key(|m| m.index);
            for m in migs {
                out.push(Resolved {
                    device: DeviceRef::Mig {
                        gpu: g.index,
                        mig: m.index,
                    },
                    uuid: m.uuid.clone(),
                    memory_bytes: m.memory_bytes,
                });
            }
        } else {
            out.push(Resolved {
                device: DeviceRef::Gpu { index: g.index },
                uuid: g.uuid.clone(),
                memory_bytes: g.memory_bytes,
            });
        }
    }
    out
}

fn parse_index(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 9 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Resolve one token (not `all`).
pub fn resolve_token(tok: &str, inv: &Inventory) -> Result<Resolved, String> {
    if let Some(i) = parse_index(tok) {
        let g = inv
            .gpu_by_index(i)
            .ok_or_else(|| format!("no GPU with index {i} on this node"))?;
        return Ok(Resolved {
            device: DeviceRef::Gpu { index: g.index },
            uuid: g.uuid.clone(),
            memory_bytes: g.memory_bytes,
        });
    }
    if let Some((a, b)) = tok.split_once(':') {
        let (Some(gi), Some(mi)) = (parse_index(a), parse_index(b)) else {
            return Err(format!(
                "{tok:?} is not a device (expected N, N:M, GPU-…, MIG-… or all)"
            ));
        };
        let g = inv
            .gpu_by_index(gi)
            .ok_or_else(|| format!("no GPU with index {gi} on this node"))?;
        if !g.mig_enabled {
            return Err(format!(
                "GPU {gi} has MIG disabled, so it has no MIG device {mi}"
            ));
        }
        let m = g
            .mig_devices
            .iter()
            .find(|m| m.index == mi)
            .ok_or_else(|| format!("GPU {gi} has no MIG device {mi}"))?;
        return Ok(Resolved {
            device: DeviceRef::Mig {
                gpu: g.index,
                mig: m.index,
            },
            uuid: m.uuid.clone(),
            memory_bytes: m.memory_bytes,
        });
    }
    if tok.len() > 4 && tok.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("GPU-")) {
        let g = inv
            .gpu_by_uuid(tok)
            .ok_or_else(|| format!("no GPU with UUID {} on this node", short(tok)))?;
        return Ok(Resolved {
            device: DeviceRef::Gpu { index: g.index },
            uuid: g.uuid.clone(),
            memory_bytes: g.memory_bytes,
        });
    }
    if tok.len() > 4 && tok.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("MIG-")) {
        let (g, m) = inv
            .mig_by_uuid(tok)
            .ok_or_else(|| format!("no MIG device with UUID {} on this node", short(tok)))?;
        if !g.mig_enabled {
            return Err(format!("GPU {} has MIG disabled", g.index));
        }
        return Ok(Resolved {
            device: DeviceRef::Mig {
                gpu: g.index,
                mig: m.index,
            },
            uuid: m.uuid.clone(),
            memory_bytes: m.memory_bytes,
        });
    }
    Err(format!(
        "{:?} is not a device (expected N, N:M, GPU-…, MIG-… or all)",
        short(tok)
    ))
}

/// Resolve a whole list of tokens, which all came from `key`=`value`. `tokens` are already
/// split and trimmed.
pub fn resolve_list(
    key: &str,
    value: &str,
    tokens: &[&str],
    inv: &Inventory,
) -> Result<Vec<Resolved>, AllocationError> {
    let err = |why: String| AllocationError::new(key, value, why);
    if tokens.len() > MAX_LIST_ITEMS {
        return Err(err(format!("more than {MAX_LIST_ITEMS} devices")));
    }
    if tokens.is_empty() || tokens.iter().any(|t| t.is_empty()) {
        return Err(err("empty device in the list".to_string()));
    }
    if tokens.iter().any(|t| t.eq_ignore_ascii_case("all")) {
        if tokens.len() > 1 {
            return Err(err(
                "\"all\" cannot be combined with other devices".to_string()
            ));
        }
        let all = all_devices(inv);
        if all.is_empty() {
            return Err(err("\"all\" but this node has no GPU".to_string()));
        }
        return Ok(all);
    }
    let mut out: Vec<Resolved> = Vec::with_capacity(tokens.len());
    for t in tokens {
        let r = resolve_token(t, inv).map_err(&err)?;
        if let Some(prev) = out.iter().find(|p| p.device == r.device) {
            return Err(err(format!(
                "{t} names {} twice",
                describe(&prev.device, &prev.uuid)
            )));
        }
        out.push(r);
    }
    for r in &out {
        if let DeviceRef::Mig { gpu, .. } = r.device
            && out
                .iter()
                .any(|p| p.device == DeviceRef::Gpu { index: gpu })
        {
            return Err(err(format!(
                "MIG device {} together with its parent GPU {gpu}",
                describe(&r.device, &r.uuid)
            )));
        }
    }
    Ok(out)
}

/// `GPU 0 (GPU-…)` / `MIG 0:1 (MIG-…)`.
pub fn describe(d: &DeviceRef, uuid: &str) -> String {
    match d {
        DeviceRef::Gpu { index } => format!("GPU {index} ({uuid})"),
        DeviceRef::Mig { gpu, mig } => format!("MIG {gpu}:{mig} ({uuid})"),
    }
}

/// Most items read from one comma list; a longer list is refused without reading the rest.
pub const MAX_LIST_ITEMS: usize = 1024;

/// Split a comma list, trimming blanks around items. At most [`MAX_LIST_ITEMS`] + 1 items are
/// returned (callers refuse a list that long), so a huge value costs nothing.
pub fn split_list(value: &str) -> Vec<&str> {
    value
        .split(',')
        .take(MAX_LIST_ITEMS + 1)
        .map(str::trim)
        .collect()
}
