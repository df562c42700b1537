//! The pass-through path: every runc call but `create`, `run` and `delete` (`start`, `state`,
//! `kill`, `list`, `features`, … — eight or more per pod) is handed to the real runtime before
//! `gpufence-runtime` reads its configuration, sets up logging or std's start-up work.
//!
//! The one thing the configuration decides for such a call is which runtime to exec
//! (`runtime.path`, else a PATH search). That answer is memoised per configuration file in
//! [`CACHE_DIR`]: the slow path (which parses the file anyway) records the file's identity
//! (device, inode, size, mtime and ctime to the nanosecond) with the answer — the configured path,
//! or "search PATH". The pass-through path reads the record, checks the configuration file is
//! still the one recorded (one `stat`) and acts on it; only the file is memoised, never the
//! filesystem: a PATH search is redone on every call, and a runtime that turns out to be this
//! binary itself is never exec'd (the same checks as [`crate::real_runtime::real_runtime`]).
//! Anything missing, stale, not owned by this user or writable by others sends the call down
//! the slow path, which rewrites the record. The runtime is found from the runtime's own
//! environment (PATH, `GPUFENCE_CONFIG`: the engine's), never from a container's.

use std::ffi::{CStr, CString, OsStr, OsString, c_char};
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::config::{CONFIG_ENV, Config, DEFAULT_CONFIG_PATH};

/// What the static entry `gpufence-runtime` execs for `create`, `run`, `delete` and a
/// pass-through call without a fresh record: the wrapper binary beside it (the entry's own
/// directory, read from `/proc/self/exe`; never found on PATH), with [`WRAPPER_ARGV0`].
pub const WRAPPER_BINARY: &str = "gpufence-runtime-wrapper";

/// The wrapper's `argv[0]`: the name the engine called.
const WRAPPER_ARGV0: &CStr = c"gpufence-runtime";

/// Where the records live: root's, on the node's tmpfs (gone at reboot, as the engine's state).
pub const CACHE_DIR: &str = "/run/gpufence-runtime";

const MAGIC: &[u8] = b"gpufence-runtime-resolution-1";
const SEARCH: &[u8] = b"search";

/// The configuration file `Config::load(None)` reads, and whether it must exist.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    path: PathBuf,
    required: bool,
}

impl ConfigSource {
    /// `$GPUFENCE_CONFIG` (required), else the default path (absent means the defaults).
    pub fn from_env() -> ConfigSource {
        match std::env::var_os(CONFIG_ENV) {
            Some(p) => ConfigSource {
                path: PathBuf::from(p),
                required: true,
            },
            None => ConfigSource {
                path: PathBuf::from(DEFAULT_CONFIG_PATH),
                required: false,
            },
        }
    }
}

/// The identity of the configuration file as recorded: `absent`, or device, inode, size, mtime
/// and ctime. `None` when it cannot be had (a required file missing, any other error).
pub fn config_identity(src: &ConfigSource) -> Option<Vec<u8>> {
    match std::fs::metadata(&src.path) {
        Ok(m) => Some(crate::fileid::identity(&m).into_bytes()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !src.required => {
            Some(b"absent".to_vec())
        }
        Err(_) => None,
    }
}

/// The record's file name for a configuration path (FNV-1a of the path; the path itself is
/// inside the record and compared, so a collision only costs a miss).
fn record_name(config: &Path) -> String {
    format!(
        "{:016x}",
        crate::fnv::fnv1a64(config.as_os_str().as_bytes())
    )
}

/// Record what `cfg` (loaded from a file whose identity was `identity` before it was read)
/// answers for the real runtime. Best effort: a record not written only costs the next
/// pass-through call the slow path.
pub fn store(dir: &Path, src: &ConfigSource, identity: &[u8], cfg: &Config) -> std::io::Result<()> {
    // The file changed while it was being read: record nothing rather than a stale answer.
    if config_identity(src).as_deref() != Some(identity) {
        return Ok(());
    }
    let config = &src.path;
    if changed_lately(config) {
        return Ok(());
    }
    let answer: &[u8] = match &cfg.runtime.path {
        Some(p) => p.as_os_str().as_bytes(),
        None => SEARCH,
    };
    let mut rec = Vec::with_capacity(256);
    for field in [MAGIC, config.as_os_str().as_bytes(), identity, answer] {
        rec.extend_from_slice(field);
        rec.push(0);
    }
    if read_record(dir, config).as_deref() == Some(&rec[..]) {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(dir)
        .or_else(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                Ok(())
            } else {
                Err(e)
            }
        })?;
    let m = std::fs::symlink_metadata(dir)?;
    if !m.is_dir() || !trusted(&m) {
        return Err(std::io::Error::other(format!(
            "{}: not a directory of this user's, or writable by others",
            dir.display()
        )));
    }
    let name = record_name(config);
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let written = f.write_all(&rec).and_then(|()| {
        drop(f);
        std::fs::rename(&tmp, dir.join(&name))
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Whether the file was changed too recently for its identity to be recorded
/// ([`crate::fileid::SETTLE`]).
fn changed_lately(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| crate::fileid::changed_lately(&m))
}

/// Owned by this process's effective user, not writable by group or others.
fn trusted(m: &std::fs::Metadata) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    m.uid() == euid && m.permissions().mode() & 0o022 == 0
}

/// The record for `config`, when it is a regular file this user owns and nobody else may write.
fn read_record(dir: &Path, config: &Path) -> Option<Vec<u8>> {
    let m = std::fs::symlink_metadata(dir).ok()?;
    if !m.is_dir() || !trusted(&m) {
        return None;
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(record_name(config)))
        .ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file() || !trusted(&m) || m.len() > 8192 {
        return None;
    }
    // Records are replaced by rename, never rewritten: the size just read is the record's.
    let mut rec = vec![0; usize::try_from(m.len()).ok()?];
    f.read_exact(&mut rec).ok()?;
    Some(rec)
}

/// What the record answers, when the configuration file is still the one it was made from:
/// `Some(Some(path))` for `runtime.path`, `Some(None)` for a PATH search.
fn lookup(dir: &Path, src: &ConfigSource) -> Option<Option<PathBuf>> {
    let config = &src.path;
    let rec = read_record(dir, config)?;
    let mut fields = rec.split(|&b| b == 0);
    let (magic, path, identity, answer) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    if magic != MAGIC
        || path != config.as_os_str().as_bytes()
        || fields.next() != Some(&[][..])
        || fields.next().is_some()
        || config_identity(src).as_deref() != Some(identity)
    {
        return None;
    }
    Some((answer != SEARCH).then(|| PathBuf::from(OsStr::from_bytes(answer))))
}

/// The real runtime for a pass-through call, as [`crate::real_runtime::real_runtime`] would
/// answer it, or `None` (no fresh record; this binary itself; nothing on PATH). `path_env` is
/// the runtime's own PATH.
pub fn resolve(dir: &Path, src: &ConfigSource, path_env: Option<&OsStr>) -> Option<PathBuf> {
    match lookup(dir, src)? {
        // As real_runtime: the configured path, unless it is this binary; a missing one goes
        // to the slow path, whose exec reports it.
        Some(p) => crate::real_runtime::exists_apart_from_this_binary(&p).then_some(p),
        None => crate::real_runtime::search_path(path_env),
    }
}

/// Hand a pass-through call to the real runtime: returns only when the call needs the wrapper
/// (`create`, `run`, `delete`) or no fresh record answers, and the slow path must run.
///
/// # Safety
/// `argv` must hold `argc` valid NUL-terminated strings followed by a null pointer, as C's
/// `main` receives them, and no other thread may be running.
pub unsafe fn exec_unless_wrapped(argc: usize, argv: *const *const c_char) {
    // SAFETY: the caller hands `main`'s argv: `argc` valid C strings.
    let args: Vec<&CStr> = (1..argc)
        .map(|i| unsafe { CStr::from_ptr(*argv.add(i)) })
        .collect();
    if crate::args::needs_wrapper(&args) {
        return;
    }
    let path_env = std::env::var_os("PATH");
    let src = ConfigSource::from_env();
    let Some(rt) = resolve(Path::new(CACHE_DIR), &src, path_env.as_deref()) else {
        return;
    };
    let Ok(rt) = CString::new(OsString::from(rt).into_vec()) else {
        return;
    };
    let mut new_argv: Vec<*const c_char> = Vec::with_capacity(argc + 1);
    new_argv.push(rt.as_ptr());
    new_argv.extend(args.iter().map(|a| a.as_ptr()));
    new_argv.push(std::ptr::null());
    unsafe extern "C" {
        static environ: *const *const c_char;
    }
    // What the slow path hands the runtime too: closed standard fds as `/dev/null`, SIGPIPE at
    // its default (`tests/runtime_start.rs`).
    crate::exit::std_fds_on_dev_null();
    // SAFETY: SIG_DFL for SIGPIPE before any thread exists has no other effect.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // SAFETY: `rt` and every argument outlive the call; the argument vector is null-terminated;
    // `environ` is libc's, unchanged since the process started (no thread, no setenv). On
    // success execve does not return; on failure the slow path runs and reports.
    unsafe { libc::execve(rt.as_ptr(), new_argv.as_ptr(), environ) };
}

/// Hand the call to the wrapper: exec [`WRAPPER_BINARY`] from this binary's own directory with
/// [`WRAPPER_ARGV0`] and the call's arguments. Returns only when that fails, with the exit code
/// after one line on stderr naming the binary.
///
/// # Safety
/// As [`exec_unless_wrapped`].
pub unsafe fn exec_wrapper(argc: usize, argv: *const *const c_char) -> i32 {
    let wrapper = match std::fs::read_link("/proc/self/exe") {
        Ok(me) => me.with_file_name(WRAPPER_BINARY),
        Err(e) => {
            eprintln!("gpufence-runtime: /proc/self/exe: {e}");
            return 2;
        }
    };
    let Ok(path) = CString::new(wrapper.clone().into_os_string().into_vec()) else {
        eprintln!("gpufence-runtime: {}: NUL in path", wrapper.display());
        return 2;
    };
    let mut new_argv: Vec<*const c_char> = Vec::with_capacity(argc + 1);
    new_argv.push(WRAPPER_ARGV0.as_ptr());
    // SAFETY: the caller hands `main`'s argv: `argc` valid pointers after argv[0].
    new_argv.extend((1..argc).map(|i| unsafe { *argv.add(i) }));
    new_argv.push(std::ptr::null());
    unsafe extern "C" {
        static environ: *const *const c_char;
    }
    // SAFETY: `path` and every argument outlive the call; the vector is null-terminated;
    // `environ` is libc's, unchanged since the process started. On success execve does not
    // return.
    unsafe { libc::execve(path.as_ptr(), new_argv.as_ptr(), environ) };
    eprintln!(
        "gpufence-runtime: cannot run its wrapper {}: {}",
        wrapper.display(),
        std::io::Error::last_os_error()
    );
    2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("gpufence-passthrough-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn records_answer_until_the_configuration_changes() {
        let d = scratch("rec");
        std::fs::create_dir_all(&d).unwrap();
        let cfg_path = d.join("config.toml");
        let runtime = d.join("fake-runc");
        std::fs::write(&runtime, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
        let text = format!("[runtime]\npath = \"{}\"\n", runtime.display());
        std::fs::write(&cfg_path, &text).unwrap();
        let settle =
            || std::thread::sleep(crate::fileid::SETTLE + std::time::Duration::from_millis(20));
        let src = ConfigSource {
            path: cfg_path.clone(),
            required: true,
        };
        let load =
            || Config::from_toml(&std::fs::read_to_string(&cfg_path).unwrap(), &cfg_path).unwrap();
        let cache = d.join("cache");
        let res = |p: Option<&OsStr>| resolve(&cache, &src, p);

        // No record yet: the slow path. A file changed just now is not recorded yet.
        assert_eq!(res(None), None);
        let id = config_identity(&src).unwrap();
        store(&cache, &src, &id, &load()).unwrap();
        assert_eq!(res(None), None);
        settle();
        store(&cache, &src, &id, &load()).unwrap();
        assert_eq!(res(None), Some(runtime.clone()));
        // Stored again unchanged: the same record.
        store(&cache, &src, &id, &load()).unwrap();
        assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);

        // The configuration file changes (same size, new mtime/ctime): the record is stale.
        std::fs::write(&cfg_path, &text).unwrap();
        assert_eq!(res(None), None);
        settle();
        // A stale identity is never recorded over the file's new one.
        store(&cache, &src, &id, &load()).unwrap();
        assert_eq!(res(None), None);
        let id = config_identity(&src).unwrap();
        store(&cache, &src, &id, &load()).unwrap();
        assert_eq!(res(None), Some(runtime.clone()));

        // A record writable by others is not believed.
        let rec = cache.join(record_name(&cfg_path));
        std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(res(None), None);
        std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(res(None), Some(runtime.clone()));
        // Nor one reached through a symlinked directory.
        let link = d.join("cache-link");
        std::os::unix::fs::symlink(&cache, &link).unwrap();
        assert_eq!(resolve(&link, &src, None), None);
        assert!(store(&link, &src, &config_identity(&src).unwrap(), &load()).is_err());
        // Nor one that names another configuration file (a hash collision).
        let mut bytes = std::fs::read(&rec).unwrap();
        let at = bytes.iter().position(|&b| b == 0).unwrap() + 1;
        bytes[at + 1] ^= 1;
        std::fs::write(&rec, &bytes).unwrap();
        assert_eq!(res(None), None);

        // A configured runtime that is this binary itself is never the answer.
        let me = std::fs::read_link("/proc/self/exe").unwrap();
        std::fs::write(
            &cfg_path,
            format!("[runtime]\npath = \"{}\"\n", me.display()),
        )
        .unwrap();
        let id = config_identity(&src).unwrap();
        store(&cache, &src, &id, &load()).unwrap();
        assert_eq!(res(None), None);

        // No runtime.path: PATH is searched on every call, never memoised.
        std::fs::write(&cfg_path, "").unwrap();
        settle();
        let id = config_identity(&src).unwrap();
        store(&cache, &src, &id, &load()).unwrap();
        let bin = d.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        assert_eq!(res(Some(bin.as_os_str())), None);
        let found = bin.join("runc");
        std::fs::copy(&runtime, &found).unwrap();
        assert_eq!(res(Some(bin.as_os_str())), Some(found));
        // An absent default configuration is recorded as such; a required one never is.
        let absent = ConfigSource {
            path: d.join("none.toml"),
            required: false,
        };
        assert_eq!(config_identity(&absent).as_deref(), Some(&b"absent"[..]));
        let required = ConfigSource {
            required: true,
            ..absent
        };
        assert_eq!(config_identity(&required), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
