//! What [`crate::configure`], [`crate::nri_config`] and [`crate::unconfigure`] share: which
//! engine, which applier, one file to write and why it can't be, and the helpers that read an
//! engine's files (containerd's main file parsed, its `imports` entry, the drop-in's place).

use std::path::{Path, PathBuf};

use toml_edit::{Array, DocumentMut, value};

/// First line of every file gpufence writes itself (its drop-ins).
pub const OWN_FILE_MARK: &str = "# Written by `gpufence runtime configure";

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Containerd,
    Crio,
    Docker,
}

impl Engine {
    /// The engine's name, as messages say it.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Containerd => "containerd",
            Engine::Crio => "CRI-O",
            Engine::Docker => "docker",
        }
    }
    pub fn default_config(self) -> &'static str {
        match self {
            Engine::Containerd => "/etc/containerd/config.toml",
            Engine::Crio => "/etc/crio/crio.conf",
            Engine::Docker => "/etc/docker/daemon.json",
        }
    }
    pub fn restart_hint(self) -> &'static str {
        match self {
            Engine::Containerd => "restart containerd to load the gpufence runtime handler",
            Engine::Crio => "restart CRI-O (or send it SIGHUP) to load the gpufence runtime",
            Engine::Docker => "restart dockerd (or `kill -HUP` it) to load the gpufence runtime",
        }
    }
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

/// The drop-in file `configure` owns for `engine` (as the host sees it), if the engine has one.
pub fn drop_in_path(engine: Engine, config: &Path, handler: &str) -> Option<PathBuf> {
    let dir = config.parent().unwrap_or(Path::new("/"));
    match engine {
        Engine::Containerd => Some(dir.join("conf.d").join(format!("{handler}.toml"))),
        Engine::Crio => Some(dir.join("crio.conf.d").join(format!("99-{handler}.conf"))),
        Engine::Docker => None,
    }
}

pub fn string_array<'a>(items: impl IntoIterator<Item = &'a str>) -> Array {
    let mut a = Array::new();
    for i in items {
        a.push(i);
    }
    a
}

/// The containerd main file's only change: an `imports` entry for `drop_in_path`, unless an
/// entry (the file, or a glob of its directory) already covers it.
pub fn add_import(doc: &mut DocumentMut, drop_in_path: &Path) -> Result<(), String> {
    let import = drop_in_path.display().to_string();
    let dir = drop_in_path.parent().map(|d| d.display().to_string());
    let covered = |s: &str| {
        s == import
            || dir
                .as_deref()
                .is_some_and(|d| s == format!("{d}/*.toml") || s == format!("{d}/*"))
    };
    match doc.get_mut("imports") {
        None => {
            doc.insert("imports", value(string_array([import.as_str()])));
        }
        Some(item) => {
            let arr = item
                .as_array_mut()
                .ok_or_else(|| "imports is not an array".to_string())?;
            if !arr.iter().any(|v| v.as_str().is_some_and(covered)) {
                arr.push(import.as_str());
            }
        }
    }
    Ok(())
}

/// A containerd main file parsed, with its config `version` (absent: 1).
pub fn parse_containerd(
    main: &str,
    main_path: &Path,
) -> Result<(DocumentMut, i64), ConfigureError> {
    let parse_err = |message: String| ConfigureError::Parse {
        path: main_path.to_path_buf(),
        message,
    };
    let doc: DocumentMut = main
        .parse()
        .map_err(|e: toml_edit::TomlError| parse_err(e.message().to_string()))?;
    let version = match doc.get("version") {
        None => 1,
        Some(v) => v
            .as_integer()
            .ok_or_else(|| parse_err("version is not an integer".to_string()))?,
    };
    Ok((doc, version))
}
