//! CDI spec types (specification 1.1.0 field set) with strict parsing: unknown fields are
//! rejected, as the reference implementation does. Optional fields are omitted when empty so a
//! generated spec carries only the fields its `cdiVersion` knows (podman 4.3 accepts ≤ 0.5.0 and
//! rejects any field unknown to it).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A CDI spec file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    /// 0.6.0+
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    pub name: String,
    /// 0.6.0+
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    pub container_edits: ContainerEdits,
}

/// CDI `containerEdits`; also the shape of gpufence's plan edits.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNodeEdit>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookEdit>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<MountEdit>,
    /// 0.7.0+
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<serde_json::Value>,
    /// 0.7.0+
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
    /// 1.1.0+
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub net_devices: Vec<serde_json::Value>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self == &ContainerEdits::default()
    }

    /// Append another set of edits (device nodes and mounts with the same container path are
    /// replaced, as CDI's apply does).
    pub fn append(&mut self, other: &ContainerEdits) {
        for e in &other.env {
            let key = e.split('=').next().unwrap_or_default();
            self.env
                .retain(|x| x.split('=').next().unwrap_or_default() != key);
            self.env.push(e.clone());
        }
        for d in &other.device_nodes {
            self.device_nodes.retain(|x| x.path != d.path);
            self.device_nodes.push(d.clone());
        }
        for m in &other.mounts {
            self.mounts.retain(|x| x.container_path != m.container_path);
            self.mounts.push(m.clone());
        }
        for h in &other.hooks {
            if !self.hooks.contains(h) {
                self.hooks.push(h.clone());
            }
        }
        for g in &other.additional_gids {
            if !self.additional_gids.contains(g) {
                self.additional_gids.push(*g);
            }
        }
        if other.intel_rdt.is_some() {
            self.intel_rdt = other.intel_rdt.clone();
        }
        self.net_devices.extend(other.net_devices.iter().cloned());
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNodeEdit {
    /// Path in the container.
    pub path: String,
    /// Path on the host (0.5.0+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Subset of `rwm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MountEdit {
    pub host_path: String,
    pub container_path: String,
    /// 0.4.0+
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HookEdit {
    /// `prestart`, `createRuntime`, `createContainer`, `startContainer`, `poststart`, `poststop`.
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// A spec file read from a CDI directory.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedSpec {
    pub path: std::path::PathBuf,
    /// 0 for `/etc/cdi`, 1 for `/var/run/cdi` (higher wins on conflict).
    pub priority: u8,
    pub spec: Spec,
}
