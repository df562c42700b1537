//! `gpufence`: inventory, CDI, plan, hooks and runtime configuration.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "gpufence",
    version,
    about = "Node-side enforcement point for shared GPUs"
)]
struct Cli {
    /// Configuration file (default /etc/gpufence/config.toml; env GPUFENCE_CONFIG).
    #[arg(long, global = true, env = "GPUFENCE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// What the node has: GPUs, MIG devices, device nodes, driver files by capability.
    Inventory(gpufence::commands::inventory::Args),
    /// Describe the node's GPUs as a CDI spec.
    #[command(subcommand)]
    Cdi(gpufence::commands::cdi::Cmd),
    /// Dry run: the normalised allocation and the edits the runtime would make.
    Plan(gpufence::commands::plan::Args),
    /// OCI hook entry points for CRI-O / podman hooks.d.
    #[command(subcommand)]
    Hook(gpufence::commands::hook::Cmd),
    /// Register gpufence with a container runtime.
    #[command(subcommand)]
    Runtime(gpufence::commands::runtime::Cmd),
    /// Install gpufence on the node whose root is at --host-root: binaries, shim, config if
    /// absent, runtime handler, inventory cache, engine restart (what the installer image runs).
    Install(gpufence::commands::install::Args),
    /// Take back what `install` did: the engine's files byte-for-byte, gpufence's files.
    Uninstall(gpufence::commands::install::Args),
    /// Run as an NRI plugin of containerd / CRI-O: the plan as each container's adjustment.
    Nri(gpufence::commands::nri::Args),
    /// GPU containers on this node: pod, devices, memory used / quota / peak, refusals.
    Ps(gpufence::status::ps::Args),
    /// Prometheus metrics of this node's GPU containers on /metrics.
    #[cfg(feature = "exporter")]
    Exporter(gpufence::status::exporter::Args),
}

fn main() {
    let cli = Cli::parse();
    let config = cli.config.as_deref();
    let r = match cli.cmd {
        Cmd::Inventory(a) => gpufence::commands::inventory::run(config, a),
        Cmd::Cdi(c) => gpufence::commands::cdi::run(config, c),
        Cmd::Plan(a) => gpufence::commands::plan::run(config, a),
        Cmd::Hook(c) => gpufence::commands::hook::run(config, c),
        Cmd::Runtime(c) => gpufence::commands::runtime::run(config, c),
        Cmd::Install(a) => gpufence::commands::install::install(a),
        Cmd::Uninstall(a) => gpufence::commands::install::uninstall(a),
        Cmd::Nri(a) => gpufence::commands::nri::run(config, a),
        Cmd::Ps(a) => gpufence::status::ps::run(config, a),
        #[cfg(feature = "exporter")]
        Cmd::Exporter(a) => gpufence::status::exporter::run(config, a),
    };
    gpufence::exit::finish("gpufence", r)
}
