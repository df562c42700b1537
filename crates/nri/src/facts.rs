//! The node's side of the validation ([`super::validate::Node`]): the GPU-class majors, the
//! driver's files and gpufence's driver folders, the inventory (which devices a visibility
//! value names) and the CDI specs of `cdi.spec-dirs` (read once per validation, only when
//! another plugin added a CDI device).

use std::cell::OnceCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::validate::{Decided, Node};
use crate::cdi::{ContainerEdits, LoadedSpec};
use crate::inventory::Inventory;

/// A scheduler dialect's word on another plugin's variable (see [`Node::env_agrees`]): e.g.
/// Koordinator's, on koordlet's env for the devices it granted.
pub type EnvAgreement = fn(&str, &str, &Decided) -> Option<bool>;

/// The facts of this node for one validation.
pub struct NodeFacts {
    pub majors: Vec<u32>,
    /// `None`: unavailable (then no visibility value resolves: only gpufence's own agree).
    pub inventory: Option<Inventory>,
    /// `runtime.driver-folders`.
    pub driver_folders: PathBuf,
    /// `cdi.spec-dirs` with their priorities.
    pub cdi_dirs: Vec<(PathBuf, u8)>,
    /// Dialects that vouch for other plugins' variables, asked in order.
    pub dialects: Vec<EnvAgreement>,
    cdi: OnceCell<Vec<LoadedSpec>>,
}

impl NodeFacts {
    pub fn new(
        cfg: &crate::config::Config,
        majors: Vec<u32>,
        inventory: Option<Inventory>,
    ) -> NodeFacts {
        NodeFacts {
            majors,
            inventory,
            driver_folders: cfg.runtime.driver_folders.clone(),
            cdi_dirs: cfg.cdi.dirs(),
            dialects: Vec::new(),
            cdi: OnceCell::new(),
        }
    }

    fn specs(&self) -> &[LoadedSpec] {
        self.cdi.get_or_init(|| {
            let (specs, errors) = crate::cdi::load_spec_dirs(&self.cdi_dirs);
            for e in errors {
                tracing::warn!(error = %e, "NRI validation: CDI spec skipped");
            }
            specs
        })
    }
}

impl Node for NodeFacts {
    fn gpu_majors(&self) -> &[u32] {
        &self.majors
    }

    fn is_driver_path(&self, source: &str) -> bool {
        let p = Path::new(source);
        p.starts_with(&self.driver_folders)
            || self
                .inventory
                .as_ref()
                .is_some_and(|inv| inv.driver_files.iter().any(|f| f.host_path == p))
    }

    fn visible_devices(&self, value: &str) -> Option<BTreeSet<String>> {
        use crate::allocation::devices::{resolve_list, split_list};
        let inv = self.inventory.as_ref()?;
        let tokens = split_list(value);
        let resolved = resolve_list("NVIDIA_VISIBLE_DEVICES", value, &tokens, inv).ok()?;
        Some(resolved.into_iter().map(|r| r.uuid).collect())
    }

    fn cdi_edits(&self, name: &str) -> Result<ContainerEdits, String> {
        let qualified = crate::cdi::parse::parse_qualified_name(name).map_err(|e| e.to_string())?;
        match crate::cdi::parse::find_device(self.specs(), &qualified) {
            Ok(Some((spec, device))) => {
                let mut edits = spec.spec.container_edits.clone();
                edits.append(&device.container_edits);
                Ok(edits)
            }
            Ok(None) => Err("no spec in cdi.spec-dirs defines it".to_string()),
            Err((a, b)) => Err(format!("defined by both {a} and {b}")),
        }
    }

    fn env_agrees(&self, key: &str, value: &str, decided: &Decided) -> Option<bool> {
        self.dialects.iter().find_map(|d| d(key, value, decided))
    }
}
