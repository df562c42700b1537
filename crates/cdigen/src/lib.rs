//! `gpufence cdi generate|list`: the node's GPUs as a CDI spec — the third applier of the plan's
//! edits (beside the runtime's spec edits and the hook's namespace edits). The CDI format itself
//! (types, names, validation, minimum version, loading) is [`crate::cdi`].

pub mod generate;

// The decision's and the node's modules under the crate's own paths (`crate::plan`, …).
use gpufence_core::{cdi, config, fsutil, inventory, plan};
