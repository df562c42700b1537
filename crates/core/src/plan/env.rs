//! Plan step: the environment — the visible devices, the quota for shims that read env, the
//! injection of the shim by `LD_PRELOAD`, and HAMi-core's variables in compatibility mode.

use crate::allocation::Allocation;
use crate::allocation::input::Inputs;
use crate::config::{Config, ShimInject};

use super::{CONTAINER_SHIM_PATH, CONTAINER_STATE_DIR, HAMI_CACHE_FILE};

/// The env entries (`KEY=value`) the plan adds.
pub fn env(request: &Inputs, alloc: &Allocation, config: &Config) -> Vec<String> {
    let mut env = Vec::new();
    let uuids: Vec<&str> = alloc.devices.iter().map(|d| d.uuid.as_str()).collect();
    env.push(format!("NVIDIA_VISIBLE_DEVICES={}", uuids.join(",")));
    env.push(format!("GPUFENCE_STATE={CONTAINER_STATE_DIR}"));
    for (i, d) in alloc.devices.iter().enumerate() {
        if let Some(m) = d.memory_limit {
            env.push(format!("GPUFENCE_MEMORY_LIMIT_{i}={m}"));
        }
        if let Some(c) = d.cores {
            env.push(format!("GPUFENCE_CORES_{i}={c}"));
        }
    }
    if alloc.devices.iter().any(|d| d.cores.is_some()) {
        let policy = if alloc.cores_burst { "burst" } else { "hard" };
        env.push(format!("GPUFENCE_CORES_POLICY={policy}"));
    }
    if alloc.oversubscribe {
        env.push("GPUFENCE_OVERSUBSCRIBE=1".to_string());
    }
    if config.shim.inject == ShimInject::Env {
        // HAMi-core's preload (koordlet's injection) is dropped: gpufence's shim replaces it.
        let existing = request.env_first("LD_PRELOAD").map(|v| {
            crate::allocation::koordinator::without_hami_core(v).unwrap_or_else(|| v.to_string())
        });
        let value = match existing.as_deref().filter(|v| !v.trim().is_empty()) {
            Some(v) if v.split([':', ' ']).any(|p| p == CONTAINER_SHIM_PATH) => v.to_string(),
            Some(v) => format!("{CONTAINER_SHIM_PATH}:{v}"),
            None => CONTAINER_SHIM_PATH.to_string(),
        };
        env.push(format!("LD_PRELOAD={value}"));
    }
    if config.shim.is_hami_core() {
        hami_core_env(alloc, &mut env);
    }
    env
}

/// HAMi-core's variables, for `shim.library` = `libvgpu.so`.
fn hami_core_env(alloc: &Allocation, env: &mut Vec<String>) {
    for (i, d) in alloc.devices.iter().enumerate() {
        if let Some(m) = d.memory_limit {
            let v = if m % (1 << 20) == 0 {
                format!("{}m", m >> 20)
            } else {
                m.to_string()
            };
            env.push(format!("CUDA_DEVICE_MEMORY_LIMIT_{i}={v}"));
        }
    }
    let first = alloc.devices[0].cores;
    if first.is_some() && alloc.devices.iter().all(|d| d.cores == first) {
        env.push(format!("CUDA_DEVICE_SM_LIMIT={}", first.unwrap_or(100)));
    }
    for (i, d) in alloc.devices.iter().enumerate() {
        if let Some(c) = d.cores {
            env.push(format!("CUDA_DEVICE_SM_LIMIT_{i}={c}"));
        }
    }
    env.push(format!(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE={CONTAINER_STATE_DIR}/{HAMI_CACHE_FILE}"
    ));
}
