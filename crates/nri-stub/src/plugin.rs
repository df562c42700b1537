//! The plugin's life: connect, register, serve until the connection ends, reconnect.
//!
//! Two ways in, as NRI's own plugin stub has them:
//! * a socket path (the DaemonSet variant, default `/var/run/nri/nri.sock`): dialled again with
//!   backoff whenever the runtime goes away (a runtime restart removes and recreates it);
//! * the connected socket a runtime hands the plugins it starts from `/opt/nri/plugins`
//!   (`NRI_PLUGIN_SOCKET=<fd>`): used once; when it ends the runtime is gone, and the plugin
//!   exits (the runtime starts it again when it comes back).
//!
//! On a connection: the reader thread serves the Plugin service, the plugin calls the Runtime
//! service's RegisterPlugin(name, index); the runtime then calls Configure (the events gpufence
//! subscribes to) and Synchronize, then the container events.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use prost::Message;

use crate::api;
use crate::conn::{Conn, Serve};
use crate::handler::{Handler, Runtime};
use crate::service::{Check, RUNTIME_SERVICE, Service};

/// How long the runtime gets to answer RegisterPlugin.
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(10);
/// First and longest wait between connection attempts.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The NRI version gpufence implements, sent in RegisterPlugin.
pub const NRI_VERSION: &str = "v0.12.0";
/// NRI's default socket for external plugins.
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
/// The environment a runtime gives a pre-registered plugin it starts from `/opt/nri/plugins`.
pub const ENV_SOCKET: &str = "NRI_PLUGIN_SOCKET";
pub const ENV_NAME: &str = "NRI_PLUGIN_NAME";
pub const ENV_INDEX: &str = "NRI_PLUGIN_IDX";

/// Why the plugin stopped or could not start. One line each.
#[derive(Debug, thiserror::Error)]
pub enum NriError {
    #[error("plugin name {0:?}: must be non-empty and only [a-zA-Z0-9_.+-] (NRI's rule)")]
    Name(String),
    #[error("plugin index {0:?}: must be two digits (NRI's rule)")]
    Index(String),
    #[error("{ENV_SOCKET}={0:?}: {1}")]
    InheritedFd(String, String),
    #[error("NRI connection handed over by the runtime was lost: {0}")]
    InheritedLost(String),
    #[error("NRI socket {0}: {1}")]
    Io(String, std::io::Error),
}

/// NRI's plugin name rule (`api.CheckPluginName`).
pub fn check_name(name: &str) -> Result<(), NriError> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+'));
    if ok {
        Ok(())
    } else {
        Err(NriError::Name(name.to_string()))
    }
}

/// NRI's plugin index rule (`api.CheckPluginIndex`): two ASCII digits.
pub fn check_index(index: &str) -> Result<(), NriError> {
    if index.len() == 2 && index.bytes().all(|b| b.is_ascii_digit()) {
        Ok(())
    } else {
        Err(NriError::Index(index.to_string()))
    }
}

/// Where the runtime is.
#[derive(Debug)]
pub enum Transport {
    /// Dial this socket (again after each loss).
    Socket(PathBuf),
    /// The connection the runtime handed over (`NRI_PLUGIN_SOCKET`).
    Inherited(OwnedFd),
}

/// How long the runtime gets to answer an UpdateContainers call.
pub const UPDATE_TIMEOUT: Duration = Duration::from_secs(5);

/// The runtime's service over one connection.
struct ConnRuntime(Arc<Conn>);

impl Runtime for ConnRuntime {
    fn update_containers(
        &self,
        update: Vec<api::ContainerUpdate>,
    ) -> Result<Vec<api::ContainerUpdate>, String> {
        let req = api::UpdateContainersRequest {
            update,
            evict: Vec::new(),
        };
        let out = self
            .0
            .call(
                RUNTIME_SERVICE,
                "UpdateContainers",
                req.encode_to_vec(),
                UPDATE_TIMEOUT,
            )
            .map_err(|e| e.to_string())?;
        api::UpdateContainersResponse::decode(out.as_slice())
            .map(|r| r.failed)
            .map_err(|e| format!("malformed UpdateContainers answer: {e}"))
    }
}

/// Who the plugin is and where it connects.
#[derive(Debug)]
pub struct PluginConfig {
    pub transport: Transport,
    /// Plugin name (what a runtime's `required_plugins` lists).
    pub name: String,
    /// Two-digit index: plugins are called in ascending order.
    pub index: String,
}

#[derive(Default)]
struct Control {
    stopped: Mutex<bool>,
    wake: Condvar,
    current: Mutex<Option<Arc<Conn>>>,
}

/// Stops a running [`Plugin`] from another thread: the current connection is closed and
/// [`Plugin::run`] returns.
#[derive(Clone)]
pub struct Stopper(Arc<Control>);

impl Stopper {
    pub fn stop(&self) {
        if let Ok(mut s) = self.0.stopped.lock() {
            *s = true;
        }
        self.0.wake.notify_all();
        if let Some(c) = self.0.current.lock().ok().and_then(|c| c.clone()) {
            c.shutdown();
        }
    }
}

/// An NRI plugin serving one [`Handler`].
pub struct Plugin {
    name: String,
    index: String,
    socket: Option<PathBuf>,
    inherited: Option<OwnedFd>,
    service: Arc<Service>,
    control: Arc<Control>,
}

/// How one connection ended.
struct Ended {
    registered: bool,
    why: String,
}

impl Plugin {
    /// A plugin for `handler`; the name and index must be valid for NRI.
    pub fn new(cfg: PluginConfig, handler: Arc<dyn Handler>) -> Result<Plugin, NriError> {
        check_name(&cfg.name)?;
        check_index(&cfg.index)?;
        let (socket, inherited) = match cfg.transport {
            Transport::Socket(p) => (Some(p), None),
            Transport::Inherited(fd) => (None, Some(fd)),
        };
        let service = Service::new(handler).named(&cfg.index, &cfg.name);
        Ok(Plugin {
            name: cfg.name,
            index: cfg.index,
            socket,
            inherited,
            service: Arc::new(service),
            control: Arc::new(Control::default()),
        })
    }

    pub fn stopper(&self) -> Stopper {
        Stopper(Arc::clone(&self.control))
    }

    fn stopped(&self) -> bool {
        self.control.stopped.lock().map(|s| *s).unwrap_or(true)
    }

    /// Wait `d`, or less if stopped meanwhile.
    fn pause(&self, d: Duration) {
        if let Ok(s) = self.control.stopped.lock() {
            let _ = self.control.wake.wait_timeout_while(s, d, |s| !*s);
        }
    }

    /// Serve until stopped (`Ok`) or, with an inherited connection, until it ends (`Err`).
    pub fn run(mut self) -> Result<(), NriError> {
        let mut backoff = BACKOFF_MIN;
        loop {
            if self.stopped() {
                return Ok(());
            }
            if let Some(fd) = self.inherited.take() {
                let ended = self.session(UnixStream::from(fd));
                if self.stopped() {
                    return Ok(());
                }
                return Err(NriError::InheritedLost(ended.why));
            }
            let Some(path) = self.socket.clone() else {
                return Ok(());
            };
            match UnixStream::connect(&path) {
                Ok(stream) => {
                    tracing::info!(socket = %path.display(), "NRI: connected");
                    let ended = self.session(stream);
                    if self.stopped() {
                        return Ok(());
                    }
                    if ended.registered {
                        backoff = BACKOFF_MIN;
                    }
                    tracing::warn!(socket = %path.display(), why = %ended.why, retry_in = ?backoff, "NRI: connection ended; reconnecting");
                }
                Err(e) => {
                    tracing::debug!(socket = %path.display(), error = %e, retry_in = ?backoff, "NRI: cannot connect");
                }
            }
            self.pause(backoff);
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// One connection: serve it, register, wait for it to end.
    fn session(&self, stream: UnixStream) -> Ended {
        let (conn, reader) = match Conn::new(stream) {
            Ok(c) => c,
            Err(e) => {
                return Ended {
                    registered: false,
                    why: format!("socket setup: {e}"),
                };
            }
        };
        if let Ok(mut cur) = self.control.current.lock() {
            *cur = Some(Arc::clone(&conn));
        }
        if self.stopped() {
            conn.shutdown();
        }
        let service = Arc::clone(&self.service);
        let serve: Serve = Arc::new(move |s: &str, m: &str, p: &[u8]| service.call(s, m, p));
        let c2 = Arc::clone(&conn);
        let thread = std::thread::Builder::new()
            .name("nri-reader".into())
            .spawn(move || c2.run_reader(reader, serve));
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                conn.shutdown();
                return Ended {
                    registered: false,
                    why: format!("cannot start the reader thread: {e}"),
                };
            }
        };
        let fencer = self.start_fencer(&conn);
        let registered = self.register(&conn);
        if !registered {
            conn.shutdown();
        }
        let why = match thread.join() {
            Ok(e) => e.to_string(),
            Err(_) => "reader thread panicked".to_string(),
        };
        // Ends the fencer's queue; its calls fail fast on the closed connection.
        self.service.set_fence_queue(None);
        if let Some(f) = fencer {
            let _ = f.join();
        }
        if let Ok(mut cur) = self.control.current.lock() {
            *cur = None;
        }
        Ended { registered, why }
    }

    /// The connection's after-the-fact worker: the containers the service queues (Synchronize,
    /// PostStartContainer) checked by the handler off the request path, with this connection
    /// to call the runtime back. `None` (and no checks) when no thread can be started.
    fn start_fencer(&self, conn: &Arc<Conn>) -> Option<std::thread::JoinHandle<()>> {
        let (tx, rx) = std::sync::mpsc::channel::<Check>();
        let handler = Arc::clone(self.service.handler());
        let rt = ConnRuntime(Arc::clone(conn));
        let spawned = std::thread::Builder::new()
            .name("nri-fence".into())
            .spawn(move || {
                for (pod, ctr) in rx {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        handler.after_the_fact(&rt, &pod, &ctr)
                    }));
                    if r.is_err() {
                        tracing::error!(container = %ctr.id, "NRI: after-the-fact check panicked");
                    }
                }
            });
        match spawned {
            Ok(t) => {
                self.service.set_fence_queue(Some(tx));
                Some(t)
            }
            Err(e) => {
                tracing::error!(error = %e, "NRI: cannot start the after-the-fact worker; containers created while the plugin was away are not checked");
                None
            }
        }
    }

    fn register(&self, conn: &Conn) -> bool {
        let req = api::RegisterPluginRequest {
            plugin_name: self.name.clone(),
            plugin_idx: self.index.clone(),
            nri_version: NRI_VERSION.to_string(),
        };
        match conn.call(
            RUNTIME_SERVICE,
            "RegisterPlugin",
            req.encode_to_vec(),
            REGISTRATION_TIMEOUT,
        ) {
            Ok(_) => {
                tracing::info!(name = %self.name, index = %self.index, "NRI: registered");
                true
            }
            Err(e) => {
                tracing::warn!(name = %self.name, index = %self.index, error = %e, "NRI: registration failed");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_indexes_follow_nri() {
        for ok in ["gpufence", "a.b+c_d-e", "X9"] {
            check_name(ok).unwrap();
        }
        for bad in ["", "gpu fence", "gpu/fence", "é", "a\n"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for ok in ["00", "10", "99"] {
            check_index(ok).unwrap();
        }
        for bad in ["", "1", "100", "a1", "١٢"] {
            assert!(check_index(bad).is_err(), "{bad:?}");
        }
    }
}
