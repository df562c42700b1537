//! One reader per dialect. Each turns its inputs into a [`Part`]: the facets of the allocation
//! it expresses (devices, memory, cores, oversubscription), each with the key and value it came
//! from so that a disagreement between dialects names both.
//!
//! One file per dialect; this module holds what they share and re-exports them.

mod cdi_annotations;
mod gpufence_annotations;
mod gpushare_env;
mod hami_env;
mod nvidia_env;

pub use cdi_annotations::*;
pub use gpufence_annotations::*;
pub use gpushare_env::*;
pub use hami_env::*;
pub use nvidia_env::*;

use crate::allocation::ForeignCdiDevice;
use crate::allocation::devices::Resolved;
use crate::config::Dialect;

/// One facet with its source.
#[derive(Debug, Clone, PartialEq)]
pub struct Facet<T> {
    pub values: T,
    pub key: String,
    pub value: String,
}

impl<T> Facet<T> {
    pub fn new(values: T, key: &str, value: &str) -> Self {
        Facet {
            values,
            key: key.to_string(),
            value: value.to_string(),
        }
    }
}

/// What one dialect says about the container.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub dialect: Dialect,
    /// gpufence devices (GPUs and MIG devices of this node), in the dialect's order.
    pub devices: Option<Facet<Vec<Resolved>>>,
    /// Per device (aligned with `devices`); `None` entries = no limit.
    pub memory: Option<Facet<Vec<Option<u64>>>>,
    pub cores: Option<Facet<Vec<Option<u8>>>>,
    pub oversubscribe: Option<Facet<bool>>,
    /// Devices of other CDI kinds.
    pub foreign: Vec<ForeignCdiDevice>,
}

impl Part {
    pub fn new(dialect: Dialect) -> Part {
        Part {
            dialect,
            devices: None,
            memory: None,
            cores: None,
            oversubscribe: None,
            foreign: Vec::new(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.devices.is_none()
            && self.memory.is_none()
            && self.cores.is_none()
            && self.oversubscribe.is_none()
            && self.foreign.is_empty()
    }
}
