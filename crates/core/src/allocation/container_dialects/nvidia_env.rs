//! NVIDIA device plugin: NVIDIA_VISIBLE_DEVICES and volume mounts.

use super::{Facet, Part};
use crate::allocation::AllocationError;
use crate::allocation::devices::{resolve_list, split_list};
use crate::allocation::input::Inputs;
use crate::config::Dialect;
use crate::inventory::Inventory;

pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
pub const NVIDIA_DRIVER_CAPABILITIES: &str = "NVIDIA_DRIVER_CAPABILITIES";
/// Where the NVIDIA device plugin's `volume-mounts` strategy mounts one file per device.
pub const NVIDIA_DEVICES_MOUNT_DIR: &str = "/var/run/nvidia-container-devices";
/// gpushare's extender failure marker in `NVIDIA_VISIBLE_DEVICES`.
pub const GPUSHARE_FAILURE_PREFIX: &str = "no-gpu-has-";

/// Values of `NVIDIA_VISIBLE_DEVICES` that request no device.
pub fn nvd_requests_nothing(v: &str) -> bool {
    let v = v.trim();
    v.is_empty() || v == "void" || v == "none"
}

pub(super) fn failure_marker(v: &str) -> Option<AllocationError> {
    v.trim().starts_with(GPUSHARE_FAILURE_PREFIX).then(|| {
        AllocationError::new(
            NVIDIA_VISIBLE_DEVICES,
            v,
            "the gpushare scheduler extender found no GPU for this container",
        )
    })
}

/// The `volume-mounts` strategy: `/var/run/nvidia-container-devices/<id>` mount destinations
/// whose source is `/dev/null`. Those reach `config.json` from the kubelet (the device plugin's
/// Allocate response), so they are trusted like annotations whenever the nvidia dialect is
/// enabled. An image `VOLUME` there is a mount too, but from a host directory: ignored.
pub fn nvidia(
    inputs: &Inputs,
    inv: &Inventory,
    env_trusted: bool,
) -> Result<Part, AllocationError> {
    let mut part = Part::new(Dialect::Nvidia);
    let prefix = format!("{NVIDIA_DEVICES_MOUNT_DIR}/");
    // Only the device plugin's `/dev/null` mounts count (as in nvidia-container-toolkit): an
    // image `VOLUME` under the directory also becomes a mount, from a host directory.
    let ids: Vec<&str> = inputs
        .mounts
        .iter()
        .filter(|(_, src)| std::path::Path::new(src) == std::path::Path::new("/dev/null"))
        .filter_map(|(d, _)| d.strip_prefix(&prefix))
        .map(|d| d.trim_end_matches('/'))
        .collect();
    if !ids.is_empty() {
        let key = format!("mounts[{NVIDIA_DEVICES_MOUNT_DIR}]");
        let value = ids.join(",");
        if ids.iter().any(|i| i.contains('/')) {
            return Err(AllocationError::new(
                &key,
                &value,
                "nested path under the device directory",
            ));
        }
        // The device plugin names the devices it allocated; `all` there can only come from a
        // pod's own hostPath volume of /dev/null.
        if ids.iter().any(|i| i.trim().eq_ignore_ascii_case("all")) {
            return Err(AllocationError::new(
                &key,
                &value,
                "`all` is never a device plugin's device mount (a pod's own volume?)",
            ));
        }
        let devs = resolve_list(&key, &value, &ids, inv)?;
        part.devices = Some(Facet::new(devs, &key, &value));
    }
    if env_trusted && let Some(v) = inputs.env_var(NVIDIA_VISIBLE_DEVICES)? {
        if let Some(e) = failure_marker(v) {
            return Err(e);
        }
        let t = v.trim();
        if !nvd_requests_nothing(t) && t != NVIDIA_DEVICES_MOUNT_DIR {
            let devs = resolve_list(NVIDIA_VISIBLE_DEVICES, v, &split_list(v), inv)?;
            if let Some(m) = &part.devices {
                let a: Vec<_> = m.values.iter().map(|r| r.device).collect();
                let b: Vec<_> = devs.iter().map(|r| r.device).collect();
                if a != b {
                    return Err(AllocationError::new(
                        NVIDIA_VISIBLE_DEVICES,
                        v,
                        format!("disagrees with the device mounts ({}={})", m.key, m.value),
                    ));
                }
            } else {
                part.devices = Some(Facet::new(devs, NVIDIA_VISIBLE_DEVICES, v));
            }
        }
    }
    Ok(part)
}
