//! `gpufence nri [--socket PATH] [--name NAME] [--index NN]`: run the NRI plugin until stopped.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::exit::Exit;
use crate::nri::plugin::{Plugin, PluginConfig, Transport};
use crate::nri::{DEFAULT_SOCKET, ENV_INDEX, ENV_NAME, ENV_SOCKET, NriError};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The runtime's NRI socket (default /var/run/nri/nri.sock). Without it, a connection handed
    /// over by the runtime in NRI_PLUGIN_SOCKET (a plugin started from /opt/nri/plugins) is used.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Plugin name: what the runtime's `required_plugins` names.
    #[arg(long, env = ENV_NAME, default_value = "gpufence")]
    pub name: String,
    /// Two-digit plugin index (plugins are called in ascending order; 90: late, see
    /// `config::NRI_PLUGIN_INDEX`).
    #[arg(long, env = ENV_INDEX, default_value = crate::config::NRI_PLUGIN_INDEX)]
    pub index: String,
    /// Run inside this directory as the root (chroot) before anything else: the DaemonSet
    /// variant, whose pod mounts the host's `/` there, so that the configuration, state,
    /// devices, driver files and the paths written into adjustments are the host's.
    #[arg(long)]
    pub host_root: Option<PathBuf>,
    /// Do not validate the merged adjustment of every plugin (NRI's ValidateContainerAdjustment),
    /// as on a runtime that offers no validation: what other plugins add is then not checked at
    /// creation, and only the after-the-fact fence stands ([docs/nri.md]).
    #[arg(long)]
    pub no_validation: bool,
}

pub fn run(config: Option<&Path>, args: Args) -> Result<(), Exit> {
    if let Some(root) = &args.host_root {
        enter_host_root(root)?;
    }
    let cfg = crate::config::Config::load(config)?;
    crate::logging::init(&cfg);
    let transport =
        transport(args.socket, std::env::var(ENV_SOCKET).ok()).map_err(Exit::invalid)?;
    tracing::info!(name = %args.name, index = %args.index, ?transport, "NRI: gpufence nri starting");
    if args.no_validation {
        let line = "NRI: validation turned off (--no-validation): what other plugins add is not \
                    checked at creation; the after-the-fact fence stays";
        tracing::warn!("{line}");
        eprintln!("gpufence nri: {line}");
    }
    let handler = Arc::new(crate::nri::handler::from_config(cfg).validating(!args.no_validation));
    let plugin = Plugin::new(
        PluginConfig {
            transport,
            name: args.name,
            index: args.index,
        },
        handler,
    )
    .map_err(Exit::invalid)?;
    plugin.run().map_err(Exit::env)
}

/// chroot into `root` (the host's `/` as mounted in the plugin's pod) and move to its `/`.
fn enter_host_root(root: &Path) -> Result<(), Exit> {
    nix::unistd::chroot(root)
        .map_err(|e| Exit::env(format!("--host-root {}: chroot: {e}", root.display())))?;
    std::env::set_current_dir("/")
        .map_err(|e| Exit::env(format!("--host-root {}: chdir /: {e}", root.display())))
}

/// `--socket`, else the inherited connection in `NRI_PLUGIN_SOCKET`, else the default socket.
fn transport(socket: Option<PathBuf>, inherited: Option<String>) -> Result<Transport, NriError> {
    if let Some(p) = socket {
        return Ok(Transport::Socket(p));
    }
    match inherited {
        Some(v) => Ok(Transport::Inherited(inherited_fd(&v)?)),
        None => Ok(Transport::Socket(PathBuf::from(DEFAULT_SOCKET))),
    }
}

/// Take ownership of the socket fd named in `NRI_PLUGIN_SOCKET`: a number > 2 naming an open
/// socket, set close-on-exec (gpufence starts no program that should keep it).
fn inherited_fd(value: &str) -> Result<OwnedFd, NriError> {
    let bad = |why: String| NriError::InheritedFd(value.to_string(), why);
    let fd: RawFd = value
        .parse()
        .map_err(|_| bad("not a file descriptor number".into()))?;
    if fd <= 2 {
        return Err(bad("not a file descriptor above stdio".into()));
    }
    // SAFETY: fstat writes into the zeroed stat buffer we own; an invalid fd is an error return.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: see above; `fd` is only read.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(bad(format!("{}", std::io::Error::last_os_error())));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(bad("not a socket".into()));
    }
    // SAFETY: fd is open (fstat succeeded), is a socket the runtime handed to this process for
    // the plugin connection, and nothing else in gpufence owns or closes it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: F_SETFD on an fd we now own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, IntoRawFd};

    #[test]
    fn socket_flag_wins_then_inherited_then_default() {
        let t = transport(Some("/x.sock".into()), Some("3".into())).unwrap();
        assert!(matches!(t, Transport::Socket(p) if p == Path::new("/x.sock")));
        let t = transport(None, None).unwrap();
        assert!(matches!(t, Transport::Socket(p) if p == Path::new(DEFAULT_SOCKET)));
    }

    #[test]
    fn inherited_fd_must_be_an_open_socket_above_stdio() {
        for bad in ["", "x", "-1", "0", "2", "99999"] {
            let e = inherited_fd(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{ENV_SOCKET}={bad:?}")), "{e}");
        }
        let f = tempfile::tempfile().unwrap();
        let e = inherited_fd(&f.as_raw_fd().to_string()).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        let (a, _b) = UnixStream::pair().unwrap();
        let fd = a.into_raw_fd();
        let owned = inherited_fd(&fd.to_string()).unwrap();
        assert_eq!(owned.as_raw_fd(), fd);
    }

    #[test]
    fn a_missing_host_root_is_one_line_naming_it() {
        let e = enter_host_root(Path::new("/nonexistent-gpufence-host")).unwrap_err();
        assert!(
            e.message
                .starts_with("--host-root /nonexistent-gpufence-host: chroot: "),
            "{}",
            e.message
        );
    }

    use std::os::unix::net::UnixStream;
}
