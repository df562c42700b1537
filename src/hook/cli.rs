//! `gpufence hook prestart|create-runtime|install|update-ldcache`.
use std::path::Path;

use crate::exit::Exit;

#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// OCI prestart hook (state JSON on stdin).
    Prestart,
    /// OCI createRuntime hook (state JSON on stdin).
    CreateRuntime,
    /// createContainer hook: refresh the container's ld cache.
    UpdateLdcache,
}

pub fn run(_config: Option<&Path>, _cmd: Cmd) -> Result<(), Exit> {
    Err(Exit::env("not implemented yet"))
}
