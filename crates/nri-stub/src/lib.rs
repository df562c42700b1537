//! gpufence-nri-stub: the NRI plugin wire, apart from any plugin's logic (as containerd/nri keeps
//! `pkg/stub` apart from its plugins). It knows nothing of GPUs; a plugin implements [`Handler`].
//!
//! Layers, bottom up:
//! * [`mux`] — NRI's connection multiplexer (frames of connection id + length on one socket);
//! * [`ttrpc`] — ttrpc's message framing and status codes (unary calls);
//! * [`conn`] — one live connection: a reader thread demultiplexing both directions, the
//!   plugin's ttrpc server (each request on its own thread) and its ttrpc client;
//! * [`service`] — the Plugin service's methods (Configure, Synchronize, CreateContainer,
//!   StopContainer, RemoveContainer, StateChange, ValidateContainerAdjustment, Shutdown) dispatched to a [`Handler`];
//! * [`plugin`] — connect (socket or the fd a runtime hands a pre-registered plugin), register,
//!   serve, reconnect with backoff;
//! * [`handler`] — what a plugin answers: the [`Handler`] trait;
//! * [`workers`] — the threads requests and decisions run on, kept for the next one.
//!
//! The NRI API is containerd/nri v0.12.0 (`proto/nri/api.proto`); see `docs/nri.md`.

#[allow(clippy::all, missing_docs)]
pub mod api;
pub mod conn;
pub mod handler;
pub mod mux;
pub mod plugin;
pub mod service;
pub mod ttrpc;
pub mod workers;

pub use handler::{Gone, Handler, Runtime};
pub use plugin::{
    DEFAULT_SOCKET, ENV_INDEX, ENV_NAME, ENV_SOCKET, NRI_VERSION, NriError, Plugin, PluginConfig,
    Stopper, Transport, check_index, check_name,
};
