//! The formats gpufence's host side (`gpufence`, `gpufence-runtime`) and its shim
//! (`libgpufence.so`, preloaded into every container process) share, in one crate both depend on:
//!
//! * [`quota`] — the quota file the host writes into `state-dir/<id>/quota` and the shim reads;
//! * [`region`] — the container-wide accounting region every process of a container maps, with
//!   its observability block ([`region::stats`]), which `gpufence ps` and the exporter decode;
//! * [`human`] — byte counts for people, in the shim's refusal messages and `gpufence ps`.
//!
//! Everything here runs inside arbitrary container processes: `core`/`alloc`/`libc` only, no
//! allocation on the charge path, no panic on input.

pub mod human;
pub mod quota;
pub mod region;
