//! `gpufence nri`: the plan applied as an NRI plugin (containerd ≥ 1.7, CRI-O ≥ 1.26). An
//! applier: it reads the plan and renders it as NRI's `ContainerAdjustment`, never changing it;
//! nothing but `bin/` imports this module. The wire (mux, ttrpc, connection, the Plugin service,
//! register/serve/reconnect) is the `gpufence-nri-stub` crate, re-exported here under its old
//! paths; this module is the plugin's logic:
//! * [`request`] — what of the NRI request reaches the plan (allow-listed pod annotations, the
//!   container's identity);
//! * [`adjust`] — the plan rendered as the adjustment;
//! * [`handler`] — the handler the CLI builds from gpufence's configuration;
//! * [`fence`] — the after-the-fact fence: containers that reach a GPU without gpufence's
//!   fence (created while NRI had dropped the plugin), found at Synchronize and PostStart;
//! * [`validate`] — the last word: every plugin's merged adjustment checked against gpufence's
//!   decision (NRI's ValidateContainerAdjustment); [`facts`] — the node's side of it.

pub mod adjust;
pub mod facts;
pub mod fence;
pub mod handler;
pub mod request;
pub mod validate;

// The decision's and the node's modules under the crate's own paths (`crate::plan`, …).
use gpufence_core::{allocation, cdi, config, exit, fsutil, inventory, kubelet, plan, text};
use gpufence_node::{cgroup, driverfolders, hostfiles, state};

pub use gpufence_nri_stub::{
    DEFAULT_SOCKET, ENV_INDEX, ENV_NAME, ENV_SOCKET, Gone, Handler, NRI_VERSION, NriError, Plugin,
    PluginConfig, Runtime, Stopper, Transport, api, check_index, check_name, conn, mux, plugin,
    service, ttrpc,
};
