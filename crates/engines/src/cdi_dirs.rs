//! The engine's CDI spec directories: where containerd (CRI `cdi_spec_dirs`) and CRI-O
//! (`[crio.runtime] cdi_spec_dirs`) resolve CDI devices from — the directories gpufence must
//! resolve kubelet's CDI devices and DRA claims from too (`cdi.spec-dirs`). Each engine's type
//! reads its own (`EngineConfig::cdi_dirs`, [`crate::kinds`]); here is what they share, the
//! comparison with gpufence's configuration and the key `install` writes into a `config.toml` it
//! creates; `runtime configure` and `install` say plainly when an existing `cdi.spec-dirs`
//! disagrees with the engine's.

use std::path::PathBuf;

use crate::engine::Engine;

/// Both engines' default (`/etc/cdi`, then `/var/run/cdi`).
pub fn engine_default() -> Vec<PathBuf> {
    crate::config::CdiConfig::default().spec_dirs
}

/// The directories of the engine key `key` (an array of absolute paths), value `v`.
pub fn spec_dirs(v: &toml::Value, key: &str) -> Result<Vec<PathBuf>, String> {
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
        let c = crate::config::Config::from_toml(
            &text,
            std::path::Path::new("/etc/gpufence/config.toml"),
        )
        .unwrap();
        assert_eq!(c.cdi.spec_dirs, [PathBuf::from("/opt/cdi")]);
        assert_eq!(with_spec_dirs("x = 1\n", &engine_default()), "x = 1\n");
    }
}
