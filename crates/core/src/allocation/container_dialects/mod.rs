//! One reader per dialect. Each turns its inputs into a [`Part`]: the facets of the allocation
//! it expresses (devices, memory, cores, oversubscription), each with the key and value it came
//! from so that a disagreement between dialects names both.
//!
//! One file per dialect; this module holds what they share and re-exports them.

mod cdi_annotations;
mod gpufence_annotations;
mod gpushare_env;
mod hami_env;
pub mod koordlet_env;
mod nvidia_env;
mod part;

pub use cdi_annotations::*;
pub use gpufence_annotations::*;
pub use gpushare_env::*;
pub use hami_env::*;
pub use nvidia_env::*;
pub use part::{Facet, Part};
