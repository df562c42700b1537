//! What the engine types ([`crate::kinds`]) and the flows above them ([`crate::configure`],
//! [`crate::unconfigure`], [`crate::install`]) share: which engine, which applier, one file to
//! write and why it can't be, and reading and placing files under the host's root.

use std::path::{Path, PathBuf};

use toml_edit::Array;

/// First line of every file gpufence writes itself (its drop-ins).
pub const OWN_FILE_MARK: &str = "# Written by `gpufence runtime configure";

/// Which engine (a CLI value, a record's key); [`Engine::config`] is the type that answers for
/// it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Containerd,
    Crio,
    Docker,
}

/// Which of gpufence's appliers `configure` (and `install`) sets up in the engine.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The `gpufence` runtime handler (`gpufence-runtime`, a RuntimeClass).
    #[default]
    Runtime,
    /// The NRI plugin (containerd ≥ 2.2): NRI enabled, its default validator requiring the
    /// plugin (`crate::nri_config`).
    Nri,
}

/// One file to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileWrite {
    pub path: PathBuf,
    pub contents: String,
    /// The file already has exactly these contents.
    pub unchanged: bool,
    /// Mode for a new file (an existing file keeps its own).
    pub mode: u32,
}

/// Why a configuration can't be written.
#[derive(Debug, thiserror::Error)]
pub enum ConfigureError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Unsupported { path: PathBuf, message: String },
}

pub fn read_optional(path: &Path) -> Result<Option<String>, ConfigureError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfigureError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

pub fn file_write(path: PathBuf, contents: String, mode: u32) -> Result<FileWrite, ConfigureError> {
    let unchanged = read_optional(&path)?.as_deref() == Some(contents.as_str());
    Ok(FileWrite {
        path,
        contents,
        unchanged,
        mode,
    })
}

/// `path` (as the host sees it) inside the host's root directory `root`.
pub fn in_root(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

pub fn string_array<'a>(items: impl IntoIterator<Item = &'a str>) -> Array {
    let mut a = Array::new();
    for i in items {
        a.push(i);
    }
    a
}
