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
    UpdateLdcache {
        /// Directory (inside the container) holding mounted driver libraries; repeatable.
        #[arg(long = "folder")]
        folder: Vec<String>,
    },
}

pub fn run(config: Option<&Path>, cmd: Cmd) -> Result<(), Exit> {
    match cmd {
        Cmd::UpdateLdcache { folder } => super::ldcache::run(config, &folder),
        _ => Err(Exit::env("not implemented yet")),
    }
}
