//! `gpufence inventory [--json]`.
use std::path::Path;

use crate::exit::Exit;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_config: Option<&Path>, _args: Args) -> Result<(), Exit> {
    Err(Exit::env("not implemented yet"))
}
