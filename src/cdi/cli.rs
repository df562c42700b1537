//! `gpufence cdi generate|list`.
use std::path::Path;

use crate::exit::Exit;

#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// Write the node's CDI spec.
    Generate,
    /// Fully qualified device names, one a line.
    List,
}

pub fn run(_config: Option<&Path>, _cmd: Cmd) -> Result<(), Exit> {
    Err(Exit::env("not implemented yet"))
}
