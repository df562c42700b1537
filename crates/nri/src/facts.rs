//! The node's side of the validation ([`super::validate::Node`]): the GPU-class majors, the
//! driver's files and gpufence's driver folders, the inventory (which devices a visibility
//! value names) and the CDI specs of `cdi.spec-dirs` (read once per validation, only when
//! another plugin added a CDI device).

use std::cell::OnceCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::validate::{Decided, Node};
use crate::allocation::Allocation;
use crate::cdi::{ContainerEdits, LoadedSpec};
use crate::inventory::Inventory;

/// A scheduler dialect's word on another plugin's variable `key=value` for the allocation
/// gpufence planned (see [`Node::env_agrees`]): `true` vouches for it (e.g. Koordinator's
/// `koordlet_env_agrees`, on koordlet's `NVIDIA_VISIBLE_DEVICES=<minors>` for the GPUs it
/// granted); `false` leaves it to the generic rules.
pub type EnvAgreement = fn(&Allocation, &Inventory, &str, &str) -> bool;

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
        let (alloc, inv) = (decided.allocation.as_ref()?, self.inventory.as_ref()?);
        self.dialects
            .iter()
            .any(|d| d(alloc, inv, key, value))
            .then_some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(dir: &Path) -> NodeFacts {
        let mut inv = gpufence_core::testing::inv();
        inv.driver_files.push(gpufence_core::testing::file(
            "/drv/usr/lib/libcuda.so.1",
            "/usr/lib/libcuda.so.1",
            crate::inventory::FileKind::Library,
            Some("libcuda.so.1"),
        ));
        let mut f = NodeFacts::new(&crate::config::Config::default(), vec![195], Some(inv));
        f.cdi_dirs = vec![(dir.to_path_buf(), 0)];
        f.driver_folders = dir.join("folders");
        f
    }

    #[test]
    fn visibility_values_resolve_through_the_inventory() {
        let dir = tempfile::tempdir().unwrap();
        let f = facts(dir.path());
        let a: BTreeSet<String> = ["GPU-a".to_string()].into();
        assert_eq!(f.visible_devices("0"), Some(a.clone()));
        assert_eq!(f.visible_devices("GPU-a"), Some(a.clone()));
        assert_eq!(f.visible_devices("all"), Some(a));
        assert_eq!(f.visible_devices("5"), None);
        assert_eq!(f.visible_devices(""), None);
        let none = NodeFacts::new(&crate::config::Config::default(), vec![], None);
        assert_eq!(none.visible_devices("0"), None);
    }

    #[test]
    fn driver_paths_are_the_inventory_s_files_and_the_folders() {
        let dir = tempfile::tempdir().unwrap();
        let f = facts(dir.path());
        assert!(f.is_driver_path("/drv/usr/lib/libcuda.so.1"));
        assert!(f.is_driver_path(&dir.path().join("folders/580/lib64").display().to_string()));
        assert!(!f.is_driver_path("/drv/usr/lib/other.so"));
    }

    #[test]
    fn cdi_devices_resolve_with_their_spec_s_edits_or_say_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let spec = serde_json::json!({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
            "containerEdits": {"env": ["X=1"]},
            "devices": [{"name": "0", "containerEdits": {"deviceNodes": [
                {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]}}]});
        std::fs::write(dir.path().join("nvidia.json"), spec.to_string()).unwrap();
        let f = facts(dir.path());
        let e = f.cdi_edits("nvidia.com/gpu=0").unwrap();
        assert_eq!(e.env, ["X=1"]);
        assert_eq!(e.device_nodes[0].path, "/dev/nvidia0");
        assert_eq!(e.device_nodes[0].major, Some(195));
        assert_eq!(
            f.cdi_edits("nvidia.com/gpu=9").unwrap_err(),
            "no spec in cdi.spec-dirs defines it"
        );
        assert!(f.cdi_edits("not a name").is_err());
    }
}
