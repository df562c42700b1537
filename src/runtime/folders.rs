//! The `folders` driver layout's host side (`runtime.driver-layout = "folders"`; the decision is
//! [`crate::plan::folders`]): [`prepare`] makes, once per set of driver files, the directory
//! [`folder_dir`] names under `runtime.driver-folders`, holding **hard links** of exactly the
//! granted files — the driver's own inodes, no copy — and the soname links. It is built under a
//! temporary name and renamed into place, so a folder is either complete or absent; the folders'
//! directory must be owned by root and writable by no one else. Where it cannot be prepared (the
//! driver on another filesystem, so no hard link) the caller keeps the `files` layout: the same
//! files, read-only, only more mounts.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::plan::folders::{FolderError, Folding, folder_dir, io};

fn folders_root(root: &Path) -> Result<(), FolderError> {
    if !root.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(root)
            .map_err(io(root))?;
    }
    let md = std::fs::symlink_metadata(root).map_err(io(root))?;
    let unsafe_ = |why| FolderError::Unsafe {
        path: root.to_path_buf(),
        why,
    };
    if !md.is_dir() {
        return Err(unsafe_("not a directory (a symlink is not followed)"));
    }
    if md.uid() != nix::unistd::geteuid().as_raw() {
        return Err(unsafe_("not owned by the user gpufence runs as"));
    }
    if md.permissions().mode() & 0o022 != 0 {
        return Err(unsafe_("writable by group or others"));
    }
    Ok(())
}

/// Make (once) the prepared directory for `folding` under `root`; returns it. See the module
/// docs.
pub fn prepare(
    root: &Path,
    driver_version: &str,
    folding: &Folding,
) -> Result<PathBuf, FolderError> {
    let dir = folder_dir(root, driver_version, folding)?;
    let version = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.rsplit_once('-'))
        .map_or_else(String::new, |(v, _)| v.to_string());
    folders_root(root)?;
    if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
        return Ok(dir);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = root.join(format!(".tmp-{}-{nanos}", std::process::id()));
    let built = build(&tmp, folding).and_then(|()| match std::fs::rename(&tmp, &dir) {
        Ok(()) => Ok(()),
        // Another create made it first: theirs is complete (renamed into place whole).
        Err(_) if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) => Ok(()),
        Err(e) => Err(io(&dir)(e)),
    });
    if tmp.exists() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    built?;
    prune(root, &version, &dir);
    Ok(dir)
}

fn build(tmp: &Path, folding: &Folding) -> Result<(), FolderError> {
    let mkdir = |p: &Path| {
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(p)
            .map_err(io(p))
    };
    mkdir(tmp)?;
    for f in &folding.folders {
        let d = tmp.join(f.name);
        mkdir(&d)?;
        for m in &f.members {
            let to = d.join(&m.name);
            // linkat(2) without AT_SYMLINK_FOLLOW: the file checked above, not a link's target.
            std::fs::hard_link(&m.host, &to).map_err(io(&to))?;
            if let Some(s) = &m.soname {
                let l = d.join(s);
                std::os::unix::fs::symlink(&m.name, &l).map_err(io(&l))?;
            }
        }
        for p in &f.placeholders {
            let to = d.join(p);
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&to)
                .map_err(io(&to))?;
        }
    }
    Ok(())
}

/// Remove prepared directories of other driver versions (a container still running on an old
/// driver cannot use its GPU anyway) and temporaries left by a killed create over an hour ago.
fn prune(root: &Path, version: &str, keep: &Path) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    let prefix = format!("{version}-");
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let stale_tmp = name.starts_with(".tmp-")
            && e.metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|a| a.as_secs() > 3600);
        let other_version = !name.starts_with('.') && !name.starts_with(&prefix);
        if p != keep && (stale_tmp || other_version) && e.file_type().is_ok_and(|t| t.is_dir()) {
            match std::fs::remove_dir_all(&p) {
                Ok(()) => {
                    tracing::info!(folder = %p.display(), "driver folders of another driver version removed")
                }
                Err(e) => {
                    tracing::warn!(folder = %p.display(), error = %e, "cannot remove old driver folders")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Inventory;
    use crate::plan::Plan;
    use crate::plan::folders::fold;
    use crate::plan::folders::tests::node;

    fn host_node(d: &Path) -> (Inventory, Plan) {
        let (inv, plan) = node(&d.join("driver").display().to_string());
        std::fs::create_dir_all(d.join("driver")).unwrap();
        for f in &inv.driver_files {
            std::fs::write(&f.host_path, f.container_path.as_bytes()).unwrap();
        }
        (inv, plan)
    }

    #[test]
    fn prepare_links_exactly_the_files_once_and_renames_on_change() {
        let d = tempfile::tempdir().unwrap();
        let (inv, plan) = host_node(d.path());
        let root = d.path().join("folders");
        let f = fold(&plan, &inv).unwrap();
        let dir = prepare(&root, "580.65.06", &f).unwrap();
        assert!(
            dir.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("580.65.06-")
        );
        let ls = |p: &Path| {
            let mut v: Vec<String> = std::fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            ls(&dir.join("lib")),
            [
                "libcuda.so.1",
                "libcuda.so.580",
                "libnvidia-ml.so.1",
                "libnvidia-ml.so.580",
                "node.json",
                "timeline"
            ]
        );
        assert_eq!(ls(&dir.join("bin")), ["nvidia-smi"]);
        assert_eq!(ls(&dir.join("firmware")), ["gsp_a.bin", "gsp_b.bin"]);
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(
            ino(&dir.join("lib/libcuda.so.580")),
            ino(&d.path().join("driver/cuda"))
        );
        assert_eq!(
            std::fs::read_link(dir.join("lib/libcuda.so.1")).unwrap(),
            Path::new("libcuda.so.580")
        );
        assert_eq!(
            std::fs::metadata(dir.join("lib/timeline")).unwrap().len(),
            0
        );
        assert_eq!(
            std::fs::metadata(&root).unwrap().permissions().mode() & 0o777,
            0o755
        );
        // Same files: the same directory, untouched.
        std::fs::write(dir.join("lib/marker"), b"").unwrap();
        assert_eq!(prepare(&root, "580.65.06", &f).unwrap(), dir);
        assert!(dir.join("lib/marker").exists());
        // A changed file (another size): another directory; another driver version prunes.
        std::fs::write(d.path().join("driver/cuda"), b"new driver build").unwrap();
        let dir2 = prepare(&root, "580.65.06", &f).unwrap();
        assert_ne!(dir2, dir);
        assert!(dir.exists());
        let dir3 = prepare(&root, "590.1", &f).unwrap();
        assert!(dir3.exists() && !dir.exists() && !dir2.exists());
        assert_eq!(ls(&root).len(), 1);
    }

    #[test]
    fn prepare_refuses_symlinked_driver_files_and_an_open_root() {
        let d = tempfile::tempdir().unwrap();
        let (inv, plan) = host_node(d.path());
        let f = fold(&plan, &inv).unwrap();
        // A driver file that is a symlink is refused, not followed.
        let cuda = d.path().join("driver/cuda");
        std::fs::remove_file(&cuda).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", &cuda).unwrap();
        let root = d.path().join("folders");
        let e = prepare(&root, "580", &f).unwrap_err();
        assert!(matches!(e, FolderError::Unsafe { .. }), "{e}");
        assert!(e.to_string().contains("driver/cuda"), "{e}");
        std::fs::remove_file(&cuda).unwrap();
        std::fs::write(&cuda, b"x").unwrap();
        // A folders directory others can write to is refused; so is one that is a symlink.
        std::fs::create_dir_all(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = prepare(&root, "580", &f).unwrap_err();
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&root, &link).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = prepare(&link, "580", &f).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        // Nothing half-built is left behind.
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
    }
}
