//! `gpufence runtime configure`.
use std::path::Path;

use crate::exit::Exit;

#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// Register gpufence as a runtime handler.
    Configure,
}

pub fn run(_config: Option<&Path>, _cmd: Cmd) -> Result<(), Exit> {
    Err(Exit::env("not implemented yet"))
}
