//! The `folders` driver layout's host side (`runtime.driver-layout = "folders"`, the default; the
//! decision is [`crate::plan::folders`], pure): [`settle`] is the one call every applier makes
//! once the plan is made — it reads the identities of the files the plan folds (one `lstat`
//! each), names their directory under `runtime.driver-folders` and, unless only naming
//! (`gpufence plan`), makes it when absent: **hard links** of exactly the granted files — the
//! driver's own inodes, no copy — and the soname links, built under a temporary name and renamed
//! into place, so a folder is either complete or absent. The folders' directory must be owned by
//! root and writable by no one else. Where the directory cannot be made (the driver on another
//! filesystem, so no hard link; a driver file replaced meanwhile) the plan keeps the `files`
//! layout, with a note: the same files, read-only, only more mounts.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::config::{Config, DriverLayout};
use crate::inventory::Inventory;
use crate::plan::Plan;
use crate::plan::folders::{ContainerEnv, FileIdentity, Folding, fold, folder_name};

/// Why a folder could not be named or prepared (the container then gets the `files` layout).
#[derive(Debug, thiserror::Error)]
pub enum FolderError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    Unsafe { path: PathBuf, why: &'static str },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FolderError + '_ {
    move |source| FolderError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What [`settle`] does on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Name the directory only (`gpufence plan`: changes nothing).
    Name,
    /// Name it and make it when absent (the appliers, `gpufence cdi generate`).
    Prepare,
}

/// The plan's driver folders on this host: `plan.driver_folders` set to the layout rendered
/// with the directory named (and, for [`Mode::Prepare`], made) here, for `env` (the container's
/// `PATH` and `LD_LIBRARY_PATH`; `None` for a CDI spec). Nothing is done for the `files` layout
/// or when folding saves too little; where the directory cannot be named or made the plan keeps
/// its per-file edits, with one log line and a note saying why.
pub fn settle(
    cfg: &Config,
    plan: &mut Plan,
    inventory: &Inventory,
    env: Option<ContainerEnv>,
    mode: Mode,
) {
    plan.driver_folders = None;
    if cfg.runtime.driver_layout != DriverLayout::Folders {
        return;
    }
    let Some(folding) = fold(plan, inventory) else {
        return;
    };
    let root = &cfg.runtime.driver_folders;
    let version = &inventory.driver_version;
    let dir = match mode {
        Mode::Name => folder_dir(root, version, &folding)
            .map(|d| (d.path.symlink_metadata().is_ok_and(|m| m.is_dir()), d.path)),
        Mode::Prepare => prepare(root, version, &folding).map(|d| (true, d)),
    };
    match dir {
        Ok((prepared, dir)) => {
            let f = folding.layout(plan, &dir, env, prepared);
            tracing::info!(container = %plan.container_id, folder = %dir.display(), files = f.files, folders = f.folders, prepared, "driver files mounted as folders");
            plan.driver_folders = Some(f);
        }
        Err(e) => {
            tracing::warn!(container = %plan.container_id, error = %e, "driver folders unavailable: driver files mounted one by one");
            plan.notes.push(format!(
                "driver layout \"folders\" unavailable ({e}): driver files mounted one by one"
            ));
        }
    }
}

/// [`settle`] for a plan fresh from the front door, with its container's env.
pub fn settle_intake(cfg: &Config, intake: &mut crate::plan::intake::Intake, mode: Mode) {
    if intake.sandbox.is_some() {
        return;
    }
    let env = ContainerEnv::of(&intake.request);
    settle(cfg, &mut intake.plan, &intake.inventory, Some(env), mode);
}

/// A prepared directory's path, and the (device, inode) of each member in folder order, for
/// checking that what gets linked is what was named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FolderDir {
    pub path: PathBuf,
    pub ids: Vec<(u64, u64)>,
}

/// Where the prepared directory for `folding` is, or will be, under `root`
/// (`runtime.driver-folders`): [`folder_name`] of every member's identity. Reads metadata only;
/// refuses a member that is not a regular file (a driver file is linked, never followed).
pub fn folder_dir(
    root: &Path,
    driver_version: &str,
    folding: &Folding,
) -> Result<FolderDir, FolderError> {
    let mut identities = Vec::new();
    for m in folding.members() {
        let md = std::fs::symlink_metadata(&m.host).map_err(io(&m.host))?;
        if !md.file_type().is_file() {
            return Err(FolderError::Unsafe {
                path: m.host.clone(),
                why: "not a regular file (a driver file is linked, never followed)",
            });
        }
        identities.push(FileIdentity {
            dev: md.dev(),
            ino: md.ino(),
            size: md.size(),
            mtime: md.mtime(),
            mtime_nsec: md.mtime_nsec(),
        });
    }
    Ok(FolderDir {
        path: root.join(folder_name(driver_version, folding, &identities)),
        ids: identities.iter().map(|i| (i.dev, i.ino)).collect(),
    })
}

/// The directory `runtime.driver-folders`, created 0755 when absent; refused unless it is a
/// real directory owned by this user (root) and writable by no one else.
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

/// Make (once) the prepared directory for `folding` under `root`; returns it. The members are
/// read once ([`folder_dir`]); an existing directory of that name is used as it is. See the
/// module docs.
pub fn prepare(
    root: &Path,
    driver_version: &str,
    folding: &Folding,
) -> Result<PathBuf, FolderError> {
    let FolderDir { path: dir, ids } = folder_dir(root, driver_version, folding)?;
    folders_root(root)?;
    if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
        return Ok(dir);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = root.join(format!(".tmp-{}-{nanos}", std::process::id()));
    let built = build(&tmp, folding, &ids).and_then(|()| match std::fs::rename(&tmp, &dir) {
        Ok(()) => Ok(()),
        // Another create made it first: theirs is complete (renamed into place whole).
        Err(_) if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) => Ok(()),
        Err(e) => Err(io(&dir)(e)),
    });
    if tmp.exists() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    built?;
    remove_stale_temporaries(root);
    Ok(dir)
}

/// A directory, mode 0755 whatever the umask (container users must traverse it).
fn mkdir(p: &Path) -> Result<(), FolderError> {
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(p)
        .map_err(io(p))?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).map_err(io(p))
}

/// Fill `tmp`; `ids` are the members' (device, inode) as [`folder_dir`] named them: a link that
/// reaches another inode (the driver replaced in between) fails the build.
fn build(tmp: &Path, folding: &Folding, ids: &[(u64, u64)]) -> Result<(), FolderError> {
    mkdir(tmp)?;
    let mut ids = ids.iter();
    for f in &folding.folders {
        let d = tmp.join(f.name);
        mkdir(&d)?;
        for m in &f.members {
            let to = d.join(&m.name);
            // linkat(2) without AT_SYMLINK_FOLLOW: the file checked above, not a link's target.
            std::fs::hard_link(&m.host, &to).map_err(io(&to))?;
            let md = std::fs::symlink_metadata(&to).map_err(io(&to))?;
            if ids.next() != Some(&(md.dev(), md.ino())) || !md.file_type().is_file() {
                return Err(FolderError::Unsafe {
                    path: m.host.clone(),
                    why: "replaced while its driver folder was being made",
                });
            }
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

/// Remove temporaries (`.tmp-<pid>-<nanos>`) a killed create left over an hour ago. Prepared
/// directories are never removed here: a running container's folder bind does not pin the
/// files of its directory, so removing one would empty the folders of containers still using
/// it; those of an old driver are the operator's to remove once its containers are gone.
fn remove_stale_temporaries(root: &Path) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = name.strip_prefix(".tmp-").is_some_and(|r| {
            r.split_once('-').is_some_and(|(a, b)| {
                !a.is_empty()
                    && !b.is_empty()
                    && a.bytes().all(|c| c.is_ascii_digit())
                    && b.bytes().all(|c| c.is_ascii_digit())
            })
        });
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|a| a.as_secs() > 3600);
        if ours
            && old
            && e.file_type().is_ok_and(|t| t.is_dir())
            && let Err(err) = std::fs::remove_dir_all(e.path())
        {
            tracing::warn!(folder = %e.path().display(), error = %err, "cannot remove a stale driver folder temporary");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufence_core::testing::folder_node as node;

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
        // A changed file (another size): another directory; another driver version another
        // one; nothing prepared is ever removed (running containers may use it), and entries
        // that are not gpufence's are left alone.
        std::fs::create_dir_all(root.join("cuda-12.4")).unwrap();
        std::fs::write(d.path().join("driver/cuda"), b"new driver build").unwrap();
        let dir2 = prepare(&root, "580.65.06", &f).unwrap();
        assert_ne!(dir2, dir);
        let dir3 = prepare(&root, "590.1", &f).unwrap();
        assert!(dir.exists() && dir2.exists() && dir3.exists());
        assert!(root.join("cuda-12.4").exists());
        assert_eq!(ls(&root).len(), 4);
        // A stale temporary of a killed create goes with the next build; a fresh one stays.
        let stale = root.join(".tmp-1-2");
        std::fs::create_dir(&stale).unwrap();
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        std::fs::File::open(&stale)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
        std::fs::create_dir(root.join(".tmp-3-4")).unwrap();
        std::fs::write(d.path().join("driver/ml"), b"another build").unwrap();
        prepare(&root, "590.1", &f).unwrap();
        assert!(!stale.exists() && root.join(".tmp-3-4").exists());
    }

    #[test]
    fn a_file_replaced_after_it_was_named_fails_the_build() {
        let d = tempfile::tempdir().unwrap();
        let (inv, plan) = host_node(d.path());
        let f = fold(&plan, &inv).unwrap();
        let named = folder_dir(&d.path().join("folders"), "580", &f).unwrap();
        // The driver's libcuda replaced (a new inode) between naming and linking.
        let cuda = d.path().join("driver/cuda");
        std::fs::rename(&cuda, d.path().join("driver/cuda.old")).unwrap();
        std::fs::write(&cuda, b"upgraded").unwrap();
        let tmp = d.path().join("tmp");
        let e = build(&tmp, &f, &named.ids).unwrap_err();
        assert!(e.to_string().contains("replaced while"), "{e}");
        // The same ids as now: built, every directory 0755.
        let now = folder_dir(&d.path().join("folders"), "580", &f).unwrap();
        let tmp2 = d.path().join("tmp2");
        build(&tmp2, &f, &now.ids).unwrap();
        for sub in ["", "lib", "bin", "firmware"] {
            let m = std::fs::metadata(tmp2.join(sub))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(m & 0o777, 0o755, "{sub}");
        }
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
