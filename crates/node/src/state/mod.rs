//! The state writer: what the appliers record of each GPU container under `state-dir` (its
//! [`meta`], written at create time) and the count of refused creations ([`refusals`]), with the
//! bounded, link-refusing reads ([`open`]) their readers use. `gpufence ps` and the exporter
//! (the status crate) read what this writes.

pub mod meta;
pub mod open;
pub mod refusals;
