//! The `folders` driver layout (`runtime.driver-layout = "folders"`, the default), its decision
//! part, pure: the plan's read-only driver file binds folded into one bind per folder, so the
//! runtime makes a handful of mounts instead of one per file (each read-only bind is two mount
//! calls in runc, plus a mount target created in the image's overlay — the bulk of what runc
//! itself spends on a GPU container). Every applier renders it: `gpufence-runtime` (the spec),
//! hook mode (the container's namespace), `gpufence nri` (the adjustment) and the CDI spec.
//!
//! * [`fold`] decides: the libraries of the plan's main library folder go to [`LIB_FOLDER`], its
//!   binaries to [`BIN_FOLDER`], its firmware to the firmware's own folder (the same paths as on
//!   the host); read-only data files in the library folder go with the libraries, read-write
//!   files there (the simulated node's device timeline) are bound over an empty placeholder
//!   inside the folder. Sockets, config files elsewhere and libraries of other folders keep their
//!   own binds. Nothing is folded unless at least two mounts are saved.
//! * [`folder_name`] names the host directory that holds the folders from the driver version and
//!   every member's identity (device, inode, size, mtime), so a driver upgrade (new inodes) gives
//!   a new name. The identities are the caller's: this module reads nothing. The host side —
//!   reading the identities, making the directory of hard links — is the node's
//!   (`gpufence_node::driverfolders`), which sets [`crate::plan::Plan::driver_folders`] once the
//!   directory is named (or made) on this host.
//! * [`Folding::layout`] renders the plan with the folders: its mounts, its ld cache folders, and
//!   [`BIN_FOLDER`] appended to the process `PATH` — a [`DriverFolders`] the plan carries beside
//!   its per-file edits, which stay the plan's own (the `files` layout, and the fallback where the
//!   directory cannot be made).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::cdi::MountEdit;
use crate::inventory::{DriverFile, FileKind, Inventory};
pub use crate::plan::types::{DriverFolders, Folder, Folding, Member};
use crate::plan::{LdCache, Plan, RO_BIND};

/// Where the folded driver libraries appear in the container (the folder NVIDIA's CUDA images
/// already name in `LD_LIBRARY_PATH`).
pub const LIB_FOLDER: &str = "/usr/local/nvidia/lib64";
/// Where the folded driver binaries appear (appended to `PATH`).
pub const BIN_FOLDER: &str = "/usr/local/nvidia/bin";
/// `PATH` when the spec sets none (runc's and Docker's default).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The container's env the layout extends (`PATH`, `LD_LIBRARY_PATH`; the first value of each).
#[derive(Debug, Clone, Copy, Default)]
pub struct ContainerEnv<'a> {
    pub path: Option<&'a str>,
    pub ld_library_path: Option<&'a str>,
}

impl<'a> ContainerEnv<'a> {
    /// The request's `PATH` and `LD_LIBRARY_PATH`.
    pub fn of(request: &'a crate::allocation::input::Inputs) -> ContainerEnv<'a> {
        ContainerEnv {
            path: request.path(),
            ld_library_path: request.env_first("LD_LIBRARY_PATH"),
        }
    }
}

/// `current` with each of `dirs` it lacks appended (`:`-separated); `None` when it has them all.
fn appended(current: &str, dirs: &[String]) -> Option<String> {
    let missing: Vec<&str> = dirs
        .iter()
        .map(String::as_str)
        .filter(|d| !current.split(':').any(|p| p == *d))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let mut v = current.to_string();
    for d in missing {
        if !v.is_empty() {
            v.push(':');
        }
        v.push_str(d);
    }
    Some(v)
}

fn folder_of(p: &str) -> Option<(&str, &str)> {
    let p = Path::new(p);
    Some((p.parent()?.to_str()?, p.file_name()?.to_str()?))
}

/// The plan's driver file binds grouped into folders (pure; see the module docs). `None` when
/// folding would save fewer than two mounts.
pub fn fold(plan: &Plan, inventory: &Inventory) -> Option<Folding> {
    let by_host: BTreeMap<String, &DriverFile> = inventory
        .driver_files
        .iter()
        .map(|f| (f.host_path.display().to_string(), f))
        .collect();
    // (index, mount, driver file) of every mount that binds a driver file at its own path.
    let driver: Vec<(usize, &MountEdit, &DriverFile)> = plan
        .edits
        .mounts
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let f = by_host.get(&m.host_path)?;
            (f.container_path == m.container_path && m.kind.is_none()).then_some((i, m, *f))
        })
        .collect();
    let ro = |m: &MountEdit| m.options == RO_BIND;
    let main_folder = |kind: FileKind| -> Option<String> {
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, m, f) in &driver {
            if f.kind == kind && ro(m) {
                *count.entry(folder_of(&m.container_path)?.0).or_default() += 1;
            }
        }
        // A 64-bit folder before a 32-bit one (`/usr/lib64` over `/usr/lib` on RHEL-style
        // nodes, `x86_64-linux-gnu` over `i386-linux-gnu`), then the most files, then the name.
        let best = count.iter().map(|(d, n)| (d.contains("64"), *n)).max()?;
        count
            .into_iter()
            .find(|(d, n)| (d.contains("64"), *n) == best)
            .map(|(d, _)| d.to_string())
    };
    let lib_from = main_folder(FileKind::Library);
    let plans = [
        ("lib", lib_from.clone(), Some(LIB_FOLDER.to_string())),
        (
            "bin",
            main_folder(FileKind::Binary),
            Some(BIN_FOLDER.to_string()),
        ),
        ("firmware", main_folder(FileKind::Firmware), None),
    ];
    let mut out = Folding {
        folders: Vec::new(),
        folded: Vec::new(),
        moved: Vec::new(),
        lib_from: None,
    };
    for (name, from, to) in plans {
        let Some(from) = from else { continue };
        let container = to.unwrap_or_else(|| from.clone());
        let mut folder = Folder {
            name,
            container: container.clone(),
            from: from.clone(),
            members: Vec::new(),
            placeholders: Vec::new(),
        };
        for (i, m, f) in &driver {
            let Some((dir, file)) = folder_of(&m.container_path) else {
                continue;
            };
            let wanted = match name {
                "lib" => !matches!(f.kind, FileKind::Binary | FileKind::Socket),
                "bin" => f.kind == FileKind::Binary,
                _ => f.kind == FileKind::Firmware,
            };
            if dir != from || !wanted {
                continue;
            }
            if ro(m) {
                folder.members.push(Member {
                    name: file.to_string(),
                    host: f.host_path.clone(),
                    soname: f.soname.clone().filter(|s| s != file && !s.contains('/')),
                });
                out.folded.push(*i);
            } else if name == "lib" && f.kind == FileKind::DeviceState {
                folder.placeholders.push(file.to_string());
                out.moved.push((*i, format!("{container}/{file}")));
            }
        }
        if name == "lib" && !folder.members.is_empty() {
            out.lib_from = Some(from);
        }
        if !folder.members.is_empty() {
            out.folders.push(folder);
        }
    }
    // Soname links must not collide with a member's own name.
    for f in &mut out.folders {
        let names: Vec<String> = f.members.iter().map(|m| m.name.clone()).collect();
        for m in &mut f.members {
            if m.soname.as_ref().is_some_and(|s| names.contains(s)) {
                m.soname = None;
            }
        }
    }
    out.folded.sort_unstable();
    (out.folded.len() >= out.folders.len() + 2).then_some(out)
}

/// A file name part from the driver version (anything but `[0-9A-Za-z._-]` becomes `_`).
fn version_part(v: &str) -> String {
    let s: String = v
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if s.is_empty() || s.starts_with('.') {
        format!("v{s}")
    } else {
        s
    }
}

/// Bumped whenever the content of a prepared directory changes shape, so a new gpufence never
/// reuses an old one's.
const LAYOUT_VERSION: &str = "gpufence driver folders v1";

/// What names a member file: its identity on the host (`stat`), read by the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: i64,
}

/// The prepared directory's name for `folding` (`<version>-<hash>`), from the driver version and
/// `ids`, one per member in folder order (as [`Folding::members`] lists them).
pub fn folder_name(driver_version: &str, folding: &Folding, ids: &[FileIdentity]) -> String {
    let mut id = LAYOUT_VERSION.as_bytes().to_vec();
    let mut ids = ids.iter();
    for f in &folding.folders {
        id.extend_from_slice(f.name.as_bytes());
        for m in &f.members {
            let Some(md) = ids.next() else { break };
            let line = format!(
                "\0{}\0{:?}\0{}:{}:{}:{}:{}\0",
                m.name, m.soname, md.dev, md.ino, md.size, md.mtime, md.mtime_nsec
            );
            id.extend_from_slice(line.as_bytes());
        }
        for p in &f.placeholders {
            id.extend_from_slice(format!("\0placeholder\0{p}").as_bytes());
        }
    }
    format!(
        "{}-{:016x}",
        version_part(driver_version),
        crate::fnv::fnv1a64(&id)
    )
}

impl Folding {
    /// Every member's host file, in folder order (the order [`folder_name`] takes identities in).
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.folders.iter().flat_map(|f| f.members.iter())
    }

    /// The plan rendered with the folders of `prepared` (pure): the plan's mounts with the folded
    /// file binds replaced by folder binds, its ld cache folders renamed, `PATH` naming the
    /// binaries' folder and `LD_LIBRARY_PATH` naming the ld cache's folders. `env` is the
    /// container's own (`None` where no container is known — a CDI spec: then no `PATH`, whose
    /// value would replace the image's, and `LD_LIBRARY_PATH` holds the folders alone).
    pub fn layout(
        &self,
        plan: &Plan,
        prepared: &Path,
        env: Option<ContainerEnv>,
        is_prepared: bool,
    ) -> DriverFolders {
        let first = self.folded.first().copied().unwrap_or(0);
        let mut out = Vec::with_capacity(plan.edits.mounts.len());
        let mut moved = Vec::new();
        for (i, m) in plan.edits.mounts.iter().enumerate() {
            if i == first {
                out.extend(self.folders.iter().map(|f| MountEdit {
                    host_path: prepared.join(f.name).display().to_string(),
                    container_path: f.container.clone(),
                    kind: None,
                    options: RO_BIND.iter().map(|s| s.to_string()).collect(),
                }));
            }
            if self.folded.binary_search(&i).is_ok() {
                continue;
            }
            if let Some((_, to)) = self.moved.iter().find(|(j, _)| *j == i) {
                let mut m = m.clone();
                m.container_path = to.clone();
                moved.push(m);
                continue;
            }
            out.push(m.clone());
        }
        // Read-write binds inside a folder go after the folder's own mount.
        let at = out
            .iter()
            .rposition(|m| self.folders.iter().any(|f| f.container == m.container_path))
            .map_or(out.len(), |p| p + 1);
        out.splice(at..at, moved);

        let ld_cache = plan.ld_cache.as_ref().map(|l| {
            let mut folders = l.folders.clone();
            if let Some(from) = &self.lib_from {
                for f in &mut folders {
                    if f == from {
                        *f = LIB_FOLDER.to_string();
                    }
                }
                folders.dedup();
            }
            LdCache { folders }
        });
        let mut path_env = Vec::new();
        if let Some(e) = &env
            && self.folders.iter().any(|f| f.container == BIN_FOLDER)
            && let Some(v) = appended(e.path.unwrap_or(DEFAULT_PATH), &[BIN_FOLDER.to_string()])
        {
            path_env.push(format!("PATH={v}"));
        }
        let library_path = ld_cache.as_ref().and_then(|l| {
            let current = env.as_ref().and_then(|e| e.ld_library_path).unwrap_or("");
            appended(current, &l.folders).map(|v| format!("LD_LIBRARY_PATH={v}"))
        });
        DriverFolders {
            dir: prepared.display().to_string(),
            prepared: is_prepared,
            mounts: out,
            ld_cache,
            env: path_env,
            library_path,
            files: self.folded.len(),
            folders: self.folders.len(),
            folding: self.clone(),
        }
    }

    /// Symlinks at the binaries' own paths (`/usr/bin/nvidia-smi` →
    /// `/usr/local/nvidia/bin/nvidia-smi`): `PATH` reaches the container's own process only,
    /// while `kubectl exec` / `runc exec` processes get the engine's env, and scripts name
    /// `/usr/bin/nvidia-smi`. (path in the container, link target)
    pub fn binary_links(&self) -> Vec<(String, String)> {
        self.folders
            .iter()
            .filter(|f| f.container == BIN_FOLDER)
            .flat_map(|f| {
                f.members.iter().map(|m| {
                    (
                        format!("{}/{}", f.from.trim_end_matches('/'), m.name),
                        format!("{BIN_FOLDER}/{}", m.name),
                    )
                })
            })
            .collect()
    }

    /// The folded libraries: their container path in [`LIB_FOLDER`], their host file.
    pub fn libraries(&self) -> Vec<(String, PathBuf)> {
        self.folders
            .iter()
            .filter(|f| f.container == LIB_FOLDER)
            .flat_map(|f| {
                f.members
                    .iter()
                    .map(|m| (format!("{LIB_FOLDER}/{}", m.name), m.host.clone()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{L, bind, file, folder_node as node};

    #[test]
    fn folds_libraries_binaries_and_firmware_of_their_main_folders() {
        let (inv, plan) = node("/host");
        let f = fold(&plan, &inv).expect("folds");
        let names: Vec<(&str, &str, usize)> = f
            .folders
            .iter()
            .map(|d| (d.name, d.container.as_str(), d.members.len()))
            .collect();
        assert_eq!(
            names,
            [
                ("lib", LIB_FOLDER, 3),
                ("bin", BIN_FOLDER, 1),
                ("firmware", "/lib/firmware/nvidia/580", 2)
            ]
        );
        // Mount indices: shim at 2 shifts the rest; the i386 library and the socket stay.
        assert_eq!(f.folded, [0, 1, 3, 6, 7, 8]);
        assert_eq!(f.moved, [(4, format!("{LIB_FOLDER}/timeline"))]);
        assert_eq!(f.lib_from.as_deref(), Some(L));
        assert_eq!(f.folders[0].placeholders, ["timeline"]);
        let cuda = &f.folders[0].members[0];
        assert_eq!(
            (cuda.name.as_str(), cuda.soname.as_deref()),
            ("libcuda.so.580", Some("libcuda.so.1"))
        );
        assert_eq!(f.folders[0].members[2].soname, None);
    }

    #[test]
    fn a_64_bit_library_folder_wins_a_tie() {
        // RHEL-style: /usr/lib holds the 32-bit libraries, /usr/lib64 the 64-bit ones.
        let files: Vec<DriverFile> = ["/usr/lib", "/usr/lib64"]
            .iter()
            .flat_map(|d| {
                [
                    "libcuda.so.580",
                    "libnvidia-ml.so.580",
                    "libnvidia-cfg.so.580",
                ]
                .map(|n| {
                    file(
                        &format!("/h{d}/{n}"),
                        &format!("{d}/{n}"),
                        FileKind::Library,
                        None,
                    )
                })
            })
            .collect();
        let mut plan = Plan::default();
        plan.edits.mounts = files.iter().map(|f| bind(f, &RO_BIND)).collect();
        let mut inv = Inventory::empty();
        inv.driver_files = files;
        let f = fold(&plan, &inv).unwrap();
        assert_eq!(f.lib_from.as_deref(), Some("/usr/lib64"));
        assert!(
            f.folders[0]
                .members
                .iter()
                .all(|m| m.host.starts_with("/h/usr/lib64"))
        );
    }

    #[test]
    fn nothing_folded_unless_two_mounts_are_saved() {
        let (mut inv, mut plan) = node("/host");
        inv.driver_files.truncate(2);
        plan.edits.mounts.truncate(2);
        // Two libraries into one folder saves one mount: not worth a folder.
        assert_eq!(fold(&plan, &inv), None);
        // A bind that is not at the file's own path, or not read-only, is never folded.
        let (inv, mut plan) = node("/host");
        for m in &mut plan.edits.mounts {
            m.container_path = format!("/elsewhere{}", m.container_path);
        }
        assert_eq!(fold(&plan, &inv), None);
    }

    #[test]
    fn layout_renders_mounts_ld_cache_and_path_leaving_the_plan_alone() {
        let (inv, mut plan) = node("/host");
        plan.ld_cache = Some(LdCache {
            folders: vec![L.to_string(), "/usr/lib/i386-linux-gnu".to_string()],
        });
        let before = plan.clone();
        let f = fold(&plan, &inv).unwrap();
        let env = ContainerEnv {
            path: Some("/usr/bin:/bin"),
            ld_library_path: Some("/opt/app/lib"),
        };
        let l = f.layout(&plan, Path::new("/prep/v-1"), Some(env), false);
        assert_eq!(plan, before, "the plan is not changed");
        let dest: Vec<&str> = l.mounts.iter().map(|m| m.container_path.as_str()).collect();
        assert_eq!(
            dest,
            [
                LIB_FOLDER,
                BIN_FOLDER,
                "/lib/firmware/nvidia/580",
                "/usr/local/nvidia/lib64/timeline",
                "/usr/lib/gpufence/libgpufence.so",
                "/usr/lib/i386-linux-gnu/libcuda.so.580",
                "/run/nvidia-persistenced/socket",
            ]
        );
        assert_eq!(l.mounts[0].host_path, "/prep/v-1/lib");
        assert_eq!(l.mounts[0].options, RO_BIND);
        assert_eq!(l.mounts[3].options, crate::plan::RW_STATE_BIND);
        assert_eq!(
            l.ld_cache.as_ref().unwrap().folders,
            [LIB_FOLDER, "/usr/lib/i386-linux-gnu"]
        );
        assert_eq!(l.env, [format!("PATH=/usr/bin:/bin:{BIN_FOLDER}")]);
        // The image's own LD_LIBRARY_PATH first, as it comes before the ld cache.
        assert_eq!(
            l.library_path.as_deref(),
            Some("LD_LIBRARY_PATH=/opt/app/lib:/usr/local/nvidia/lib64:/usr/lib/i386-linux-gnu")
        );
        assert_eq!((l.dir.as_str(), l.prepared), ("/prep/v-1", false));
        assert_eq!((l.files, l.folders), (f.folded.len(), f.folders.len()));
        assert_eq!(
            f.libraries()[0],
            (
                format!("{LIB_FOLDER}/libcuda.so.580"),
                PathBuf::from("/host/cuda")
            )
        );

        // A CDI spec (no container known): no PATH, whose value would replace the image's;
        // LD_LIBRARY_PATH the folders alone.
        let cdi = f.layout(&plan, Path::new("/p"), None, true);
        assert!(cdi.env.is_empty());
        assert_eq!(
            cdi.library_path.as_deref(),
            Some("LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/lib/i386-linux-gnu")
        );

        // PATH and LD_LIBRARY_PATH already naming the folders are left alone (NVIDIA's CUDA
        // images); no PATH at all gets the default.
        let (inv, mut plan) = node("/host");
        plan.ld_cache = Some(LdCache {
            folders: vec![L.to_string()],
        });
        let f = fold(&plan, &inv).unwrap();
        let path = format!("{BIN_FOLDER}:/bin");
        let cuda = ContainerEnv {
            path: Some(&path),
            ld_library_path: Some("/usr/local/nvidia/lib:/usr/local/nvidia/lib64"),
        };
        let l = f.layout(&plan, Path::new("/p"), Some(cuda), true);
        assert!(l.env.is_empty() && l.library_path.is_none(), "{l:?}");
        let bare = f.layout(&plan, Path::new("/p"), Some(ContainerEnv::default()), true);
        assert_eq!(bare.env, [format!("PATH={DEFAULT_PATH}:{BIN_FOLDER}")]);
        assert_eq!(
            bare.library_path.as_deref(),
            Some("LD_LIBRARY_PATH=/usr/local/nvidia/lib64")
        );
        // No ld cache in the plan: none in the layout, no LD_LIBRARY_PATH.
        plan.ld_cache = None;
        let l = f.layout(&plan, Path::new("/p"), None, true);
        assert_eq!((l.ld_cache, l.library_path), (None, None));
    }

    #[test]
    fn the_folder_name_follows_every_identity_and_the_version() {
        let (inv, plan) = node("/host");
        let f = fold(&plan, &inv).unwrap();
        let id = |ino| FileIdentity {
            dev: 1,
            ino,
            size: 10,
            mtime: 2,
            mtime_nsec: 3,
        };
        let ids: Vec<FileIdentity> = (0..f.members().count() as u64).map(id).collect();
        let a = folder_name("580.65.06", &f, &ids);
        assert!(
            a.starts_with("580.65.06-") && a.len() == "580.65.06-".len() + 16,
            "{a}"
        );
        assert_eq!(folder_name("580.65.06", &f, &ids), a, "deterministic");
        let mut upgraded = ids.clone();
        upgraded[0].ino = 99;
        assert_ne!(folder_name("580.65.06", &f, &upgraded), a);
        assert_ne!(folder_name("590.1", &f, &ids), a);
    }

    #[test]
    fn binary_links_point_into_the_bin_folder() {
        let (inv, plan) = node("/host");
        let f = fold(&plan, &inv).unwrap();
        assert_eq!(
            f.binary_links(),
            [(
                "/usr/bin/nvidia-smi".to_string(),
                format!("{BIN_FOLDER}/nvidia-smi")
            )]
        );
    }

    #[test]
    fn version_part_is_a_plain_name() {
        assert_eq!(version_part("580.65.06"), "580.65.06");
        assert_eq!(version_part("../x/y"), "v.._x_y");
        assert_eq!(version_part(""), "v");
    }
}
