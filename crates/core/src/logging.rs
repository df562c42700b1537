//! `tracing` to the file named in `log.file`: runtimes often discard stderr.
//!
//! The writer is a synchronous `Mutex<File>` (no background thread), because the hook must stay
//! single-threaded until it has joined the container's mount namespace.

use std::fs::OpenOptions;
use std::sync::Mutex;

use tracing_subscriber::EnvFilter;

use crate::config::{Config, LogFormat};

/// Install the global subscriber. Failing to open the log file is not fatal: decisions then go
/// to stderr, and the failure is reported there once.
pub fn init(cfg: &Config) {
    let filter = EnvFilter::try_new(&cfg.log.level).unwrap_or_else(|_| EnvFilter::new("info"));
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&cfg.log.file);
    match file {
        Ok(f) => {
            let builder = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(Mutex::new(f));
            let _ = match cfg.log.format {
                LogFormat::Json => builder.json().flatten_event(true).try_init(),
                LogFormat::Text => builder.try_init(),
            };
        }
        Err(e) => {
            eprintln!(
                "gpufence: cannot open log file {}: {e}; logging to stderr",
                cfg.log.file.display()
            );
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .try_init();
        }
    }
}
