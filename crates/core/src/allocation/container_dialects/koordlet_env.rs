//! The env koordlet adds beside Koordinator's annotation (its `GPUEnvInject` runtime hook, run
//! as its own NRI plugin at CreateContainer; `pkg/koordlet/runtimehooks/hooks/gpu/gpu.go`):
//! `NVIDIA_VISIBLE_DEVICES=<minors>` (the annotation's `minor`s, comma-joined), and for pods
//! labelled `koordinator.sh/gpu-isolation-provider: HAMi-core` the unindexed
//! `CUDA_DEVICE_MEMORY_LIMIT=<bytes>` and `CUDA_DEVICE_SM_LIMIT=<gpu-core>` (from the first GPU,
//! applied by HAMi-core to every GPU), `LD_PRELOAD=/usr/local/vgpu/libvgpu.so` and binds of that
//! library and `/tmp/vgpulock`.
//!
//! The env is not what grants (the annotation is): where the annotation names GPUs, koordlet's
//! keys are taken out of what the env dialects read ([`take`]) and must agree with it facet by
//! facet, like any two dialects. HAMi-core's preload must not run beside gpufence's shim:
//! [`without_hami_core`] drops it from `LD_PRELOAD`. [`koordlet_env_agrees`] answers, for one
//! env entry another NRI plugin adds, whether it says what the allocation says (the NRI
//! validator lets such entries pass).

use super::hami_env::{HAMI_MEMORY, HAMI_SM};
use super::nvidia_env::NVIDIA_VISIBLE_DEVICES;
use super::{Facet, Part};
use crate::allocation::input::Inputs;
use crate::allocation::{Allocation, AllocationError, DeviceRef, Intake, short};
use crate::config::{Dialect, is_hami_core_library};
use crate::inventory::Inventory;

/// koordlet's `NVIDIA_VISIBLE_DEVICES`: device minors, comma-joined (`None` when the value is
/// anything else — UUIDs, `all`, `void` are not koordlet's).
fn minors(v: &str) -> Option<Vec<u32>> {
    let toks: Vec<&str> = v.split(',').map(str::trim).collect();
    if toks.is_empty() || toks.len() > 64 {
        return None;
    }
    toks.iter()
        .map(|t| {
            (!t.is_empty() && t.len() <= 9 && t.bytes().all(|b| b.is_ascii_digit()))
                .then(|| t.parse().ok())
                .flatten()
        })
        .collect()
}

/// The unindexed memory limit as HAMi-core reads it (`0` and empty: no limit).
fn memory_limit(v: &str) -> Result<Option<u64>, String> {
    if v.trim().is_empty() {
        return Ok(None);
    }
    let b = crate::quantity::parse_hami_bytes(v).map_err(|e| e.to_string())?;
    Ok((b != 0).then_some(b))
}

/// The unindexed SM limit as HAMi-core reads it (`0`, ≥ 100 and empty: no limit).
fn sm_limit(v: &str) -> Result<Option<u8>, String> {
    let t = v.trim();
    if t.is_empty() {
        return Ok(None);
    }
    if t.len() > 9 || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a whole percentage".to_string());
    }
    let c: u32 = t
        .parse()
        .map_err(|_| "not a whole percentage".to_string())?;
    Ok(u8::try_from(c).ok().filter(|c| (1..100).contains(c)))
}

/// Take koordlet's keys out of `inputs.env` (so the env dialects do not read them as HAMi's or
/// NVIDIA's) and read them as one part, for a container whose Koordinator annotation names
/// GPUs. `NVIDIA_VISIBLE_DEVICES` is koordlet's only when it lists device minors.
pub fn take(inputs: &mut Inputs, inv: &Inventory) -> Result<Part, AllocationError> {
    let mut part = Part::new(Dialect::Koordinator);
    // koordlet's NVIDIA_VISIBLE_DEVICES is the one listing minors (an image's `all` beside it
    // is not koordlet's, and is neutralised as any untrusted one); two lists of minors that
    // differ are refused.
    let mut nvd: Option<(String, Vec<u32>)> = None;
    for (k, v) in &inputs.env {
        if k != NVIDIA_VISIBLE_DEVICES {
            continue;
        }
        let Some(m) = minors(v) else { continue };
        match &nvd {
            Some((prev, _)) if prev != v => {
                return Err(AllocationError::new(
                    k,
                    v,
                    format!("set more than once with different values (also {prev:?})"),
                ));
            }
            _ => nvd = Some((v.clone(), m)),
        }
    }
    let mem = inputs.env_var(HAMI_MEMORY)?.map(str::to_string);
    let sm = inputs.env_var(HAMI_SM)?.map(str::to_string);
    inputs.env.retain(|(k, v)| {
        k != HAMI_MEMORY
            && k != HAMI_SM
            && (k != NVIDIA_VISIBLE_DEVICES || nvd.is_none() || minors(v).is_none())
    });
    let Some((value, minors)) = nvd else {
        if let Some(v) = mem.as_deref().or(sm.as_deref()) {
            let k = if mem.is_some() { HAMI_MEMORY } else { HAMI_SM };
            return Err(AllocationError::new(
                k,
                v,
                "koordlet's HAMi-core limit without its NVIDIA_VISIBLE_DEVICES naming the GPUs' \
                 minors",
            ));
        }
        return Ok(part);
    };
    let mut devs = Vec::with_capacity(minors.len());
    for m in &minors {
        let Some(g) = inv.gpus.iter().find(|g| g.minor == *m) else {
            return Err(AllocationError::new(
                NVIDIA_VISIBLE_DEVICES,
                &value,
                format!("no GPU with device minor {m} on this node (koordlet names GPUs by minor)"),
            ));
        };
        devs.push(g.index.to_string());
    }
    let toks: Vec<&str> = devs.iter().map(String::as_str).collect();
    let devs =
        crate::allocation::devices::resolve_list(NVIDIA_VISIBLE_DEVICES, &value, &toks, inv)?;
    let n = devs.len();
    if let Some(v) = &mem {
        let b = memory_limit(v).map_err(|why| AllocationError::new(HAMI_MEMORY, v, why))?;
        part.memory = b.map(|b| Facet::new(vec![Some(b); n], HAMI_MEMORY, v));
    }
    if let Some(v) = &sm {
        let c = sm_limit(v).map_err(|why| AllocationError::new(HAMI_SM, v, why))?;
        part.cores = c.map(|c| Facet::new(vec![Some(c); n], HAMI_SM, v));
    }
    part.devices = Some(Facet::new(devs, NVIDIA_VISIBLE_DEVICES, &value));
    Ok(part)
}

/// Whether one env entry another NRI plugin adds (koordlet's) says what the allocation says:
/// `NVIDIA_VISIBLE_DEVICES` listing exactly the minors of the allocated GPUs, the unindexed
/// `CUDA_DEVICE_MEMORY_LIMIT` equal to every device's quota (0: none has one),
/// `CUDA_DEVICE_SM_LIMIT` equal to every device's compute limit (0 or ≥ 100: none has one).
/// Anything else (an `LD_PRELOAD`, another key, a malformed value) does not agree.
pub fn koordlet_env_agrees(alloc: &Allocation, inv: &Inventory, key: &str, value: &str) -> bool {
    match key {
        NVIDIA_VISIBLE_DEVICES => {
            let Some(mut got) = minors(value) else {
                return false;
            };
            let want: Option<Vec<u32>> = alloc
                .devices
                .iter()
                .map(|d| match d.device {
                    DeviceRef::Gpu { index } => inv.gpu_by_index(index).map(|g| g.minor),
                    DeviceRef::Mig { .. } => None,
                })
                .collect();
            let Some(mut want) = want else {
                return false;
            };
            got.sort_unstable();
            want.sort_unstable();
            !want.is_empty() && got == want
        }
        HAMI_MEMORY => {
            memory_limit(value).is_ok_and(|b| alloc.devices.iter().all(|d| d.memory_limit == b))
        }
        HAMI_SM => sm_limit(value).is_ok_and(|c| alloc.devices.iter().all(|d| d.cores == c)),
        _ => false,
    }
}

/// The pod label koordlet reads to inject HAMi-core (with the value [`HAMI_CORE_PROVIDER`]).
pub const ISOLATION_PROVIDER: &str = "koordinator.sh/gpu-isolation-provider";
/// [`ISOLATION_PROVIDER`]'s value for HAMi-core.
pub const HAMI_CORE_PROVIDER: &str = "HAMi-core";

/// An `LD_PRELOAD` value without HAMi-core's library (entries separated by `:` or spaces, as
/// ld.so reads them): `Some(the rest, ':'-joined)` when it named it, `None` when it did not.
pub fn without_hami_core(value: &str) -> Option<String> {
    let entries: Vec<&str> = value
        .split([':', ' ', '\t'])
        .filter(|e| !e.is_empty())
        .collect();
    if !entries.iter().any(|e| is_hami_core_library(e)) {
        return None;
    }
    Some(
        entries
            .into_iter()
            .filter(|e| !is_hami_core_library(e))
            .collect::<Vec<_>>()
            .join(":"),
    )
}

/// For a container gpufence fences: HAMi-core preloaded by `LD_PRELOAD` (koordlet's injection
/// for `koordinator.sh/gpu-isolation-provider: HAMi-core` pods, or any other) would run beside
/// gpufence's shim, each enforcing its own idea of the quota. The value is replaced by the same
/// list without it: one override, one note, one log line.
pub fn neutralise_hami_core(inputs: &Inputs, intake: &mut Intake) {
    let Some((value, rest)) = inputs
        .env
        .iter()
        .filter(|(k, _)| k == "LD_PRELOAD")
        .find_map(|(_, v)| without_hami_core(v).map(|r| (v.clone(), r)))
    else {
        return;
    };
    tracing::info!(
        ld_preload = %short(&value),
        replacement = %rest,
        "HAMi-core preload (koordlet's gpu-isolation-provider HAMi-core injection) neutralised: \
         gpufence's shim enforces the quota"
    );
    intake.env_overrides.push(format!("LD_PRELOAD={rest}"));
    intake.notes.push(format!(
        "neutralised LD_PRELOAD={:?} to {rest:?}: HAMi-core must not run beside gpufence's shim \
         (Koordinator: do not label the pod koordinator.sh/gpu-isolation-provider=HAMi-core)",
        short(&value)
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_koordlets_forms() {
        assert_eq!(minors("1"), Some(vec![1]));
        assert_eq!(minors("0, 3"), Some(vec![0, 3]));
        for not_koordlets in ["", "all", "void", "GPU-a", "1,,2", "-1", "1234567890"] {
            assert_eq!(minors(not_koordlets), None, "{not_koordlets}");
        }
        assert_eq!(memory_limit("8589934592"), Ok(Some(8 << 30)));
        assert_eq!(memory_limit("8g"), Ok(Some(8 << 30)));
        assert_eq!(memory_limit("0"), Ok(None));
        assert!(memory_limit("8Gi").is_err());
        assert_eq!(sm_limit("50"), Ok(Some(50)));
        assert_eq!(sm_limit("100"), Ok(None));
        assert_eq!(sm_limit("0"), Ok(None));
        assert!(sm_limit("5O").is_err());
    }

    #[test]
    fn drops_hami_core_from_ld_preload_only() {
        assert_eq!(
            without_hami_core("/usr/local/vgpu/libvgpu.so"),
            Some(String::new())
        );
        assert_eq!(
            without_hami_core("/a/libx.so /usr/local/vgpu/libvgpu.so.v2.6:/b/liby.so"),
            Some("/a/libx.so:/b/liby.so".to_string())
        );
        assert_eq!(without_hami_core("libvgpu.so"), Some(String::new()));
        assert_eq!(without_hami_core("/usr/lib/libvgpu-helper.so"), None);
        assert_eq!(without_hami_core("/usr/lib/gpufence/libgpufence.so"), None);
        assert_eq!(without_hami_core(""), None);
    }
}
