//! The one interface every engine type answers ([`EngineConfig`]): which files gpufence writes
//! into the engine's configuration, what it passes into a container, and how those files are
//! given back.

use std::path::{Path, PathBuf};

use crate::engine::{ConfigureError, FileWrite};

/// Which pod annotations the engine puts into a container's OCI spec, where `gpufence-runtime`
/// reads the scheduler's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodAnnotations {
    /// Only these (containerd's runtime-handler `pod_annotations` / `container_annotations`,
    /// which gpufence writes): `gpufence_core::allocation::ANNOTATION_ALLOW_LIST`.
    AllowList(&'static [&'static str]),
    /// Every pod annotation (CRI-O); nothing to write.
    All,
    /// The engine has no pods (docker).
    NoPods,
}

/// What names an engine and how it is made to load a changed configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// Its name in file names, records and systemd (`containerd`, `crio`, `docker`).
    pub id: &'static str,
    /// Its name, as messages say it.
    pub name: &'static str,
    /// Its main configuration file, by default.
    pub default_config: &'static str,
    /// What to restart so that it loads a changed configuration.
    pub restart_hint: &'static str,
    /// Whether its daemon reloads its runtimes on SIGHUP (dockerd), and where its pid is.
    pub reload_on_hangup: Option<HangupReload>,
}

/// A daemon that reloads its runtimes on SIGHUP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HangupReload {
    /// Its name, as messages say it (`dockerd`).
    pub daemon: &'static str,
    /// Its pid file, as the host sees it.
    pub pid_file: &'static str,
}

/// One container engine — and for containerd, every config version it reads — behind one
/// interface, so that `runtime configure`/`unconfigure`, `install` and the CDI-directory check
/// ask the engine and never match on it. A new engine is one new type implementing this trait
/// (and a value of [`crate::engine::Engine`] naming it).
///
/// Paths: `root` is the host's root directory as mounted here; `config` (the engine's main file)
/// and every other path passed in or returned are as the host sees them, and so are written into
/// files; a [`FileWrite::path`] is where the file lies from here.
pub trait EngineConfig: Sync {
    /// Its names, main file and restart.
    fn identity(&self) -> &'static Identity;

    /// The drop-in file gpufence owns for the configuration `name` (the handler, or
    /// `<plugin>-nri`) beside the main file `config`; `None` where the engine has no drop-ins
    /// and the main file itself is edited (docker).
    fn drop_in(&self, config: &Path, name: &str) -> Option<PathBuf>;
    /// The engine files `configure` writes for `name` (the drop-in first): what `unconfigure`
    /// looks at when it has no record.
    fn written_files(&self, config: &Path, name: &str) -> Vec<PathBuf>;
    /// Which pod annotations reach the container.
    fn pod_annotations(&self) -> PodAnnotations;

    /// The runtime handler `handler` running `binary`: the files to write.
    fn runtime_handler(
        &self,
        root: &Path,
        config: &Path,
        binary: &Path,
        handler: &str,
    ) -> Result<Vec<FileWrite>, ConfigureError>;
    /// NRI enabled, its default validator requiring the plugin `name`: the files to write (its
    /// drop-in is kept under `crate::nri_config::config_name(name)`).
    fn nri(&self, root: &Path, config: &Path, name: &str)
    -> Result<Vec<FileWrite>, ConfigureError>;
    /// Where the engine starts pre-registered NRI plugins from (with the NRI drop-in for plugin
    /// `name` left out of what it reads); `None`: it has no NRI.
    fn nri_plugin_dir(&self, root: &Path, config: &Path, name: &str) -> Option<PathBuf>;
    /// The CDI spec directories the engine resolves CDI devices from, its default where its
    /// files set none; `Ok(None)`: it resolves no CDI devices through CRI (docker). The error
    /// names the file at fault.
    fn cdi_dirs(&self, root: &Path, config: &Path) -> Result<Option<Vec<PathBuf>>, String>;
    /// `text`, the engine file `path` (not gpufence's drop-in), without what `configure` added
    /// for `name` (the containerd `imports` entry, docker's `runtimes.<name>`); unchanged when it
    /// holds none.
    fn give_back(
        &self,
        config: &Path,
        name: &str,
        path: &Path,
        text: &str,
    ) -> Result<String, ConfigureError>;
}
