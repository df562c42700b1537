//! `gpufence-runtime`: the runc wrapper, and `gpufence runtime configure`.
use std::ffi::OsString;

use crate::exit::Exit;

pub mod cli;

/// Entry point of `gpufence-runtime` (argv including argv[0]).
pub fn main(_args: Vec<OsString>) -> Result<(), Exit> {
    Err(Exit::env("not implemented yet"))
}
