//! `gpufence hook update-ldcache --folder DIR…` and the refresh behind it: the container's ld
//! cache gains the driver libraries, so they resolve by soname (`dlopen("libcuda.so.1")`),
//! without running `ldconfig` or any other process.
//!
//! Used three ways: by `gpufence-runtime` in-process before it execs runc (libraries known from
//! the plan, not mounted yet: [`Libraries::Known`]), by hook mode after its mounts, and as a
//! createContainer hook named by CDI specs (both: [`Libraries::Scan`] of the folders, where the
//! libraries are mounted by then). The rootfs is the image author's: nothing in it is executed,
//! no path in it is followed out of it, and nothing in it is opened unless it is a regular file
//! or a directory (a device node, FIFO or socket is never opened — not even to look at it).
//!
//! * Every folder must be absolute with plain components; it is resolved with
//!   `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` — symlinks inside the image resolve as if
//!   the rootfs were `/`, never to the host.
//! * A file is read only after an `O_PATH` open (which never reaches a driver's `open`) whose
//!   `fstat` says regular file, reopened through `/proc/self/fd` (the same inode), size-capped.
//! * The image's `/etc/ld.so.cache` is parsed ([`crate::ldso::cache`]) and every entry kept; an
//!   unreadable one (not a regular file, over [`MAX_CACHE_BYTES`], malformed) is replaced, as
//!   ld.so itself would ignore it. An entry per library is added the way `ldconfig -r ROOT DIR…`
//!   adds one (`DIR/soname`, before image entries of the same name), with a soname link beside
//!   the library (a symlink; an image file that is not a symlink is never replaced — the entry
//!   then names the library's own file).
//! * `/etc/ld.so.conf.d/00-gpufence.conf` (so the image's own later `ldconfig` keeps the folders),
//!   `/etc/ld.so.conf` when absent, the cache and the links are written through directory fds
//!   resolved the same way: a temporary created with `O_CREAT|O_EXCL|O_NOFOLLOW`, then
//!   `renameat` (which replaces a planted symlink, FIFO or device node instead of opening it).
//!   `ld.so.conf` is never read, and no directory is listed but the folders themselves.
//! * A musl image (a musl loader, no glibc loader, no cache) gets nothing: musl never reads a
//!   glibc cache. Any other image — glibc, or no loader at all — gets the cache.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{Mode, SFlag};

use crate::exit::Exit;
use crate::ldso::cache::{self, Cache, Entry};

/// The drop-in written into the container.
pub const CONF_FILE: &str = "etc/ld.so.conf.d/00-gpufence.conf";
/// The largest image cache read (a full distribution's is well under 1 MiB).
pub const MAX_CACHE_BYTES: u64 = 32 << 20;
/// The most directory entries looked at in one folder.
pub const MAX_FOLDER_ENTRIES: usize = 100_000;
/// glibc's dynamic loaders (x86-64, i386, x32, AArch64, ppc64le, arm hard-float).
const GLIBC_LOADERS: [&str; 6] = [
    "lib64/ld-linux-x86-64.so.2",
    "lib/ld-linux.so.2",
    "libx32/ld-linux-x32.so.2",
    "lib/ld-linux-aarch64.so.1",
    "lib64/ld64.so.2",
    "lib/ld-linux-armhf.so.3",
];
/// musl's.
const MUSL_LOADERS: [&str; 5] = [
    "lib/ld-musl-x86_64.so.1",
    "lib/ld-musl-i386.so.1",
    "lib/ld-musl-aarch64.so.1",
    "lib/ld-musl-armhf.so.1",
    "lib/ld-musl-powerpc64le.so.1",
];

#[derive(Debug, thiserror::Error)]
pub enum LdcacheError {
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
    #[error("rootfs {rootfs}: {what}: {message}")]
    Image {
        rootfs: PathBuf,
        what: String,
        message: String,
    },
}

/// A driver library to enter: its folder and file name in the container, and what ldconfig
/// would read from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    pub folder: String,
    pub file: String,
    pub soname: String,
    pub flags: i32,
    pub osversion: u32,
    /// The soname link is already in the folder (a prepared driver folder, `runtime.driver-layout
    /// = "folders"`): none is made in the rootfs, the entry names the link.
    pub linked: bool,
}

/// Where the libraries come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Libraries {
    /// Known from the plan (host files inspected before they are mounted).
    Known(Vec<Library>),
    /// The shared objects found in the folders (mounted by now), as ldconfig would find them.
    Scan,
}

/// What [`update`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The cache was written: entries added, the image cache's state.
    Written { added: usize, image_cache: String },
    /// A musl image: nothing written.
    Musl,
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

/// A name for a temporary beside its target: hidden, unique to this process and moment.
fn temp_name(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let pid = PID.get_or_init(std::process::id);
    format!(".{name}.gpufence-{pid}-{nanos}")
}

/// Create `name` in directory `dir` (`O_CREAT|O_EXCL|O_NOFOLLOW`: `EEXIST` where anything,
/// a symlink included, is there), [`readable_by_all`], holding `contents`; removed again when it
/// could not be written whole.
fn create_new(dir: &OwnedFd, name: &str, contents: &[u8]) -> Result<(), Errno> {
    let fd = nix::fcntl::openat(
        dir.as_fd(),
        name,
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )?;
    // No fsync: a rootfs being created does not outlive a host crash in a usable state anyway.
    let written = readable_by_all(&fd).and_then(|()| {
        std::fs::File::from(fd)
            .write_all(contents)
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
    });
    if written.is_err() {
        remove(dir, name);
    }
    written
}

fn remove(dir: &OwnedFd, name: &str) {
    let _ = nix::unistd::unlinkat(dir.as_fd(), name, nix::unistd::UnlinkatFlags::NoRemoveDir);
}

/// Replace `name` in directory `dir` with `contents`, never following a symlink and never
/// opening what is there: a new temporary beside it, then `renameat` replaces the directory
/// entry, so every reader sees the old or the new file.
fn replace_file(dir: &OwnedFd, name: &str, contents: &[u8]) -> Result<(), Errno> {
    let tmp = temp_name(name);
    create_new(dir, &tmp, contents)?;
    let renamed = nix::fcntl::renameat(dir.as_fd(), tmp.as_str(), dir.as_fd(), name);
    if renamed.is_err() {
        remove(dir, &tmp);
    }
    renamed
}

/// Write `name` in directory `dir` with `contents`: created in place where nothing is there (one
/// file, no rename: the container has not started, nobody reads it half-written), else replaced
/// as [`replace_file`] does — never opening what the image has there.
fn write_file(dir: &OwnedFd, name: &str, contents: &[u8]) -> Result<(), Errno> {
    match create_new(dir, name, contents) {
        Err(Errno::EEXIST) => replace_file(dir, name, contents),
        done => done,
    }
}

/// Mode 0644 whatever the umask the engine started gpufence with: every user of the container
/// reads the ld cache and its configuration.
fn readable_by_all(fd: &OwnedFd) -> Result<(), Errno> {
    nix::sys::stat::fchmod(fd.as_fd(), Mode::from_bits_truncate(0o644))
}

/// What an `O_PATH` open found.
enum Found {
    /// Opened for reading, with its size as the `O_PATH` handle's `fstat` saw it.
    Regular(std::fs::File, u64),
    Missing,
    /// Something else (device node, FIFO, socket, directory): never opened.
    Other(SFlag),
}

/// Open `rel` under `dir` with `how` (must carry `O_PATH`), and read access only if it is a
/// regular file: the `O_PATH` fd is reopened through `/proc/self/fd`, the very inode checked.
fn open_regular(dir: &OwnedFd, rel: &Path, how: OpenHow) -> Result<Found, Errno> {
    let fd = match nix::fcntl::openat2(dir.as_fd(), rel, how) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(Found::Missing),
        Err(e) => return Err(e),
    };
    let st = nix::sys::stat::fstat(&fd)?;
    let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
    if kind != SFlag::S_IFREG {
        return Ok(Found::Other(kind));
    }
    let f = nix::fcntl::open(
        format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
        OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
        Mode::empty(),
    )?;
    Ok(Found::Regular(
        std::fs::File::from(f),
        u64::try_from(st.st_size).unwrap_or(0),
    ))
}

/// glibc's `_dl_is_dso`: `lib*.so*`, `ld-*.so*`, `ld.so.*`, `ld64.so.*`.
fn is_dso_name(n: &str) -> bool {
    ((n.starts_with("lib") || n.starts_with("ld-")) && n.contains(".so"))
        || n.starts_with("ld.so.")
        || n.starts_with("ld64.so.")
}

/// The shared objects in `folder` (regular files only; symlinks are links, not libraries), one
/// per soname: the newest file name by `_dl_cache_libcmp`, as ldconfig picks.
fn scan(dir: &OwnedFd, folder: &str) -> Result<Vec<Library>, Errno> {
    let rd = nix::fcntl::openat(
        dir.as_fd(),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut d = nix::dir::Dir::from_fd(rd)?;
    let mut found: Vec<Library> = Vec::new();
    let beneath = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    for (i, e) in d.iter().enumerate() {
        if i >= MAX_FOLDER_ENTRIES {
            return Err(Errno::E2BIG);
        }
        let e = e?;
        let Ok(name) = e.file_name().to_str() else {
            continue;
        };
        if !is_dso_name(name)
            || !matches!(e.file_type(), None | Some(nix::dir::Type::File))
            || name.contains(".gpufence-")
        {
            continue;
        }
        let Found::Regular(f, _) = open_regular(dir, Path::new(name), beneath)? else {
            continue;
        };
        let Some(dso) = crate::ldso::elf::inspect_file(&f) else {
            continue;
        };
        let soname = dso.soname.unwrap_or_else(|| name.to_string());
        let lib = Library {
            folder: folder.to_string(),
            file: name.to_string(),
            soname,
            flags: dso.flags,
            osversion: dso.osversion,
            linked: false,
        };
        match found.iter_mut().find(|l| l.soname == lib.soname) {
            Some(l) if cache::libcmp(l.file.as_bytes(), name.as_bytes()) < 0 => *l = lib,
            Some(_) => {}
            None => found.push(lib),
        }
    }
    Ok(found)
}

/// Make `dir/soname` a symlink to `file`. False when the image has something there that is not
/// a symlink (left alone).
fn soname_link(dir: &OwnedFd, soname: &str, file: &str) -> Result<bool, Errno> {
    match nix::fcntl::readlinkat(dir.as_fd(), soname) {
        Ok(t) if t.as_os_str() == file => Ok(true),
        Ok(_) => {
            let tmp = temp_name(soname);
            nix::unistd::symlinkat(file, dir.as_fd(), tmp.as_str())?;
            nix::fcntl::renameat(dir.as_fd(), tmp.as_str(), dir.as_fd(), soname).inspect_err(
                |_| {
                    let _ = nix::unistd::unlinkat(
                        dir.as_fd(),
                        tmp.as_str(),
                        nix::unistd::UnlinkatFlags::NoRemoveDir,
                    );
                },
            )?;
            Ok(true)
        }
        Err(Errno::ENOENT) => match nix::unistd::symlinkat(file, dir.as_fd(), soname) {
            Ok(()) => Ok(true),
            Err(Errno::EEXIST) => Ok(false),
            Err(e) => Err(e),
        },
        Err(Errno::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The image's cache: parsed, or why it is not used (then it is replaced).
fn read_image_cache(root: &OwnedFd) -> Result<(Option<Cache>, String), Errno> {
    let how = in_root(OFlag::O_PATH);
    let (f, size) = match open_regular(root, Path::new("etc/ld.so.cache"), how)? {
        Found::Missing => return Ok((None, "absent".into())),
        Found::Other(k) => return Ok((None, format!("not a regular file ({k:?}): replaced"))),
        Found::Regular(f, size) => (f, size),
    };
    // Sized from the handle's `fstat` (one `read` for the whole file instead of a doubling
    // series), never past the cap.
    let bytes = read_capped(&f, size)
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    if bytes.len() as u64 > MAX_CACHE_BYTES {
        return Ok((None, format!("over {MAX_CACHE_BYTES} bytes: replaced")));
    }
    match cache::parse(&bytes) {
        Ok(c) => {
            let n = c.entries.len();
            Ok((Some(c), format!("{n} entries kept")))
        }
        Err(e) => Ok((None, format!("malformed ({e}): replaced"))),
    }
}

/// `f` to its end or past [`MAX_CACHE_BYTES`]: one `read` of `size + 1` bytes, where `size` is
/// what its `fstat` said; only a file that read otherwise (it changed meanwhile) is read on.
fn read_capped(mut f: &std::fs::File, size: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = vec![0; usize::try_from(size.min(MAX_CACHE_BYTES) + 1).unwrap_or(0)];
    let n = loop {
        match f.read(&mut bytes) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    bytes.truncate(n);
    if n as u64 != size {
        f.take((MAX_CACHE_BYTES + 1).saturating_sub(n as u64))
            .read_to_end(&mut bytes)?;
    }
    Ok(bytes)
}

fn exists_in_root(root: &OwnedFd, rel: &str) -> bool {
    nix::fcntl::openat2(root.as_fd(), rel, in_root(OFlag::O_PATH)).is_ok()
}

fn dir_id(fd: &OwnedFd) -> Option<(u64, u64)> {
    nix::sys::stat::fstat(fd)
        .ok()
        .map(|st| (st.st_dev, st.st_ino))
}

/// (device, inode) of the directory of a cache entry's path, resolved inside the root.
fn entry_dir_id(
    root: &OwnedFd,
    value: &[u8],
    memo: &mut std::collections::HashMap<Vec<u8>, Option<(u64, u64)>>,
) -> Option<(u64, u64)> {
    let parent = Path::new(std::ffi::OsStr::from_bytes(value)).parent()?;
    let key = parent.as_os_str().as_bytes().to_vec();
    if let Some(id) = memo.get(&key) {
        return *id;
    }
    let rel = parent.strip_prefix("/").unwrap_or(parent);
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let id = nix::fcntl::openat2(
        root.as_fd(),
        rel,
        in_root(OFlag::O_PATH | OFlag::O_DIRECTORY),
    )
    .ok()
    .and_then(|fd| dir_id(&fd));
    memo.insert(key, id);
    id
}

/// `what` failed with an errno in `rootfs`, as a [`LdcacheError::Rootfs`].
fn rootfs_error(rootfs: &Path, what: &str) -> impl FnOnce(Errno) -> LdcacheError + use<> {
    let (rootfs, what) = (rootfs.to_path_buf(), what.to_string());
    move |errno| LdcacheError::Rootfs {
        rootfs,
        what,
        errno,
    }
}

/// The rootfs as an `O_PATH` directory handle, the root of every `RESOLVE_IN_ROOT` lookup.
fn open_rootfs(rootfs: &Path) -> Result<OwnedFd, LdcacheError> {
    nix::fcntl::open(
        rootfs,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(rootfs_error(rootfs, "open"))
}

/// Refresh the ld cache of `rootfs` for `folders` (see the module docs).
pub fn update(
    rootfs: &Path,
    folders: &[String],
    libs: &Libraries,
) -> Result<Outcome, LdcacheError> {
    let rels: Vec<PathBuf> = folders
        .iter()
        .map(|f| validate_folder(f))
        .collect::<Result<_, _>>()?;
    let rerr = |what: &str| rootfs_error(rootfs, what);
    let root = open_rootfs(rootfs)?;
    // Nothing at all is written into a musl image.
    let has_cache = exists_in_root(&root, "etc/ld.so.cache");
    if !has_cache
        && !GLIBC_LOADERS.iter().any(|l| exists_in_root(&root, l))
        && MUSL_LOADERS.iter().any(|l| exists_in_root(&root, l))
    {
        return Ok(Outcome::Musl);
    }

    // Before runc, the folders may not exist yet (runc would create them for the mounts).
    let known = matches!(libs, Libraries::Known(_));
    let mut dirs = Vec::with_capacity(folders.len());
    for (f, rel) in folders.iter().zip(&rels) {
        let d = if known {
            ensure_dir(&root, rel)
        } else {
            nix::fcntl::openat2(
                root.as_fd(),
                rel,
                in_root(OFlag::O_PATH | OFlag::O_DIRECTORY),
            )
        };
        dirs.push(d.map_err(|errno| LdcacheError::Resolve {
            folder: f.clone(),
            rootfs: rootfs.to_path_buf(),
            errno,
        })?);
    }

    let etc = ensure_dir(&root, Path::new("etc")).map_err(rerr("/etc"))?;
    let confd =
        ensure_dir(&root, Path::new("etc/ld.so.conf.d")).map_err(rerr("/etc/ld.so.conf.d"))?;
    let mut conf = String::from("# gpufence: driver libraries mounted into this container\n");
    for f in folders {
        conf.push_str(f);
        conf.push('\n');
    }
    write_file(&confd, "00-gpufence.conf", conf.as_bytes())
        .map_err(rerr("/etc/ld.so.conf.d/00-gpufence.conf"))?;
    if !exists_in_root(&root, "etc/ld.so.conf") {
        write_file(&etc, "ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n")
            .map_err(rerr("/etc/ld.so.conf"))?;
    }

    let libs: Vec<Library> = match libs {
        Libraries::Known(l) => l.clone(),
        Libraries::Scan => {
            let mut all = Vec::new();
            for (f, d) in folders.iter().zip(&dirs) {
                all.extend(scan(d, f).map_err(rerr(&format!("listing {f}")))?);
            }
            all
        }
    };
    let (image, image_cache) = read_image_cache(&root).map_err(rerr("/etc/ld.so.cache"))?;
    let mut cache = image.unwrap_or_else(|| Cache {
        entries: Vec::new(),
        generator: Some(format!("gpufence {}", env!("CARGO_PKG_VERSION")).into_bytes()),
    });
    // ldconfig adds a command-line folder's libraries in reverse directory order; any order
    // gives the same cache as long as sonames differ, which they do within a folder.
    let mut ids = std::collections::HashMap::new();
    let dir_ids: Vec<Option<(u64, u64)>> = dirs.iter().map(dir_id).collect();
    for l in &libs {
        let Some((d, &here)) = folders
            .iter()
            .position(|f| *f == l.folder)
            .map(|i| (&dirs[i], &dir_ids[i]))
        else {
            continue;
        };
        // An image entry for this name in this very folder, under another spelling (`/lib64`
        // for `/usr/lib64`), is the same slot: ldconfig lists a directory once.
        cache.entries.retain(|e| {
            e.key != l.soname.as_bytes()
                || e.hwcaps.is_some()
                || here.is_none()
                || entry_dir_id(&root, &e.value, &mut ids) != here
        });
        let linked = l.file == l.soname
            || l.linked
            || soname_link(d, &l.soname, &l.file)
                .map_err(rerr(&format!("{}/{}", l.folder, l.soname)))?;
        let name = if linked { &l.soname } else { &l.file };
        let path = format!("{}/{name}", l.folder.trim_end_matches('/'));
        cache.add(Entry::new(&l.soname, &path, l.flags, l.osversion));
    }
    let bytes = cache::write(&cache).map_err(|e| LdcacheError::Image {
        rootfs: rootfs.to_path_buf(),
        what: "/etc/ld.so.cache".into(),
        message: e.to_string(),
    })?;
    write_file(&etc, "ld.so.cache", &bytes).map_err(rerr("/etc/ld.so.cache"))?;
    Ok(Outcome::Written {
        added: libs.len(),
        image_cache,
    })
}

/// Make each `(path, target)` a symlink in `rootfs` (binaries of a prepared driver folder at their
/// host paths), the way soname links are made: the parent resolved inside the rootfs (created
/// when missing), an existing symlink replaced, anything else of the image left as it is.
/// Returns how many links are in place.
pub fn link_in_root(rootfs: &Path, links: &[(String, String)]) -> Result<usize, LdcacheError> {
    if links.is_empty() {
        return Ok(0);
    }
    let rerr = |what: &str| rootfs_error(rootfs, what);
    let root = open_rootfs(rootfs)?;
    let mut made = 0;
    // The parent resolved once for the links that share it (the binaries: `/usr/bin`).
    let mut opened: Option<(&Path, OwnedFd)> = None;
    for (path, target) in links {
        let p = Path::new(path);
        let (Some(parent), Some(name)) = (p.parent(), p.file_name().and_then(|n| n.to_str()))
        else {
            return Err(LdcacheError::BadFolder(path.clone()));
        };
        let dir = match opened.take() {
            Some((at, dir)) if at == parent => dir,
            _ => {
                let rel = validate_folder(&parent.display().to_string())?;
                ensure_dir(&root, &rel).map_err(rerr(&parent.display().to_string()))?
            }
        };
        let dir = &opened.insert((parent, dir)).1;
        if soname_link(dir, name, target).map_err(rerr(path))? {
            made += 1;
        }
    }
    Ok(made)
}

/// What ldconfig would read from each host file mounted into `folders` (the plan's library
/// mounts, before they are mounted). Files that are not shared objects are left out.
pub fn known_libraries(mounts: &[(String, PathBuf)]) -> Vec<Library> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let Ok(cwd) = nix::fcntl::open(".", OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty()) else {
        return Vec::new();
    };
    mounts
        .iter()
        .filter_map(|(target, host)| {
            let p = Path::new(target);
            let (folder, file) = (p.parent()?.to_str()?, p.file_name()?.to_str()?);
            let Ok(Found::Regular(f, _)) = open_regular(&cwd, host, how) else {
                return None;
            };
            let dso = crate::ldso::elf::inspect_file(&f)?;
            Some(Library {
                folder: folder.to_string(),
                file: file.to_string(),
                soname: dso.soname.unwrap_or_else(|| file.to_string()),
                flags: dso.flags,
                osversion: dso.osversion,
                linked: false,
            })
        })
        .collect()
}

/// One log line for a refresh.
pub fn log_outcome(id: &str, rootfs: &Path, folders: &[String], o: &Outcome) {
    match o {
        Outcome::Written { added, image_cache } => {
            tracing::info!(container = %id, rootfs = %rootfs.display(), folders = ?folders, added, image_cache = %image_cache, "ld cache updated")
        }
        Outcome::Musl => {
            tracing::info!(container = %id, rootfs = %rootfs.display(), "musl image (no glibc loader, no ld.so.cache): no ld cache written")
        }
    }
}

/// The createContainer hook for container `id` with rootfs `rootfs` (from the OCI state and the
/// bundle's `config.json`, read and validated by the caller as every hook's are).
pub fn run(config: Option<&Path>, id: &str, rootfs: &Path, folders: &[String]) -> Result<(), Exit> {
    let cfg = crate::config::Config::load(config)?;
    crate::logging::init(&cfg);
    if folders.is_empty() {
        tracing::info!(container = %id, "update-ldcache: no folders, nothing to do");
        return Ok(());
    }
    // A createContainer hook runs with the runtime's full capabilities; the refresh needs only
    // these (no CAP_SYS_PTRACE: no `/proc/<pid>/root` of another process opens).
    super::caps::restrict(super::caps::LDCACHE).map_err(|e| Exit::env(e.to_string()))?;
    match update(rootfs, folders, &Libraries::Scan) {
        Ok(outcome) => {
            log_outcome(id, rootfs, folders, &outcome);
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
    fn a_file_is_created_where_absent_and_a_planted_symlink_replaced_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("rootfs");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, root.join("etc/ld.so.cache")).unwrap();
        let etc = nix::fcntl::open(
            &root.join("etc"),
            OFlag::O_PATH | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        write_file(&etc, "ld.so.conf", b"include x\n").unwrap();
        write_file(&etc, "ld.so.cache", b"new").unwrap();
        assert_eq!(
            std::fs::read(root.join("etc/ld.so.conf")).unwrap(),
            b"include x\n"
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(root.join("etc/ld.so.cache")).unwrap(), b"new");
        // Written again: replaced (no temporaries left behind).
        write_file(&etc, "ld.so.conf", b"include y\n").unwrap();
        assert_eq!(
            std::fs::read(root.join("etc/ld.so.conf")).unwrap(),
            b"include y\n"
        );
        assert_eq!(std::fs::read_dir(root.join("etc")).unwrap().count(), 2);
        // Created and replaced files alike are every user's to read.
        for f in ["ld.so.conf", "ld.so.cache"] {
            let mode = std::os::unix::fs::MetadataExt::mode(
                &std::fs::metadata(root.join("etc").join(f)).unwrap(),
            );
            assert_eq!(mode & 0o777, 0o644, "{f}");
        }
    }

    #[test]
    fn what_is_written_is_readable_by_all_whatever_the_umask() {
        use std::os::unix::fs::OpenOptionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        // As a file created under umask 077 would be.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)
            .unwrap();
        readable_by_all(&OwnedFd::from(f)).unwrap();
        assert_eq!(
            std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&p).unwrap()) & 0o777,
            0o644
        );
    }

    #[test]
    fn a_cache_reads_whole_whatever_size_its_fstat_said() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c");
        let body: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        std::fs::write(&p, &body).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        for said in [40_000, 0, 10, 39_999, 40_001, 1 << 20] {
            use std::io::Seek;
            (&f).rewind().unwrap();
            assert_eq!(read_capped(&f, said).unwrap(), body, "fstat said {said}");
        }
    }

    #[test]
    fn folder_symlinked_out_resolves_inside() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("rootfs");
        std::fs::create_dir_all(root.join("usr")).unwrap();
        // /usr/lib -> /nonexistent-on-purpose: inside the root it does not exist → refused.
        std::os::unix::fs::symlink("/definitely-not-in-root", root.join("usr/lib")).unwrap();
        let e = update(&root, &["/usr/lib".to_string()], &Libraries::Scan).unwrap_err();
        assert!(matches!(e, LdcacheError::Resolve { .. }), "{e}");
    }
}
