//! Koordinator's `scheduling.koordinator.sh/device-allocated` pod annotation, written by
//! koord-scheduler at bind time (`apis/extension/device_share.go`, `DeviceAllocations`): a JSON
//! object keyed by device type, each a list of `{minor, resources, id?, extension?}`:
//!
//! ```json
//! {"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":50,
//!   "koordinator.sh/gpu-memory-ratio":50,"koordinator.sh/gpu-memory":"8Gi"}}],"rdma":[…]}
//! ```
//!
//! Only `gpu` is read (RDMA, FPGA and other device types are not gpufence's). `minor` is the
//! GPU's device minor (`/dev/nvidia<minor>`), not its NVML index. Memory is `gpu-memory` (a
//! Kubernetes quantity) or, without it, `gpu-memory-ratio` percent of the GPU; a ratio of 100
//! is the whole GPU (no quota). `gpu-core` is the compute percentage (0 or 100: no limit).
//! Quantities are JSON numbers or strings, as `resource.Quantity` accepts them.
//!
//! The annotation describes the pod, and koordlet gives every container of the pod its GPUs
//! (its `GPUEnvInject` hook does not look at container requests): so does this reader.
//! Koordinator's shared GPUs have no device plugin, so kubelet records nothing for them: the
//! grant is believed under `allocation.trust-annotations = "admission"` (the admission policy
//! reserves the key to koord-scheduler), and refused under `"kubelet"` with a line saying so
//! ([`needs_admission`]).

use super::super::container_dialects::{Facet, Part};
use super::super::devices::resolve_list;
use super::super::input::Inputs;
use super::super::{AllocationError, Origin, short};
use crate::config::Dialect;
use crate::inventory::Inventory;

pub const ALLOCATED: &str = "scheduling.koordinator.sh/device-allocated";
/// The device type gpufence reads; the other types of the object (`rdma`, `fpga`, …) are not
/// GPUs.
const GPU_TYPE: &str = "gpu";
/// The GPU resources of one allocation (resource names inside the annotation's JSON).
pub const GPU_CORE: &str = "koordinator.sh/gpu-core";
pub const GPU_MEMORY: &str = "koordinator.sh/gpu-memory";
pub const GPU_MEMORY_RATIO: &str = "koordinator.sh/gpu-memory-ratio";
/// Resource names that may appear beside them and carry no limit (counts of whole or shared
/// GPUs).
const COUNT_RESOURCES: [&str; 3] = [
    "koordinator.sh/gpu",
    "koordinator.sh/gpu.shared",
    "nvidia.com/gpu",
];
/// Fields of one `DeviceAllocation`.
const ENTRY_FIELDS: [&str; 4] = ["minor", "resources", "id", "extension"];
/// Most GPUs one allocation names.
const MAX_GPUS: usize = 64;
/// Longest annotation value read (koord-scheduler's are a few hundred bytes).
const MAX_LEN: usize = 64 * 1024;

/// One GPU of the allocation, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuGrant {
    /// The GPU's device minor.
    pub minor: u32,
    /// `gpu-core`, percent 0–100.
    pub core: Option<u32>,
    /// `gpu-memory`, bytes.
    pub memory: Option<u64>,
    /// `gpu-memory-ratio`, percent 1–100.
    pub memory_ratio: Option<u32>,
}

impl GpuGrant {
    /// The memory quota on a GPU of `total` bytes: `None` for the whole GPU (ratio 100, or
    /// neither resource), else `gpu-memory`, else the ratio's share.
    pub fn quota(&self, total: u64) -> Option<u64> {
        match (self.memory_ratio, self.memory) {
            (Some(r), _) if r >= 100 => None,
            (_, Some(m)) => Some(m),
            (Some(r), None) => {
                Some(u64::try_from(u128::from(total) * u128::from(r) / 100).unwrap_or(u64::MAX))
            }
            (None, None) => None,
        }
    }
    /// The compute limit: `None` for 0 or 100 (no limit), as HAMi-core reads `gpu-core`.
    pub fn cores(&self) -> Option<u8> {
        self.core
            .and_then(|c| u8::try_from(c).ok())
            .filter(|c| (1..100).contains(c))
    }
}

/// The GPUs of the annotation's value, in its order (empty when it names no `gpu`).
pub fn parse(value: &str) -> Result<Vec<GpuGrant>, String> {
    if value.len() > MAX_LEN {
        return Err(format!("longer than {MAX_LEN} bytes"));
    }
    let v: serde_json::Value = serde_json::from_str(value).map_err(|e| format!("not JSON: {e}"))?;
    let serde_json::Value::Object(types) = v else {
        return Err("not a JSON object of device types".to_string());
    };
    let Some(gpus) = types.get(GPU_TYPE) else {
        return Ok(Vec::new());
    };
    let list = match gpus {
        serde_json::Value::Null => return Ok(Vec::new()),
        serde_json::Value::Array(l) => l,
        _ => return Err("\"gpu\" is not a list".to_string()),
    };
    if list.len() > MAX_GPUS {
        return Err(format!("more than {MAX_GPUS} GPUs"));
    }
    let mut out: Vec<GpuGrant> = Vec::with_capacity(list.len());
    for (i, e) in list.iter().enumerate() {
        let g = entry(e).map_err(|why| format!("gpu[{i}]: {why}"))?;
        if out.iter().any(|p| p.minor == g.minor) {
            return Err(format!("gpu[{i}]: minor {} named twice", g.minor));
        }
        out.push(g);
    }
    Ok(out)
}

fn entry(e: &serde_json::Value) -> Result<GpuGrant, String> {
    let serde_json::Value::Object(fields) = e else {
        return Err("not an object".to_string());
    };
    if let Some(k) = fields.keys().find(|k| !ENTRY_FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "unknown field {:?} (known: {})",
            short(k),
            ENTRY_FIELDS.join(", ")
        ));
    }
    let minor = fields
        .get("minor")
        .and_then(serde_json::Value::as_u64)
        .and_then(|m| u32::try_from(m).ok())
        .ok_or("no \"minor\" that is a device minor number")?;
    let mut g = GpuGrant {
        minor,
        core: None,
        memory: None,
        memory_ratio: None,
    };
    let resources = match fields.get("resources") {
        None | Some(serde_json::Value::Null) => return Ok(g),
        Some(serde_json::Value::Object(r)) => r,
        Some(_) => return Err("\"resources\" is not an object".to_string()),
    };
    for (name, q) in resources {
        match name.as_str() {
            GPU_CORE => {
                g.core = Some(percent(q, 0).map_err(|why| format!("{GPU_CORE}: {why}"))?);
            }
            GPU_MEMORY_RATIO => {
                g.memory_ratio =
                    Some(percent(q, 1).map_err(|why| format!("{GPU_MEMORY_RATIO}: {why}"))?);
            }
            GPU_MEMORY => {
                let s = quantity_text(q).ok_or(format!("{GPU_MEMORY}: not a quantity"))?;
                let b = crate::quantity::parse_k8s_bytes(&s)
                    .map_err(|e| format!("{GPU_MEMORY}: {e}"))?;
                if b == 0 {
                    return Err(format!("{GPU_MEMORY}: a memory quota of 0"));
                }
                g.memory = Some(b);
            }
            n if COUNT_RESOURCES.contains(&n) => {}
            n => {
                // A limit gpufence does not know must not be dropped silently.
                return Err(format!(
                    "unknown GPU resource {:?} (known: {GPU_CORE}, {GPU_MEMORY}, \
                     {GPU_MEMORY_RATIO})",
                    short(n)
                ));
            }
        }
    }
    Ok(g)
}

/// A quantity as text: a JSON string, or a JSON number (`resource.Quantity` takes both).
fn quantity_text(q: &serde_json::Value) -> Option<String> {
    match q {
        serde_json::Value::String(s) => Some(s.trim().to_string()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A whole percentage `min`–100.
fn percent(q: &serde_json::Value, min: u32) -> Result<u32, String> {
    let s = quantity_text(q).ok_or("not a quantity")?;
    super::number::parse_uint(&s)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| (min..=100).contains(n))
        .ok_or_else(|| format!("{:?} is not a whole percentage {min}–100", short(&s)))
}

/// The GPU whose device minor is `minor`, as a device token (its index).
fn index_of_minor(inv: &Inventory, minor: u32) -> Option<String> {
    inv.gpus
        .iter()
        .find(|g| g.minor == minor)
        .map(|g| g.index.to_string())
}

/// The Koordinator part of this container: its GPUs, memory and compute.
pub fn read(inputs: &Inputs, inv: &Inventory) -> Result<Part, AllocationError> {
    let mut part = Part::new(Dialect::Koordinator);
    let Some(v) = inputs.annotations.get(ALLOCATED) else {
        return Ok(part);
    };
    let err = |why: String| AllocationError::new(ALLOCATED, v, why);
    let grants = parse(v).map_err(err)?;
    if grants.is_empty() {
        return Ok(part);
    }
    let toks: Vec<String> = grants
        .iter()
        .map(|g| index_of_minor(inv, g.minor).ok_or(g.minor))
        .collect::<Result<_, u32>>()
        .map_err(|m| {
            err(format!(
                "no GPU with device minor {m} (/dev/nvidia{m}) on this node"
            ))
        })?;
    let toks: Vec<&str> = toks.iter().map(String::as_str).collect();
    let devs = resolve_list(ALLOCATED, v, &toks, inv)?;
    let memory: Vec<Option<u64>> = grants
        .iter()
        .zip(&devs)
        .map(|(g, r)| g.quota(r.memory_bytes))
        .collect();
    if memory.iter().any(Option::is_some) {
        part.memory = Some(Facet::new(memory, ALLOCATED, v));
    }
    let cores: Vec<Option<u8>> = grants.iter().map(GpuGrant::cores).collect();
    if cores.iter().any(Option::is_some) {
        part.cores = Some(Facet::new(cores, ALLOCATED, v));
    }
    part.devices = Some(Facet::new(devs, ALLOCATED, v));
    Ok(part)
}

/// The annotation's part (where the dialect is enabled) and, where it names GPUs, koordlet's
/// env beside it: taken out of `inputs` (the env dialects do not read it) and read as a part of
/// its own, which must agree. Each with its origin.
pub fn parts(
    inputs: &mut Inputs,
    inv: &Inventory,
    config: &crate::config::Config,
) -> Result<Vec<(Part, Origin)>, AllocationError> {
    if !config.allocation.enabled(Dialect::Koordinator) {
        return Ok(Vec::new());
    }
    let part = read(inputs, inv)?;
    if part.devices.is_none() {
        return Ok(vec![(part, Origin::Annotation)]);
    }
    let env = super::super::container_dialects::koordlet_env::take(inputs, inv)?;
    let mut out = vec![(part, Origin::Annotation)];
    if !env.is_empty() {
        out.push((env, Origin::Env));
    }
    Ok(out)
}

/// What a refusal under `"kubelet"` adds for a GPU granted by Koordinator's annotation: kubelet
/// records nothing for Koordinator's shared GPUs (they have no device plugin), so its pods need
/// the admission policy.
pub fn needs_admission() -> String {
    format!(
        "Koordinator's GPUs have no device plugin, so kubelet records none of them: \
         Koordinator needs allocation.trust-annotations = {} with admission-policy.yaml \
         applied (koord-scheduler's account listed)",
        crate::config::TrustAnnotations::Admission.as_toml()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_koord_schedulers_forms() {
        let g = parse(
            r#"{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":50,
            "koordinator.sh/gpu-memory-ratio":10,"koordinator.sh/gpu-memory":"8Gi"}}],
            "rdma":[{"minor":0,"id":"0000:09:00.0","resources":{"koordinator.sh/rdma":100}}]}"#,
        )
        .unwrap();
        assert_eq!(
            g,
            [GpuGrant {
                minor: 1,
                core: Some(50),
                memory: Some(8 << 30),
                memory_ratio: Some(10),
            }]
        );
        assert_eq!(g[0].quota(16 << 30), Some(8 << 30));
        assert_eq!(g[0].cores(), Some(50));
        // Quantities as strings (resource.Quantity's own JSON), whole GPUs, no gpu at all.
        let whole = parse(
            r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100",
            "koordinator.sh/gpu-memory-ratio":"100","koordinator.sh/gpu-memory":"16Gi"}},
            {"minor":3,"resources":{"koordinator.sh/gpu-core":"100",
            "koordinator.sh/gpu-memory-ratio":"100","koordinator.sh/gpu-memory":"16Gi"}}]}"#,
        )
        .unwrap();
        assert_eq!(whole.len(), 2);
        assert_eq!((whole[1].quota(16 << 30), whole[1].cores()), (None, None));
        assert!(parse(r#"{"rdma":[]}"#).unwrap().is_empty());
        assert!(parse(r#"{"gpu":null}"#).unwrap().is_empty());
        // The ratio alone is a share of the GPU.
        let r =
            parse(r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory-ratio":25}}]}"#)
                .unwrap();
        assert_eq!(r[0].quota(16 << 30), Some(4 << 30));
    }

    #[test]
    fn refuses_what_it_cannot_read_exactly() {
        for bad in [
            "",
            "[]",
            r#"{"gpu":{}}"#,
            r#"{"gpu":[1]}"#,
            r#"{"gpu":[{"resources":{}}]}"#,
            r#"{"gpu":[{"minor":-1}]}"#,
            r#"{"gpu":[{"minor":1.5}]}"#,
            r#"{"gpu":[{"minor":0},{"minor":0}]}"#,
            r#"{"gpu":[{"minor":0,"bogus":1}]}"#,
            r#"{"gpu":[{"minor":0,"resources":[]}]}"#,
            r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":101}}]}"#,
            r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":-5}}]}"#,
            r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory-ratio":0}}]}"#,
            r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"0"}}]}"#,
            r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"lots"}}]}"#,
            r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memroy":"8Gi"}}]}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let many = format!(
            r#"{{"gpu":[{}]}}"#,
            (0..65)
                .map(|i| format!(r#"{{"minor":{i}}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert!(parse(&many).unwrap_err().contains("more than 64"));
    }
}
