//! The ld cache refresh, done by the wrapper before it execs runc instead of by a
//! createContainer hook that runc would run (runc's hook machinery alone costs ~10 ms).
//!
//! When the plan carries gpufence's own ldcache hook, the wrapper takes it out of the edits
//! written to `config.json` ([`take_over`]; the plan itself, `gpufence plan`, hook mode and CDI
//! specs keep it) and, in its own process, before runc runs:
//!
//! 1. reads what ldconfig would read from each library the plan mounts into the hook's
//!    folders — from the HOST file (soname, flags, ABI note), nothing is mounted;
//! 2. writes the container's `ld.so.cache` (the image's entries plus one per library, at its
//!    container path), the soname links and the `ld.so.conf.d` drop-in through
//!    `openat2(RESOLVE_IN_ROOT)` handles ([`crate::enter::ldcache::update`]).
//!
//! No process is spawned, no mount namespace made, no `ldconfig` run: nothing of the image is
//! opened but regular files and directories, and nothing is followed out of the rootfs. runc
//! then mounts the libraries at the paths the cache names.
//!
//! A container with its own user namespace keeps the createContainer hook: there runc runs the
//! hook as the container's mapped root, so the files it writes belong to that root; the wrapper
//! would write them as the host's root.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::enter::ldcache::{LdcacheError, Libraries};
use crate::exit::Exit;
use crate::plan::Plan;

/// The refresh the wrapper does itself, taken out of the plan by [`take_over`].
#[derive(Debug)]
pub struct Refresh {
    pub rootfs: PathBuf,
    pub folders: Vec<String>,
    /// The plan's mounts into the folders (the driver libraries): container path, host path.
    pub mounts: Vec<crate::cdi::MountEdit>,
    /// The driver folders the plan now mounts (`runtime.driver-layout = "folders"`): their
    /// libraries (whose soname links the folder already holds) enter the cache, their binaries
    /// are linked at their host paths.
    pub folding: Option<crate::plan::folders::Folding>,
}

/// The folders of gpufence's own ldcache hook, when `h` is exactly that hook
/// ([`crate::plan::ldcache_hook`] for this configuration): a hook from a foreign CDI spec is left
/// to runc.
fn own_hook_folders(cfg: &Config, h: &crate::cdi::HookEdit) -> Option<Vec<String>> {
    let folders = crate::plan::ldcache_hook_folders(h)?;
    (*h == crate::plan::ldcache_hook(cfg, &folders)).then_some(folders)
}

/// Whether the spec puts the container in a user namespace (its own or a joined one).
fn has_user_namespace(spec: &serde_json::Value) -> bool {
    spec.pointer("/linux/namespaces")
        .and_then(|n| n.as_array())
        .is_some_and(|n| {
            n.iter()
                .any(|ns| ns.get("type").and_then(|t| t.as_str()) == Some("user"))
        })
}

/// The rootfs: `root.path`, relative to the bundle.
pub fn rootfs(spec: &serde_json::Value, bundle: &Path) -> Option<PathBuf> {
    let p = spec.pointer("/root/path")?.as_str()?;
    (!p.is_empty()).then(|| bundle.join(p))
}

/// Take gpufence's ldcache hook out of `plan` when the wrapper can do the refresh itself (see
/// the module docs); `None` leaves the plan as it was.
pub fn take_over(
    cfg: &Config,
    spec: &serde_json::Value,
    bundle: &Path,
    plan: &mut Plan,
    id: &str,
) -> Result<Option<Refresh>, Exit> {
    let Some((i, folders)) = plan
        .edits
        .hooks
        .iter()
        .enumerate()
        .find_map(|(i, h)| own_hook_folders(cfg, h).map(|f| (i, f)))
    else {
        return Ok(None);
    };
    if has_user_namespace(spec) {
        tracing::info!(
            container = id,
            "user-namespaced container: the ld cache is refreshed by runc's createContainer hook"
        );
        return Ok(None);
    }
    let rootfs = rootfs(spec, bundle)
        .ok_or_else(|| Exit::invalid(format!("container {id}: config.json has no root.path")))?;
    let mounts = plan
        .edits
        .mounts
        .iter()
        .filter(|m| {
            Path::new(&m.container_path)
                .parent()
                .is_some_and(|p| folders.iter().any(|f| Path::new(f) == p))
        })
        .cloned()
        .collect();
    plan.edits.hooks.remove(i);
    Ok(Some(Refresh {
        rootfs,
        folders,
        mounts,
        folding: None,
    }))
}

impl Refresh {
    /// Write the cache, links and drop-in into the rootfs (module docs).
    pub fn run(self, id: &str) -> Result<(), Exit> {
        let mounts: Vec<(String, PathBuf)> = self
            .mounts
            .iter()
            .map(|m| (m.container_path.clone(), PathBuf::from(&m.host_path)))
            .collect();
        let (folded, binary_links) = self
            .folding
            .as_ref()
            .map(|f| (f.libraries(), f.binary_links()))
            .unwrap_or_default();
        let mut libs = crate::enter::ldcache::known_libraries(&mounts);
        libs.extend(
            crate::enter::ldcache::known_libraries(&folded)
                .into_iter()
                .map(|l| crate::enter::ldcache::Library { linked: true, ..l }),
        );
        let outcome =
            crate::enter::ldcache::update(&self.rootfs, &self.folders, &Libraries::Known(libs))
                .map_err(|e| {
                    let code = match e {
                        LdcacheError::BadFolder(_) | LdcacheError::Resolve { .. } => 1,
                        _ => 2,
                    };
                    Exit::new(
                        code,
                        format!(
                            "container {id}: ld cache refresh in {}: {e}",
                            self.rootfs.display()
                        ),
                    )
                })?;
        crate::enter::ldcache::log_outcome(id, &self.rootfs, &self.folders, &outcome);
        // A convenience, not enforcement: an image where they cannot be made (its /usr/bin not a
        // directory) runs without them, with the binaries on PATH.
        match crate::enter::ldcache::link_in_root(&self.rootfs, &binary_links) {
            Ok(_) if binary_links.is_empty() => {}
            Ok(linked) => {
                tracing::info!(
                    container = id,
                    linked,
                    of = binary_links.len(),
                    "driver binaries linked at their host paths"
                )
            }
            Err(e) => {
                tracing::warn!(container = id, error = %e, "driver binaries not linked at their host paths (on PATH only)")
            }
        }
        tracing::info!(container = id, rootfs = %self.rootfs.display(), folders = ?self.folders, "ld cache refreshed before runc (no createContainer hook, no ldconfig)");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config {
            gpufence_binary: "/usr/bin/gpufence".into(),
            ..Config::default()
        }
    }

    fn plan_with(hooks: Vec<crate::cdi::HookEdit>) -> Plan {
        let m = |p: &str| crate::cdi::MountEdit {
            host_path: format!("/host{p}"),
            container_path: p.to_string(),
            kind: None,
            options: vec!["ro".into(), "bind".into()],
        };
        Plan {
            edits: crate::cdi::ContainerEdits {
                mounts: vec![
                    m("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                    m("/usr/lib/x86_64-linux-gnu/sub/libx.so"),
                    m("/usr/bin/nvidia-smi"),
                    m("/run/gpufence"),
                ],
                hooks,
                ..Default::default()
            },
            ..Plan::default()
        }
    }

    #[test]
    fn takes_over_only_its_own_hook() {
        let c = cfg();
        let dirs = vec!["/usr/lib/x86_64-linux-gnu".to_string()];
        let ours = crate::plan::ldcache_hook(&c, &dirs);
        let mut foreign = ours.clone();
        foreign.path = "/usr/bin/nvidia-ctk".into();
        let spec = serde_json::json!({"root": {"path": "rootfs"}});
        let mut plan = plan_with(vec![foreign.clone(), ours]);
        let r = take_over(&c, &spec, Path::new("/b"), &mut plan, "c1")
            .unwrap()
            .unwrap();
        assert_eq!(plan.edits.hooks, vec![foreign.clone()]);
        assert_eq!(r.rootfs, PathBuf::from("/b/rootfs"));
        assert_eq!(r.folders, dirs);
        let targets: Vec<&str> = r.mounts.iter().map(|m| m.container_path.as_str()).collect();
        assert_eq!(targets, vec!["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]);

        // Only a foreign hook: nothing taken.
        let mut plan = plan_with(vec![foreign.clone()]);
        assert!(
            take_over(&c, &spec, Path::new("/b"), &mut plan, "c1")
                .unwrap()
                .is_none()
        );
        assert_eq!(plan.edits.hooks.len(), 1);
    }

    #[test]
    fn user_namespace_keeps_the_hook_and_rootfs_is_required() {
        let c = cfg();
        let hook = crate::plan::ldcache_hook(&c, &["/usr/lib64".to_string()]);
        let userns = serde_json::json!({"root": {"path": "/r"}, "linux": {"namespaces": [{"type": "mount"}, {"type": "user"}]}});
        let mut plan = plan_with(vec![hook.clone()]);
        assert!(
            take_over(&c, &userns, Path::new("/b"), &mut plan, "c1")
                .unwrap()
                .is_none()
        );
        assert_eq!(plan.edits.hooks, vec![hook.clone()]);
        let mut plan = plan_with(vec![hook.clone()]);
        let no_root = serde_json::json!({"linux": {}});
        assert!(take_over(&c, &no_root, Path::new("/b"), &mut plan, "c1").is_err());
        // Absolute root.path is kept as is.
        let abs = serde_json::json!({"root": {"path": "/var/lib/c/rootfs"}});
        let mut plan = plan_with(vec![hook]);
        let r = take_over(&c, &abs, Path::new("/b"), &mut plan, "c1")
            .unwrap()
            .unwrap();
        assert_eq!(r.rootfs, PathBuf::from("/var/lib/c/rootfs"));
        assert!(plan.edits.hooks.is_empty());
    }
}
