//! Plan step: the quota handed to the shim, and the host files the apply step writes (the quota
//! file, the node-wide generated `ld.so.preload`).

use crate::allocation::Allocation;
use crate::quota::{DeviceQuota, Quota};

use super::mounts::StatePaths;
use super::{CONTAINER_SHIM_PATH, HostFile};

/// The quota: per container device ordinal, its memory and compute limits; whether the shim
/// explains refusals (`shim.refusal-messages`).
pub fn quota(alloc: &Allocation, config: &crate::config::Config) -> Quota {
    Quota {
        oversubscribe: alloc.oversubscribe,
        devices: alloc
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| DeviceQuota {
                ordinal: i as u32,
                uuid: d.uuid.clone(),
                memory: d.memory_limit,
                cores: d.cores,
            })
            .collect(),
        cores_burst: alloc.cores_burst,
        quiet_refusals: !config.shim.refusal_messages,
    }
}

/// The files written on the host before the container starts.
pub fn host_files(quota: &Quota, state: &StatePaths) -> Vec<HostFile> {
    let mut files = vec![HostFile {
        path: state.quota.clone(),
        contents: quota.render(),
        mode: 0o444,
    }];
    if let Some(preload) = &state.preload {
        files.push(HostFile {
            path: preload.clone(),
            contents: format!("{CONTAINER_SHIM_PATH}\n"),
            mode: 0o444,
        });
    }
    files
}
