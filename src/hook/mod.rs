//! `gpufence hook …`: enforcement as an OCI hook (CRI-O / podman hooks.d).
pub mod cli;
pub mod ldcache;
