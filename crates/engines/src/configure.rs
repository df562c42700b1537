//! Register `gpufence-runtime` (or the NRI plugin) with a container engine, as drop-ins wherever
//! the engine has them, never rewriting what the operator wrote. What each engine's files hold is
//! its type's answer ([`crate::kinds`]: containerd's `conf.d/` drop-in and `imports` entry per
//! config version, CRI-O's `crio.conf.d/` drop-in, docker's `daemon.json` entry); this module
//! checks the handler's name, asks the engine ([`plan_writes_mode`]) and writes atomically
//! ([`write`]).

use std::path::Path;

pub use crate::engine::{
    ConfigureError, Engine, FileWrite, Mode, file_write, in_root, read_optional, string_array,
};
pub use gpufence_core::allocation::ANNOTATION_ALLOW_LIST;

/// The line `configure` prints about the node's trust mode: what the allow-listed annotations
/// it passes into containers are worth (`allocation.trust-annotations`,
/// docs/allocations-and-trust.md).
pub fn trust_mode_line(cfg: &crate::config::Config) -> String {
    use crate::config::TrustAnnotations;
    let from = cfg
        .source
        .as_ref()
        .map_or_else(|| "default".to_string(), |p| p.display().to_string());
    let mode = cfg.allocation.trust_annotations;
    let what = match mode {
        TrustAnnotations::Kubelet => {
            "the allow-listed pod annotations grant a GPU only within what kubelet recorded for \
             the container (device-plugin checkpoint, DRA state)"
        }
        TrustAnnotations::Admission => {
            "the allow-listed pod annotations are believed: apply \
             packaging/k8s/admission-policy.yaml so that only your scheduler accounts can write them"
        }
        TrustAnnotations::Believed => {
            "the allow-listed pod annotations are believed as written: any pod author can take \
             any GPU (single-tenant nodes only)"
        }
    };
    format!(
        "trust mode: allocation.trust-annotations = {} ({from}): {what}",
        mode.as_toml()
    )
}

/// The files `configure` writes for `engine` whose main configuration is `config`.
pub fn plan_writes(
    engine: Engine,
    config: &Path,
    binary: &Path,
    handler: &str,
) -> Result<Vec<FileWrite>, ConfigureError> {
    plan_writes_at(Path::new("/"), engine, config, binary, handler)
}

/// [`plan_writes`] for a host whose root directory is mounted at `root`: `config` and `binary`
/// are paths as the host sees them (and are written so into the files); each
/// [`FileWrite::path`] is where the file lies from here (`root` joined with the host's path).
pub fn plan_writes_at(
    root: &Path,
    engine: Engine,
    config: &Path,
    binary: &Path,
    handler: &str,
) -> Result<Vec<FileWrite>, ConfigureError> {
    plan_writes_mode(root, engine, config, binary, handler, Mode::Runtime)
}

/// [`plan_writes_at`] for the applier `mode`: with [`Mode::Nri`] (containerd, CRI-O) the drop-in
/// enables NRI and requires the plugin named `handler`; `binary` is then unused. The engine's
/// type ([`Engine::config`]) answers.
pub fn plan_writes_mode(
    root: &Path,
    engine: Engine,
    config: &Path,
    binary: &Path,
    handler: &str,
    mode: Mode,
) -> Result<Vec<FileWrite>, ConfigureError> {
    if handler.is_empty()
        || !handler
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    {
        return Err(ConfigureError::Unsupported {
            path: config.to_path_buf(),
            message: format!("handler name {handler:?}: use letters, digits, - and _"),
        });
    }
    let engine = engine.config();
    match mode {
        Mode::Runtime => engine.runtime_handler(root, config, binary, handler),
        Mode::Nri => engine.nri(root, config, handler),
    }
}

/// Write one file atomically (temp file + rename; an existing file keeps its mode).
pub fn write(w: &FileWrite) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = w.path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let mode = std::fs::metadata(&w.path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(w.mode);
    let name = w
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.gpufence-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let r = f
        .write_all(w.contents.as_bytes())
        .and_then(|()| f.set_permissions(std::fs::Permissions::from_mode(mode)))
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, &w.path));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trust_mode_is_named() {
        use crate::config::{Config, TrustAnnotations};
        let mut c = Config::default();
        let l = trust_mode_line(&c);
        assert!(
            l.starts_with("trust mode: allocation.trust-annotations = \"kubelet\" (default)"),
            "{l}"
        );
        c.allocation.trust_annotations = TrustAnnotations::Admission;
        c.source = Some("/etc/gpufence/config.toml".into());
        let l = trust_mode_line(&c);
        assert!(
            l.contains("= \"admission\" (/etc/gpufence/config.toml)")
                && l.contains("admission-policy.yaml"),
            "{l}"
        );
        c.allocation.trust_annotations = TrustAnnotations::Believed;
        assert!(trust_mode_line(&c).contains("= true"));
    }

    fn bin() -> &'static Path {
        Path::new("/usr/bin/gpufence-runtime")
    }

    #[test]
    fn handler_name_checked() {
        assert!(plan_writes(Engine::Crio, Path::new("/x/crio.conf"), bin(), "a/b").is_err());
    }
}
