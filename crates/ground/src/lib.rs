//! gpufence-ground: what every layer of gpufence shares and that needs nothing else of it — the
//! text rules ([`text`]: clipping untrusted text for messages, short ids, container ids). It
//! imports no other crate of the workspace; `gpufence-core` re-exports it as `gpufence_core::text`.

pub mod text;
