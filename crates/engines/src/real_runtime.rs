//! The host's real OCI runtime checked before gpufence is put in front of it: a release with a
//! known container escape is refused (`vulnerable`), run chrooted into the host root when
//! installing from a container; and how engine-file errors become exit codes.

use std::path::{Path, PathBuf};

use crate::exit::Exit;
use crate::unconfigure;

/// Invalid files are exit 1, failing writes exit 2.
pub fn apply_exit(e: unconfigure::ApplyError) -> Exit {
    match e {
        unconfigure::ApplyError::Io { .. } => Exit::env(e),
        e => Exit::invalid(e),
    }
}

/// The real runtime gpufence-runtime will exec (`runtime.path` of the configuration it reads:
/// GPUFENCE_CONFIG, else /etc/gpufence/config.toml; else runc or crun on PATH), asked for its
/// version with an empty environment under `timeouts.worker`; a release with a known container
/// escape is refused unless `allow` (then a warning on stderr). (`--config` after `configure`
/// names the engine's file, so gpufence-runtime's own lookup is used here.) For a host whose
/// root is mounted at `root` (not `/`: `gpufence install`), the host's configuration and runtime,
/// run chrooted there.
pub fn check_real_runtime(root: &Path, allow: bool) -> Result<(), Exit> {
    use crate::vulnerable::{Verdict, judge};
    let here = root == Path::new("/");
    let cfg = if here {
        crate::config::Config::load(None).map_err(Exit::invalid)?
    } else {
        let p = crate::configure::in_root(root, Path::new(crate::config::DEFAULT_CONFIG_PATH));
        match std::fs::read_to_string(&p) {
            Ok(t) => crate::config::Config::from_toml(&t, &p).map_err(Exit::invalid)?,
            Err(_) => crate::config::Config::default(),
        }
    };
    let rt = if here {
        gpufence_core::real_runtime::real_runtime(&cfg)?
    } else {
        match host_runtime(root, &cfg) {
            Ok(rt) => rt,
            Err(e) if allow => {
                eprintln!("warning: {} (--allow-vulnerable-runtime)", e.message);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    };
    let what = format!("{} --version", rt.display());
    let mut cmd = std::process::Command::new(&rt);
    cmd.arg("--version").env_clear();
    if !here {
        chroot_into(&mut cmd, root)?;
    }
    let out = crate::child::output_with_deadline(
        &what,
        &mut cmd,
        cfg.timeouts.worker(),
        crate::child::MAX_OUTPUT,
    );
    let problem = match out {
        Err(e) => format!("cannot check the real runtime: {e}"),
        Ok(f) if !f.success() => format!("cannot check the real runtime: {what}: {}", f.describe()),
        Ok(f) => match judge(&String::from_utf8_lossy(&f.out)) {
            Verdict::Fixed { .. } => return Ok(()),
            Verdict::Unknown(why) => {
                eprintln!("warning: {}: {why}", rt.display());
                return Ok(());
            }
            Verdict::Vulnerable(line) => format!("{}: {line}", rt.display()),
        },
    };
    if allow {
        eprintln!("warning: {problem} (--allow-vulnerable-runtime)");
        Ok(())
    } else {
        Err(Exit::env(format!(
            "{problem}; upgrade it (or set runtime.path to a fixed one), or pass \
             --allow-vulnerable-runtime"
        )))
    }
}

/// The host's runc or crun (as the host sees it): `runtime.path`, else the first under `root` in
/// the usual directories.
fn host_runtime(root: &Path, cfg: &crate::config::Config) -> Result<PathBuf, Exit> {
    if let Some(p) = &cfg.runtime.path {
        return Ok(p.clone());
    }
    let dirs = [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ];
    ["runc", "crun"]
        .iter()
        .flat_map(|n| dirs.iter().map(move |d| Path::new(d).join(n)))
        .find(|p| crate::configure::in_root(root, p).is_file())
        .ok_or_else(|| Exit::env(format!("{}: no runc or crun in the host", root.display())))
}

/// Make `cmd` run with `root` as its root directory (chroot in the child before exec).
pub fn chroot_into(cmd: &mut std::process::Command, root: &Path) -> Result<(), Exit> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let root = std::ffi::CString::new(root.as_os_str().as_bytes())
        .map_err(|_| Exit::invalid(format!("{}: NUL in path", root.display())))?;
    // SAFETY: the closure runs in the forked child before exec and only calls chroot(2) and
    // chdir(2) (async-signal-safe) on C strings prepared before the fork; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::chroot(root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}
