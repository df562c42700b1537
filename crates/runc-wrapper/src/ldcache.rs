//! How `gpufence-runtime` renders the plan's ld cache refresh ([`crate::plan::LdCache`]): in its
//! own process before it execs runc, instead of a createContainer hook that runc would run
//! (runc's hook machinery alone costs ~10 ms). [`render`] decides, the plan is not changed:
//!
//! 1. reads what ldconfig would read from each library the plan mounts into the cache's
//!    folders — from the HOST file (soname, flags, ABI note), nothing is mounted;
//! 2. writes the container's `ld.so.cache` (the image's entries plus one per library, at its
//!    container path), the soname links and the `ld.so.conf.d` drop-in through
//!    `openat2(RESOLVE_IN_ROOT)` handles ([`crate::enter::ldcache::update`]).
//!
//! No process is spawned, no mount namespace made, no `ldconfig` run: nothing of the image is
//! opened but regular files and directories, and nothing is followed out of the rootfs. runc
//! then mounts the libraries at the paths the cache names.
//!
//! A container with its own user namespace gets the createContainer hook instead
//! ([`crate::plan::ldcache_hook`]): there runc runs the hook as the container's mapped root, so
//! the files it writes belong to that root; the wrapper would write them as the host's root.

use std::path::{Path, PathBuf};

use crate::allocation::input::Inputs;
use crate::cdi::{HookEdit, MountEdit};
use crate::config::Config;
use crate::enter::ldcache::{LdcacheError, Libraries};
use crate::exit::Exit;
use crate::plan::LdCache;
use crate::plan::folders::Folding;

/// The refresh the wrapper does itself ([`render`]).
#[derive(Debug)]
pub struct Refresh {
    pub rootfs: PathBuf,
    /// `state-dir`, where the libraries' facts are remembered ([`crate::ldfacts`]).
    pub state_dir: PathBuf,
    pub folders: Vec<String>,
    /// The mounts into the folders (the driver libraries): container path, host path.
    pub mounts: Vec<MountEdit>,
    /// The driver folders the runtime mounts (`runtime.driver-layout = "folders"`): their
    /// libraries (whose soname links the folder already holds) enter the cache, their binaries
    /// are linked at their host paths.
    pub folding: Option<Folding>,
}

/// The rootfs: `root.path`, relative to the bundle.
fn rootfs(request: &Inputs, bundle: &Path) -> Option<PathBuf> {
    request.root_path.as_deref().map(|p| bundle.join(p))
}

/// How the runtime renders `ld_cache` (the plan's, or its driver folders'): the in-process
/// [`Refresh`], or — for a user-namespaced container — the createContainer hook to add to the
/// spec; `(None, None)` when the plan refreshes nothing. `mounts` are the mounts the runtime
/// writes, `folding` the driver folders it prepared.
pub fn render(
    cfg: &Config,
    ld_cache: Option<&LdCache>,
    request: &Inputs,
    bundle: &Path,
    mounts: &[MountEdit],
    folding: Option<&Folding>,
    id: &str,
) -> Result<(Option<Refresh>, Option<HookEdit>), Exit> {
    let Some(l) = ld_cache else {
        return Ok((None, None));
    };
    if request.user_namespace {
        tracing::info!(
            container = id,
            "user-namespaced container: the ld cache is refreshed by runc's createContainer hook"
        );
        return Ok((None, Some(crate::plan::ldcache_hook(cfg, &l.folders))));
    }
    let rootfs = rootfs(request, bundle)
        .ok_or_else(|| Exit::invalid(format!("container {id}: config.json has no root.path")))?;
    let mounts = mounts
        .iter()
        .filter(|m| {
            Path::new(&m.container_path)
                .parent()
                .is_some_and(|p| l.folders.iter().any(|f| Path::new(f) == p))
        })
        .cloned()
        .collect();
    Ok((
        Some(Refresh {
            rootfs,
            state_dir: cfg.state_dir.clone(),
            folders: l.folders.clone(),
            mounts,
            folding: folding.cloned(),
        }),
        None,
    ))
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
        let mut facts = crate::ldfacts::Facts::load(&self.state_dir);
        let mut libs = facts.known(&mounts);
        libs.extend(
            facts
                .known(&folded)
                .into_iter()
                .map(|l| crate::enter::ldcache::Library { linked: true, ..l }),
        );
        facts.save();
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

    fn mounts() -> Vec<MountEdit> {
        let m = |p: &str| MountEdit {
            host_path: format!("/host{p}"),
            container_path: p.to_string(),
            kind: None,
            options: vec!["ro".into(), "bind".into()],
        };
        vec![
            m("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            m("/usr/lib/x86_64-linux-gnu/sub/libx.so"),
            m("/usr/bin/nvidia-smi"),
            m("/run/gpufence"),
        ]
    }

    fn request(spec: serde_json::Value) -> Inputs {
        Inputs::from_spec(&spec).unwrap()
    }

    #[test]
    fn refreshes_the_plans_folders_in_process() {
        let c = cfg();
        let dirs = vec!["/usr/lib/x86_64-linux-gnu".to_string()];
        let l = LdCache {
            folders: dirs.clone(),
        };
        let req = request(serde_json::json!({"root": {"path": "rootfs"}}));
        let (r, hook) = render(&c, Some(&l), &req, Path::new("/b"), &mounts(), None, "c1").unwrap();
        let r = r.unwrap();
        assert!(hook.is_none());
        assert_eq!(r.rootfs, PathBuf::from("/b/rootfs"));
        assert_eq!(r.folders, dirs);
        let targets: Vec<&str> = r.mounts.iter().map(|m| m.container_path.as_str()).collect();
        assert_eq!(targets, vec!["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]);

        // Nothing to refresh: nothing rendered.
        let (r, hook) = render(&c, None, &req, Path::new("/b"), &mounts(), None, "c1").unwrap();
        assert!(r.is_none() && hook.is_none());
    }

    #[test]
    fn user_namespace_gets_the_hook_and_rootfs_is_required() {
        let c = cfg();
        let l = LdCache {
            folders: vec!["/usr/lib64".to_string()],
        };
        let userns = request(
            serde_json::json!({"root": {"path": "/r"}, "linux": {"namespaces": [{"type": "mount"}, {"type": "user"}]}}),
        );
        let (r, hook) = render(
            &c,
            Some(&l),
            &userns,
            Path::new("/b"),
            &mounts(),
            None,
            "c1",
        )
        .unwrap();
        assert!(r.is_none());
        assert_eq!(hook, Some(crate::plan::ldcache_hook(&c, &l.folders)));
        let no_root = request(serde_json::json!({"linux": {}}));
        assert!(
            render(
                &c,
                Some(&l),
                &no_root,
                Path::new("/b"),
                &mounts(),
                None,
                "c1"
            )
            .is_err()
        );
        // Absolute root.path is kept as is.
        let abs = request(serde_json::json!({"root": {"path": "/var/lib/c/rootfs"}}));
        let (r, _) = render(&c, Some(&l), &abs, Path::new("/b"), &mounts(), None, "c1").unwrap();
        assert_eq!(r.unwrap().rootfs, PathBuf::from("/var/lib/c/rootfs"));
    }
}
