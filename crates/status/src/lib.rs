//! What runs on this node's GPUs: `gpufence ps` and `gpufence exporter`.
//!
//! Data comes from the state directory only (never NVML): the host-written record of each GPU
//! container ([`meta`], written at create time) and the live accounting region its processes
//! share ([`region`]), read by [`read`] without trusting either. Refusals of container creation
//! are counted in [`refusals`].

#[cfg(feature = "exporter")]
pub mod exporter;
pub use gpufence_format::human;
pub mod ps;
pub mod read;
pub mod region;

// The decision's and the node's modules under the crate's own paths (`crate::plan`, …).
use gpufence_core::{config, exit, logging, text};
use gpufence_node::state;
// the state writer (crates/node), under the paths its readers have always used
pub use crate::state::{meta, refusals};
