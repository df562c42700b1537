//! `gpufence plan --bundle DIR [--json]`.
use std::path::{Path, PathBuf};

use crate::exit::Exit;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The OCI bundle (directory holding config.json).
    #[arg(long, short = 'b')]
    pub bundle: PathBuf,
    /// Print JSON (stable interface) instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_config: Option<&Path>, _args: Args) -> Result<(), Exit> {
    Err(Exit::env("not implemented yet"))
}
