//! gpufence-engines: putting gpufence in front of a container engine and taking it away again.
//! [`configure`] computes the engine's files (containerd's config v2/v3/v4 drop-ins, CRI-O's
//! `crio.conf.d`, docker's `daemon.json`; a runtime handler, or NRI with [`nri_config`]) keeping
//! the operator's comments; [`unconfigure`] gives them back byte for byte; [`vulnerable`] and
//! [`real_runtime`] refuse a real runtime with a known container escape; [`install`] is what the
//! installer image runs on a node. Nothing here is on a container's create path.

pub mod cdi_dirs;
pub mod configure;
pub mod engine;
pub mod install;
pub mod nri_config;
pub mod real_runtime;
pub mod unconfigure;
pub mod vulnerable;

pub use real_runtime::{apply_exit, check_real_runtime, chroot_into};

// The decision's ground under the crate's own paths (`crate::config`, …).
use gpufence_core::{child, config, exit, fnv};
