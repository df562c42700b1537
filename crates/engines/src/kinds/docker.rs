//! docker: a `runtimes.<handler>` entry in `daemon.json`; every other key is kept, in order, and
//! the file keeps its indentation. docker has no drop-ins, no NRI and no CRI (no pods, no CDI
//! devices through CRI); dockerd reloads its runtimes on SIGHUP.

use std::path::{Path, PathBuf};

use super::engine_config::{EngineConfig, HangupReload, Identity, PodAnnotations};
use crate::engine::{ConfigureError, FileWrite, file_write, in_root, read_optional};

const IDENTITY: Identity = Identity {
    id: "docker",
    name: "docker",
    default_config: "/etc/docker/daemon.json",
    restart_hint: "restart dockerd (or `kill -HUP` it) to load the gpufence runtime",
    reload_on_hangup: Some(HangupReload {
        daemon: "dockerd",
        pid_file: "/run/docker.pid",
    }),
};

/// docker (`daemon.json`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Docker;

impl EngineConfig for Docker {
    fn identity(&self) -> &'static Identity {
        &IDENTITY
    }
    fn drop_in(&self, _config: &Path, _name: &str) -> Option<PathBuf> {
        None
    }
    fn written_files(&self, config: &Path, _name: &str) -> Vec<PathBuf> {
        vec![config.to_path_buf()]
    }
    fn pod_annotations(&self) -> PodAnnotations {
        PodAnnotations::NoPods
    }
    fn runtime_handler(
        &self,
        root: &Path,
        config: &Path,
        binary: &Path,
        handler: &str,
    ) -> Result<Vec<FileWrite>, ConfigureError> {
        let here = in_root(root, config);
        let text = read_optional(&here)?;
        let new = daemon_json(text.as_deref(), config, binary, handler)?;
        Ok(vec![file_write(here, new, 0o644)?])
    }
    fn nri(
        &self,
        _root: &Path,
        config: &Path,
        _name: &str,
    ) -> Result<Vec<FileWrite>, ConfigureError> {
        Err(ConfigureError::Unsupported {
            path: config.to_path_buf(),
            message: "--mode nri configures containerd and CRI-O (docker has no NRI)".into(),
        })
    }
    fn nri_plugin_dir(&self, _root: &Path, _config: &Path, _name: &str) -> Option<PathBuf> {
        None
    }
    fn cdi_dirs(&self, _root: &Path, _config: &Path) -> Result<Option<Vec<PathBuf>>, String> {
        Ok(None)
    }
    fn give_back(
        &self,
        _config: &Path,
        name: &str,
        path: &Path,
        text: &str,
    ) -> Result<String, ConfigureError> {
        let parse_err = |message: String| ConfigureError::Parse {
            path: path.to_path_buf(),
            message,
        };
        let mut v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| parse_err(e.to_string()))?;
        let Some(runtimes) = v
            .get_mut("runtimes")
            .and_then(serde_json::Value::as_object_mut)
        else {
            return Ok(text.to_string());
        };
        if runtimes.remove(name).is_none() {
            return Ok(text.to_string());
        }
        if runtimes.is_empty()
            && let Some(o) = v.as_object_mut()
        {
            o.remove("runtimes");
        }
        render(&v, Some(text)).map_err(|e| parse_err(e.to_string()))
    }
}

/// docker `daemon.json` with `runtimes.<handler>` set; other keys kept in their order.
pub fn daemon_json(
    text: Option<&str>,
    path: &Path,
    binary: &Path,
    handler: &str,
) -> Result<String, ConfigureError> {
    let parse_err = |message: String| ConfigureError::Parse {
        path: path.to_path_buf(),
        message,
    };
    let mut v: serde_json::Value = match text {
        Some(t) if !t.trim().is_empty() => {
            serde_json::from_str(t).map_err(|e| parse_err(e.to_string()))?
        }
        _ => serde_json::json!({}),
    };
    let root = v
        .as_object_mut()
        .ok_or_else(|| parse_err("not a JSON object".into()))?;
    let runtimes = root
        .entry("runtimes")
        .or_insert_with(|| serde_json::json!({}));
    let runtimes = runtimes
        .as_object_mut()
        .ok_or_else(|| parse_err("runtimes is not an object".into()))?;
    runtimes.insert(
        handler.to_string(),
        serde_json::json!({"path": binary.display().to_string()}),
    );
    render(&v, text).map_err(|e| parse_err(e.to_string()))
}

/// `daemon.json` text for `v`, indented like the operator's `text` (first indented line), 4
/// spaces by default; ends with a newline.
pub fn render(v: &serde_json::Value, text: Option<&str>) -> Result<String, serde_json::Error> {
    let indent: String = text
        .and_then(|t| {
            t.lines()
                .nth(1)
                .map(|l| l.chars().take_while(|c| *c == ' ' || *c == '\t').collect())
        })
        .filter(|s: &String| !s.is_empty())
        .unwrap_or_else(|| "    ".to_string());
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    serde::Serialize::serialize(v, &mut ser)?;
    let mut s = String::from_utf8(out).expect("serde_json writes UTF-8");
    s.push('\n');
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin() -> &'static Path {
        Path::new("/usr/bin/gpufence-runtime")
    }

    #[test]
    fn docker_keeps_keys() {
        let orig = "{\n  \"log-driver\": \"json-file\",\n  \"runtimes\": {\n    \"nvidia\": {\"path\": \"nvidia-container-runtime\", \"runtimeArgs\": []}\n  },\n  \"data-root\": \"/d\"\n}\n";
        let out = daemon_json(Some(orig), Path::new("daemon.json"), bin(), "gpufence").unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["log-driver", "runtimes", "data-root"]);
        assert_eq!(v["runtimes"]["nvidia"]["path"], "nvidia-container-runtime");
        assert_eq!(
            v["runtimes"]["gpufence"]["path"],
            "/usr/bin/gpufence-runtime"
        );
        assert!(out.contains("\n  \"log-driver\""), "indent kept: {out}");
        let again = daemon_json(Some(&out), Path::new("daemon.json"), bin(), "gpufence").unwrap();
        assert_eq!(again, out);
        let fresh = daemon_json(None, Path::new("daemon.json"), bin(), "gpufence").unwrap();
        assert!(fresh.contains("\"gpufence\""));
        assert!(daemon_json(Some("[1]"), Path::new("daemon.json"), bin(), "gpufence").is_err());
        assert!(
            daemon_json(
                Some("{\"runtimes\": 3}"),
                Path::new("daemon.json"),
                bin(),
                "gpufence"
            )
            .is_err()
        );
    }

    #[test]
    fn the_trait_writes_the_main_file_and_gives_the_entry_back() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Path::new("/etc/docker/daemon.json");
        std::fs::create_dir_all(d.path().join("etc/docker")).unwrap();
        let orig =
            "{\n  \"runtimes\": {\n    \"nvidia\": {\n      \"path\": \"n\"\n    }\n  }\n}\n";
        std::fs::write(d.path().join("etc/docker/daemon.json"), orig).unwrap();
        let w = Docker.runtime_handler(d.path(), cfg, bin(), "gf").unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].path, d.path().join("etc/docker/daemon.json"));
        assert!(!w[0].unchanged);
        assert_eq!(Docker.written_files(cfg, "gf"), [cfg]);
        assert_eq!(Docker.drop_in(cfg, "gf"), None);
        // Given back: the operator's file, byte for byte; a file without the entry unchanged.
        assert_eq!(
            Docker.give_back(cfg, "gf", cfg, &w[0].contents).unwrap(),
            orig
        );
        assert_eq!(Docker.give_back(cfg, "gf", cfg, orig).unwrap(), orig);
        assert!(Docker.give_back(cfg, "gf", cfg, "{").is_err());
        // No NRI, no CDI through CRI, no pods; SIGHUP reloads its runtimes.
        let e = Docker.nri(d.path(), cfg, "gf").unwrap_err().to_string();
        assert!(e.contains("docker has no NRI"), "{e}");
        assert_eq!(Docker.nri_plugin_dir(d.path(), cfg, "gf"), None);
        assert_eq!(Docker.cdi_dirs(d.path(), cfg), Ok(None));
        assert_eq!(Docker.pod_annotations(), PodAnnotations::NoPods);
        assert_eq!(
            Docker.identity().reload_on_hangup.map(|r| r.pid_file),
            Some("/run/docker.pid")
        );
    }
}
