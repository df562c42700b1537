//! Why the configuration can't be used: [`ConfigError`], one line naming the file and the key.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path}: {key} = {value:?}: {why}")]
    Invalid {
        path: PathBuf,
        key: &'static str,
        value: String,
        why: &'static str,
    },
}
