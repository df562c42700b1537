//! The binaries' subcommands, one file each: arguments (clap) and the call into the crate that
//! does the work. Nothing here decides anything.

pub mod cdi;
pub mod hook;
pub mod install;
pub mod inventory;
pub mod nri;
pub mod plan;
pub mod runtime;
