//! `gpufence-sim`: a whole simulated GPU node for tests and the demo.
use std::path::PathBuf;

use crate::exit::Exit;

#[derive(clap::Parser, Debug)]
#[command(name = "gpufence-sim", about = "Build a simulated GPU node")]
pub enum Cli {
    /// Build a simulated node in DIR and print the path of its config.toml.
    Node {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 4)]
        gpus: u32,
        #[arg(long)]
        mig_gpu: Option<u32>,
        #[arg(long)]
        memory_mib: Option<u64>,
    },
}

pub fn run(_cli: Cli) -> Result<(), Exit> {
    Err(Exit::env("not implemented yet"))
}
