//! gpufence-engines: putting gpufence in front of a container engine and taking it away again.
//! Each engine is one type behind one trait ([`kinds`]: containerd per config version 2/3/4,
//! CRI-O, docker), which answers what its files hold (a runtime handler, or NRI with
//! [`nri_config`]), its CDI directories and what it gives back; [`configure`] asks it for the
//! engine's files keeping the operator's comments; [`unconfigure`] gives them back byte for byte; [`vulnerable`] and
//! [`real_runtime`] refuse a real runtime with a known container escape; [`install`] is what the
//! installer image runs on a node. Nothing here is on a container's create path.

pub mod cdi_dirs;
pub mod configure;
pub mod engine;
pub mod install;
pub mod kinds;
pub mod nri_config;
pub mod real_runtime;
pub mod unconfigure;
pub mod vulnerable;

pub use real_runtime::{apply_exit, check_real_runtime, chroot_into};

// The decision's ground under the crate's own paths (`crate::config`, …).
use gpufence_core::{child, config, exit, fnv};
