//! What every dialect reader returns: a [`Part`], its facets each a [`Facet`] with the key and
//! value it came from.

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
