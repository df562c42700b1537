//! gpufence-records: what the node recorded, read strictly — the reading only, no decision.
//!
//! - [`kubelet`] — kubelet's device-manager checkpoint (what the device plugins gave each
//!   container) and its DRA state (claims, their pods and CDI device ids);
//! - [`cdi`] — Container Device Interface specs: types, qualified names, validation, loading
//!   spec directories.
//!
//! It stands on `gpufence-ground` only; `gpufence-core` re-exports both modules under their old
//! paths (`gpufence_core::kubelet`, `gpufence_core::cdi`) and decides with what they read.

pub mod cdi;
pub mod kubelet;
