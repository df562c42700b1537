//! The engine's CDI spec directories: where containerd (CRI `cdi_spec_dirs`) and CRI-O
//! (`[crio.runtime] cdi_spec_dirs`) resolve CDI devices from — the directories gpufence must
//! resolve kubelet's CDI devices and DRA claims from too (`cdi.spec-dirs`). `install` writes them
//! into a `config.toml` it creates; `runtime configure` and `install` say plainly when an
//! existing `cdi.spec-dirs` disagrees with the engine's.

use std::path::{Path, PathBuf};

use crate::configure::Engine;

/// Both engines' default (`/etc/cdi`, then `/var/run/cdi`).
pub fn engine_default() -> Vec<PathBuf> {
    crate::config::CdiConfig::default().spec_dirs
}

/// `cdi_spec_dirs` of a containerd main file (config v2: the CRI plugin's table; v3: the CRI
/// runtime plugin's); `Ok(None)` when unset (the engine's default applies).
pub fn containerd(text: &str) -> Result<Option<Vec<PathBuf>>, String> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| e.message().to_string())?;
    let plugins = doc.get("plugins").and_then(|p| p.as_table());
    for table in ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"] {
        if let Some(v) = plugins
            .and_then(|p| p.get(table))
            .and_then(|t| t.get("cdi_spec_dirs"))
        {
            return dirs(v, &format!("plugins.\"{table}\".cdi_spec_dirs")).map(Some);
        }
    }
    Ok(None)
}

/// `[crio.runtime] cdi_spec_dirs` of a CRI-O file; `Ok(None)` when unset.
pub fn crio(text: &str) -> Result<Option<Vec<PathBuf>>, String> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| e.message().to_string())?;
    match doc
        .get("crio")
        .and_then(|c| c.get("runtime"))
        .and_then(|r| r.get("cdi_spec_dirs"))
    {
        Some(v) => dirs(v, "crio.runtime.cdi_spec_dirs").map(Some),
        None => Ok(None),
    }
}

fn dirs(v: &toml::Value, key: &str) -> Result<Vec<PathBuf>, String> {
    let list = v
        .as_array()
        .ok_or_else(|| format!("{key} is not an array"))?;
    list.iter()
        .map(|d| {
            d.as_str()
                .filter(|s| s.starts_with('/'))
                .map(PathBuf::from)
                .ok_or_else(|| format!("{key}: {d} is not an absolute path"))
        })
        .collect()
}

/// The engine's directories as the host sees them: its main file, then (CRI-O) its drop-ins in
/// name order, the last that sets the key winning; the default where none does. `None` for
/// docker (no CDI through CRI).
pub fn of_engine(root: &Path, engine: Engine, main: &Path) -> Result<Option<Vec<PathBuf>>, String> {
    let read = |p: &Path| -> Result<Option<String>, String> {
        crate::configure::read_optional(&crate::configure::in_root(root, p))
            .map_err(|e| e.to_string())
    };
    let mut found: Option<Vec<PathBuf>> = None;
    match engine {
        Engine::Docker => return Ok(None),
        Engine::Containerd => {
            if let Some(text) = read(main)? {
                found = containerd(&text).map_err(|e| format!("{}: {e}", main.display()))?;
            }
        }
        Engine::Crio => {
            let mut files = vec![main.to_path_buf()];
            let dropins = crate::configure::in_root(root, Path::new("/etc/crio/crio.conf.d"));
            if let Ok(rd) = std::fs::read_dir(&dropins) {
                let mut names: Vec<PathBuf> = rd
                    .filter_map(|e| e.ok())
                    .map(|e| Path::new("/etc/crio/crio.conf.d").join(e.file_name()))
                    .filter(|p| p.extension().is_some_and(|x| x == "conf"))
                    .collect();
                names.sort();
                files.extend(names);
            }
            for f in files {
                if let Some(text) = read(&f)?
                    && let Some(d) = crio(&text).map_err(|e| format!("{}: {e}", f.display()))?
                {
                    found = Some(d);
                }
            }
        }
    }
    Ok(Some(found.unwrap_or_else(engine_default)))
}

/// One plain line comparing gpufence's `cdi.spec-dirs` with the engine's (`None`: they agree).
pub fn disagreement(
    cfg: &crate::config::Config,
    engine: Engine,
    engine_dirs: &[PathBuf],
) -> Option<String> {
    if cfg.cdi.spec_dirs == engine_dirs {
        return None;
    }
    let show = |d: &[PathBuf]| {
        d.iter()
            .map(|p| format!("{:?}", p.display().to_string()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Some(format!(
        "CDI directories disagree: gpufence's cdi.spec-dirs = [{}] ({}) but {} resolves CDI \
         devices from [{}]; set cdi.spec-dirs = [{}] so that kubelet's CDI devices and DRA \
         claims are resolved as the engine resolves them",
        show(&cfg.cdi.spec_dirs),
        cfg.source
            .as_ref()
            .map_or_else(|| "default".to_string(), |p| p.display().to_string()),
        engine.name(),
        show(engine_dirs),
        show(engine_dirs)
    ))
}

/// `config.toml` text with `[cdi] spec-dirs` set to the engine's (appended: the installed default
/// file has no `[cdi]` table).
pub fn with_spec_dirs(config_text: &str, engine_dirs: &[PathBuf]) -> String {
    if engine_dirs == engine_default() {
        return config_text.to_string();
    }
    let list: Vec<String> = engine_dirs
        .iter()
        .map(|d| format!("{:?}", d.display().to_string()))
        .collect();
    let mut out = config_text.trim_end().to_string();
    out.push_str(&format!(
        "\n\n# The engine's CDI spec directories (its cdi_spec_dirs), written by gpufence install.\n[cdi]\nspec-dirs = [{}]\n",
        list.join(", ")
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_v2_v3_and_crio() {
        let v2 = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = true\ncdi_spec_dirs = [\"/etc/cdi\", \"/run/cdi\"]\n";
        assert_eq!(
            containerd(v2).unwrap(),
            Some(vec![PathBuf::from("/etc/cdi"), PathBuf::from("/run/cdi")])
        );
        let v3 = "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\ncdi_spec_dirs = [\"/opt/cdi\"]\n";
        assert_eq!(
            containerd(v3).unwrap(),
            Some(vec![PathBuf::from("/opt/cdi")])
        );
        assert_eq!(containerd("version = 3\n").unwrap(), None);
        assert!(
            containerd("[plugins.\"io.containerd.grpc.v1.cri\"]\ncdi_spec_dirs = \"/x\"\n")
                .is_err()
        );
        assert!(
            containerd("[plugins.\"io.containerd.grpc.v1.cri\"]\ncdi_spec_dirs = [\"rel\"]\n")
                .is_err()
        );
        assert_eq!(
            crio("[crio.runtime]\ncdi_spec_dirs = [\"/etc/cdi\"]\n").unwrap(),
            Some(vec![PathBuf::from("/etc/cdi")])
        );
        assert_eq!(crio("[crio.runtime]\n").unwrap(), None);
    }

    #[test]
    fn disagreement_is_one_plain_line_and_install_writes_the_key() {
        let cfg = crate::config::Config::default();
        assert_eq!(
            disagreement(&cfg, Engine::Containerd, &engine_default()),
            None
        );
        let l = disagreement(&cfg, Engine::Containerd, &[PathBuf::from("/opt/cdi")]).unwrap();
        assert!(
            l.contains("containerd resolves CDI devices from [\"/opt/cdi\"]"),
            "{l}"
        );
        assert!(!l.contains('\n'));
        let text = with_spec_dirs("# gpufence\n", &[PathBuf::from("/opt/cdi")]);
        let c = crate::config::Config::from_toml(&text, Path::new("/etc/gpufence/config.toml"))
            .unwrap();
        assert_eq!(c.cdi.spec_dirs, [PathBuf::from("/opt/cdi")]);
        assert_eq!(with_spec_dirs("x = 1\n", &engine_default()), "x = 1\n");
    }
}
