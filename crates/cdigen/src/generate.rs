//! The node's CDI spec: one device per GPU (by index and by `GPU-<uuid>`), per MIG device (by
//! `N:M` and `MIG-<uuid>`) and `all`; common edits with the control nodes and the driver files.
//! Every edit is built with the plan's helpers, so CDI and the runtime give containers the same
//! things. The driver files as the layout says ([`driver_plan`]):
//! * `folders` (the default, where the node made the folders): one read-only bind per folder,
//!   binaries at their own paths (a CDI env edit replaces the image's `PATH`, so it is not
//!   extended), and `LD_LIBRARY_PATH` naming the library folder — no process per container;
//! * `files`: every driver file bound read-only at its own path, and the ldcache createContainer
//!   hook.

use std::path::{Path, PathBuf};

use crate::cdi::parse::minimum_version;
use crate::cdi::{ContainerEdits, Device, KIND, Spec};
use crate::config::Config;
use crate::inventory::{DeviceNode, FileKind, Gpu, Inventory};
use crate::plan::{LdCache, Plan, device_node_edit, driver_mounts, ldcache_hook, library_dirs};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("--output {path}: directory {dir} does not exist")]
    MissingDir { path: PathBuf, dir: PathBuf },
    #[error("--output {path}: cannot write in {dir}: {source}")]
    Write {
        path: PathBuf,
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--output {path}: {message}")]
    Serialize { path: PathBuf, message: String },
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Json,
    Yaml,
}

impl Format {
    /// From a file name: `.yaml`/`.yml` → YAML, anything else JSON.
    pub fn for_path(p: &Path) -> Format {
        match p.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => Format::Yaml,
            _ => Format::Json,
        }
    }
}

fn edits(nodes: impl IntoIterator<Item = DeviceNode>) -> ContainerEdits {
    let mut v: Vec<DeviceNode> = Vec::new();
    for n in nodes {
        if !v.iter().any(|x| x.path == n.path) {
            v.push(n);
        }
    }
    ContainerEdits {
        device_nodes: v.iter().map(device_node_edit).collect(),
        ..ContainerEdits::default()
    }
}

fn gpu_nodes(g: &Gpu) -> Vec<DeviceNode> {
    vec![g.node.clone()]
}

/// The node's driver files as a plan, pure: every file bound read-only at its own path, the ld
/// cache folders. The host side (`gpufence cdi generate`) settles its driver folders
/// (`gpufence_node::driverfolders::settle` over [`foldable`]) before [`generate_with`] renders it.
pub fn driver_plan(inv: &Inventory) -> Plan {
    let dirs = library_dirs(&inv.driver_files);
    Plan {
        container_id: "cdi".to_string(),
        ld_cache: (!dirs.is_empty()).then_some(LdCache { folders: dirs }),
        edits: crate::cdi::ContainerEdits {
            mounts: driver_mounts(&inv.driver_files),
            ..Default::default()
        },
        ..Plan::default()
    }
}

/// What the spec may fold: the driver files but the binaries (their folder would need `PATH`,
/// and a CDI env edit replaces the image's).
pub fn foldable(inv: &Inventory) -> Inventory {
    let mut out = inv.clone();
    out.driver_files.retain(|f| f.kind != FileKind::Binary);
    out
}

/// The CDI spec of this node with the `files` layout (pure).
pub fn generate(inv: &Inventory, cfg: &Config) -> Spec {
    generate_with(inv, cfg, &driver_plan(inv))
}

/// The CDI spec of this node, its driver files as `driver` ([`driver_plan`]) lays them out.
pub fn generate_with(inv: &Inventory, cfg: &Config, driver: &Plan) -> Spec {
    let mut devices = Vec::new();
    for g in &inv.gpus {
        for name in [g.index.to_string(), g.uuid.clone()] {
            devices.push(Device {
                name,
                annotations: None,
                container_edits: edits(gpu_nodes(g)),
            });
        }
        for m in &g.mig_devices {
            let nodes = || gpu_nodes(g).into_iter().chain(m.caps.iter().cloned());
            for name in [format!("{}:{}", g.index, m.index), m.uuid.clone()] {
                devices.push(Device {
                    name,
                    annotations: None,
                    container_edits: edits(nodes()),
                });
            }
        }
    }
    if !inv.gpus.is_empty() {
        let all = inv.gpus.iter().flat_map(|g| {
            gpu_nodes(g)
                .into_iter()
                .chain(g.mig_devices.iter().flat_map(|m| m.caps.iter().cloned()))
        });
        devices.push(Device {
            name: "all".to_string(),
            annotations: None,
            container_edits: edits(all),
        });
    }

    let mut common = edits(inv.control_nodes.iter().cloned());
    common.mounts = driver.layout_mounts().to_vec();
    match &driver.driver_folders {
        Some(f) => common.env.extend(f.library_path.iter().cloned()),
        None => {
            if let Some(l) = &driver.ld_cache {
                common.hooks.push(ldcache_hook(cfg, &l.folders));
            }
        }
    }
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: KIND.to_string(),
        annotations: None,
        devices,
        container_edits: common,
    };
    spec.cdi_version = minimum_version(&spec).to_string();
    spec
}

/// Serialise in the given format (YAML via `yaml_serde`).
pub fn render(spec: &Spec, format: Format) -> Result<String, String> {
    match format {
        Format::Json => serde_json::to_string_pretty(spec)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .map_err(|e| e.to_string()),
        Format::Yaml => yaml_serde::to_string(spec).map_err(|e| e.to_string()),
    }
}

/// Write `contents` to `path` atomically: a temporary file in the same directory, fsync'ed,
/// renamed over `path` (mode 0644). On any failure nothing is left behind.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), GenerateError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(GenerateError::MissingDir {
            path: path.to_path_buf(),
            dir,
        });
    }
    let opts = crate::fsutil::Options {
        mode: 0o644,
        owner: None,
        sync: true,
    };
    crate::fsutil::write_atomic(path, contents, opts).map_err(|source| GenerateError::Write {
        path: path.to_path_buf(),
        dir: dir.clone(),
        source,
    })?;
    Ok(())
}

/// Fully qualified device names of a spec, in spec order.
pub fn qualified_names(spec: &Spec) -> Vec<String> {
    spec.devices
        .iter()
        .map(|d| format!("{}={}", spec.kind, d.name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::{DeviceNodeEdit, MountEdit};

    #[test]
    fn version_follows_content() {
        let mut s = Spec {
            kind: "a.com/b".into(),
            devices: vec![Device {
                name: "x".into(),
                annotations: None,
                container_edits: ContainerEdits::default(),
            }],
            ..Spec::default()
        };
        assert_eq!(minimum_version(&s), "0.3.0");
        s.container_edits.mounts.push(MountEdit {
            host_path: "/a".into(),
            container_path: "/a".into(),
            kind: Some("bind".into()),
            options: vec![],
        });
        assert_eq!(minimum_version(&s), "0.4.0");
        s.devices[0].name = "0".into();
        assert_eq!(minimum_version(&s), "0.5.0");
        s.devices[0]
            .container_edits
            .device_nodes
            .push(DeviceNodeEdit {
                path: "/dev/x".into(),
                ..DeviceNodeEdit::default()
            });
        assert_eq!(minimum_version(&s), "0.5.0");
        s.annotations = Some([("a".to_string(), "b".to_string())].into());
        assert_eq!(minimum_version(&s), "0.6.0");
        s.container_edits.additional_gids.push(5);
        assert_eq!(minimum_version(&s), "0.7.0");
        s.container_edits.net_devices.push(serde_json::json!({}));
        assert_eq!(minimum_version(&s), "1.1.0");
    }

    #[test]
    fn atomic_write_errors_leave_nothing() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("nope/spec.json");
        let e = write_atomic(&missing, b"{}").unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        let ok = d.path().join("spec.json");
        write_atomic(&ok, b"{}").unwrap();
        assert_eq!(std::fs::read(&ok).unwrap(), b"{}");
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "no temp file left");
    }
}
