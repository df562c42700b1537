//! `gpufence hook update-ldcache --folder DIR…`: createContainer hook that refreshes the
//! container's ld cache so the mounted driver libraries resolve by soname (`dlopen("libcuda.so.1")`).
//!
//! Runs in the container's mount namespace before `pivot_root` (runc: cwd = rootfs), with the OCI
//! state on stdin. The rootfs is the image author's: nothing in it is executed and no path in it
//! is followed out of it.
//!
//! * The rootfs comes from the bundle's `config.json` (`root.path`, relative to the bundle).
//! * Every folder must be absolute with plain components; it is resolved with
//!   `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` — symlinks inside the image resolve as if
//!   the rootfs were `/`, never to the host — and must exist (the runtime created it for the
//!   mounts).
//! * `/etc/ld.so.conf.d/00-gpufence.conf` (the folders, so a later `ldconfig` in the container
//!   keeps them) and, when absent, `/etc/ld.so.conf` (`include /etc/ld.so.conf.d/*.conf`) are
//!   written through directory fds resolved the same way: a temporary file created with
//!   `O_CREAT|O_EXCL|O_NOFOLLOW`, then `renameat` (which replaces a planted symlink instead of
//!   following it).
//! * The cache is rebuilt by the HOST's static `ldconfig` with `-r ROOTFS`: ldconfig `chroot`s
//!   into the rootfs before reading anything, so its own symlink resolution (soname links,
//!   `include` globs, the cache file) is confined to the rootfs as well; the folders are also
//!   passed on its command line so they are indexed even if the image's `ld.so.conf` does not
//!   include `ld.so.conf.d`. Its env is cleared.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use serde::Deserialize;

use crate::exit::Exit;

/// The drop-in written into the container.
pub const CONF_FILE: &str = "etc/ld.so.conf.d/00-gpufence.conf";
/// Host ldconfig candidates (static on glibc distributions).
pub const LDCONFIG: [&str; 2] = ["/sbin/ldconfig", "/usr/sbin/ldconfig"];

#[derive(Debug, thiserror::Error)]
pub enum LdcacheError {
    #[error("OCI state on stdin: {0}")]
    State(String),
    #[error("{path}: {message}")]
    Bundle { path: PathBuf, message: String },
    #[error("--folder {0:?}: must be an absolute path without `.`/`..` components")]
    BadFolder(String),
    #[error("--folder {folder}: {errno} (resolved inside rootfs {rootfs})")]
    Resolve {
        folder: String,
        rootfs: PathBuf,
        errno: Errno,
    },
    #[error("rootfs {rootfs}: {what}: {errno}")]
    Rootfs {
        rootfs: PathBuf,
        what: String,
        errno: Errno,
    },
    #[error("no host ldconfig found ({})", LDCONFIG.join(", "))]
    NoLdconfig,
    #[error("{ldconfig} -r {rootfs}: {message}")]
    Ldconfig {
        ldconfig: String,
        rootfs: PathBuf,
        message: String,
    },
}

#[derive(Deserialize)]
struct State {
    #[serde(default)]
    id: String,
    bundle: PathBuf,
}

/// Check a folder argument: absolute, normal components only; returns it relative to `/`.
pub fn validate_folder(f: &str) -> Result<PathBuf, LdcacheError> {
    let p = Path::new(f);
    // `Path::components` silently drops `.`: check the raw components too.
    if !p.is_absolute() || f.contains('\0') || f.split('/').any(|c| c == "." || c == "..") {
        return Err(LdcacheError::BadFolder(f.to_string()));
    }
    let mut rel = PathBuf::new();
    for c in p.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => rel.push(n),
            _ => return Err(LdcacheError::BadFolder(f.to_string())),
        }
    }
    if rel.as_os_str().is_empty() {
        return Err(LdcacheError::BadFolder(f.to_string()));
    }
    Ok(rel)
}

fn in_root(flags: OFlag) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS)
}

/// Open (creating when missing) the directory `rel` inside the root `root`, every component
/// resolved inside the root.
fn ensure_dir(root: &OwnedFd, rel: &Path) -> Result<OwnedFd, Errno> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
    match nix::fcntl::openat2(root.as_fd(), rel, in_root(flags)) {
        Ok(fd) => Ok(fd),
        Err(Errno::ENOENT) => {
            let parent = rel.parent().unwrap_or(Path::new(""));
            let name = rel.file_name().ok_or(Errno::EINVAL)?;
            let pfd = if parent.as_os_str().is_empty() {
                root.try_clone().map_err(|_| Errno::EBADF)?
            } else {
                ensure_dir(root, parent)?
            };
            match nix::sys::stat::mkdirat(pfd.as_fd(), name, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(e),
            }
            nix::fcntl::openat2(pfd.as_fd(), name, in_root(flags))
        }
        Err(e) => Err(e),
    }
}

/// Replace `name` in directory `dir` with `contents`, never following a symlink.
fn replace_file(dir: &OwnedFd, name: &str, contents: &[u8]) -> Result<(), Errno> {
    // O_PATH fds cannot be used as openat dirfds for creation on all kernels: reopen the dir.
    let dirfd = nix::fcntl::openat(
        dir.as_fd(),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let tmp = format!(".{name}.gpufence-{}", std::process::id());
    let fd = nix::fcntl::openat(
        dirfd.as_fd(),
        tmp.as_str(),
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )?;
    let mut f = std::fs::File::from(fd);
    let res = f
        .write_all(contents)
        .and_then(|_| f.sync_all())
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)));
    if let Err(e) = res {
        let _ = nix::unistd::unlinkat(
            dirfd.as_fd(),
            tmp.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        return Err(e);
    }
    nix::fcntl::renameat(dirfd.as_fd(), tmp.as_str(), dirfd.as_fd(), name).inspect_err(|_| {
        let _ = nix::unistd::unlinkat(
            dirfd.as_fd(),
            tmp.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
    })
}

/// Refresh the ld cache of `rootfs` for `folders` (see the module docs).
pub fn update(rootfs: &Path, folders: &[String], ldconfig: &Path) -> Result<(), LdcacheError> {
    let rels: Vec<PathBuf> = folders
        .iter()
        .map(|f| validate_folder(f))
        .collect::<Result<_, _>>()?;
    let rerr = |what: &str| {
        let what = what.to_string();
        move |errno| LdcacheError::Rootfs {
            rootfs: rootfs.to_path_buf(),
            what,
            errno,
        }
    };
    let root = nix::fcntl::open(
        rootfs,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(rerr("open"))?;
    for (f, rel) in folders.iter().zip(&rels) {
        nix::fcntl::openat2(
            root.as_fd(),
            rel,
            in_root(OFlag::O_PATH | OFlag::O_DIRECTORY),
        )
        .map_err(|errno| LdcacheError::Resolve {
            folder: f.clone(),
            rootfs: rootfs.to_path_buf(),
            errno,
        })?;
    }

    let etc = ensure_dir(&root, Path::new("etc")).map_err(rerr("/etc"))?;
    let confd =
        ensure_dir(&root, Path::new("etc/ld.so.conf.d")).map_err(rerr("/etc/ld.so.conf.d"))?;
    let mut conf = String::from("# gpufence: driver libraries mounted into this container\n");
    for f in folders {
        conf.push_str(f);
        conf.push('\n');
    }
    replace_file(&confd, "00-gpufence.conf", conf.as_bytes())
        .map_err(rerr("/etc/ld.so.conf.d/00-gpufence.conf"))?;
    match nix::fcntl::openat2(root.as_fd(), "etc/ld.so.conf", in_root(OFlag::O_PATH)) {
        Ok(_) => {}
        Err(Errno::ENOENT) => {
            replace_file(&etc, "ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n")
                .map_err(rerr("/etc/ld.so.conf"))?
        }
        Err(e) => return Err(rerr("/etc/ld.so.conf")(e)),
    }

    // ldconfig, chrooted into the rootfs, still sees the container's procfs there: every
    // `/proc/<pid>/root` of the hook's own process (whose root is the host's until pivot_root)
    // must stay closed to it. Non-dumpable, this process's magic links need CAP_SYS_PTRACE,
    // which ldconfig never has (callers restrict it to `caps::LDCACHE`); exec makes ldconfig
    // itself dumpable again, but its own root is the chroot.
    nix::sys::prctl::set_dumpable(false).map_err(rerr("prctl(PR_SET_DUMPABLE)"))?;
    let out = Command::new(ldconfig)
        .arg("-r")
        .arg(rootfs)
        .args(folders)
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LdcacheError::Ldconfig {
            ldconfig: ldconfig.display().to_string(),
            rootfs: rootfs.to_path_buf(),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stderr);
        return Err(LdcacheError::Ldconfig {
            ldconfig: ldconfig.display().to_string(),
            rootfs: rootfs.to_path_buf(),
            message: format!(
                "{}: {}",
                out.status,
                msg.lines().last().unwrap_or("failed").trim()
            ),
        });
    }
    Ok(())
}

/// The host's ldconfig.
pub fn host_ldconfig() -> Result<PathBuf, LdcacheError> {
    LDCONFIG
        .iter()
        .map(PathBuf::from)
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
        .ok_or(LdcacheError::NoLdconfig)
}

/// The container's rootfs from the OCI state: `root.path` of `<bundle>/config.json`.
fn rootfs_from_state(state: &[u8]) -> Result<(String, PathBuf), LdcacheError> {
    let st: State =
        serde_json::from_slice(state).map_err(|e| LdcacheError::State(e.to_string()))?;
    let cfg_path = st.bundle.join("config.json");
    let text = std::fs::read(&cfg_path).map_err(|e| LdcacheError::Bundle {
        path: cfg_path.clone(),
        message: e.to_string(),
    })?;
    let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| LdcacheError::Bundle {
        path: cfg_path.clone(),
        message: e.to_string(),
    })?;
    let root = v
        .pointer("/root/path")
        .and_then(|p| p.as_str())
        .ok_or_else(|| LdcacheError::Bundle {
            path: cfg_path.clone(),
            message: "no root.path".to_string(),
        })?;
    Ok((st.id, st.bundle.join(root)))
}

pub fn run(config: Option<&Path>, folders: &[String]) -> Result<(), Exit> {
    let cfg = crate::config::Config::load(config)?;
    crate::logging::init(&cfg);
    let mut state = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin(), &mut state)
        .map_err(|e| Exit::invalid(LdcacheError::State(e.to_string())))?;
    let (id, rootfs) = rootfs_from_state(&state).map_err(Exit::invalid)?;
    if folders.is_empty() {
        tracing::info!(container = %id, "update-ldcache: no folders, nothing to do");
        return Ok(());
    }
    let ldconfig = host_ldconfig().map_err(Exit::env)?;
    // A createContainer hook runs with the runtime's full capabilities; ldconfig needs only
    // these (without CAP_SYS_PTRACE, `/proc/<pid>/root` of runc init, a full-capability
    // process, stays closed to it).
    super::caps::restrict(super::caps::LDCACHE).map_err(|e| Exit::env(e.to_string()))?;
    match update(&rootfs, folders, &ldconfig) {
        Ok(()) => {
            tracing::info!(container = %id, rootfs = %rootfs.display(), folders = ?folders, "ld cache updated");
            Ok(())
        }
        Err(e) => {
            tracing::error!(container = %id, error = %e, "ld cache not updated");
            Err(match e {
                LdcacheError::BadFolder(_) | LdcacheError::Resolve { .. } => Exit::invalid(e),
                e => Exit::env(e),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_are_validated() {
        assert_eq!(
            validate_folder("/usr/lib/x86_64-linux-gnu").unwrap(),
            PathBuf::from("usr/lib/x86_64-linux-gnu")
        );
        for bad in ["usr/lib", "/usr/../etc", "/", "/a/./b", ""] {
            assert!(validate_folder(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn symlinks_stay_inside_the_rootfs() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("rootfs");
        let outside = d.path().join("outside");
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        // /etc -> the host directory `outside` (absolute path): must resolve inside the root.
        std::os::unix::fs::symlink(&outside, root.join("etc")).unwrap();
        std::fs::create_dir_all(root.join(outside.strip_prefix("/").unwrap())).unwrap();
        let rootfd =
            nix::fcntl::open(&root, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        let confd = ensure_dir(&rootfd, Path::new("etc/ld.so.conf.d")).unwrap();
        replace_file(&confd, "00-gpufence.conf", b"/usr/lib\n").unwrap();
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "nothing written outside"
        );
        // The symlink target was created inside the root instead.
        let inside = root
            .join(outside.strip_prefix("/").unwrap())
            .join("ld.so.conf.d/00-gpufence.conf");
        assert_eq!(std::fs::read(inside).unwrap(), b"/usr/lib\n");
    }

    #[test]
    fn planted_symlink_file_is_replaced_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("rootfs");
        std::fs::create_dir_all(root.join("etc/ld.so.conf.d")).unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, root.join("etc/ld.so.conf.d/00-gpufence.conf"))
            .unwrap();
        let rootfd =
            nix::fcntl::open(&root, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        let confd = ensure_dir(&rootfd, Path::new("etc/ld.so.conf.d")).unwrap();
        replace_file(&confd, "00-gpufence.conf", b"/x\n").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let p = root.join("etc/ld.so.conf.d/00-gpufence.conf");
        assert!(
            !std::fs::symlink_metadata(&p)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn folder_symlinked_out_resolves_inside() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("rootfs");
        std::fs::create_dir_all(root.join("usr")).unwrap();
        // /usr/lib -> /nonexistent-on-purpose: inside the root it does not exist → refused.
        std::os::unix::fs::symlink("/definitely-not-in-root", root.join("usr/lib")).unwrap();
        let e = update(&root, &["/usr/lib".to_string()], Path::new("/bin/false")).unwrap_err();
        assert!(matches!(e, LdcacheError::Resolve { .. }), "{e}");
    }
}
