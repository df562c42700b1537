//! `gpufence-sim node --dir DIR --gpus N [--mig-gpu I] [--memory-mib M]`: a simulated GPU node.

use clap::Parser;

fn main() {
    let cli = gpufence::sim::Cli::parse();
    gpufence::exit::finish("gpufence-sim", gpufence::sim::run(cli))
}
