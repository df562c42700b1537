//! `gpufence hook install --dir DIR`: the hooks.d drop-ins (OCI hooks schema 1.0.0, read by
//! podman and CRI-O).
//!
//! `gpufence.json` runs `gpufence hook prestart` for containers carrying an annotation of an
//! enabled annotation dialect; where the node trusts an env-based dialect, it matches every
//! container instead (`when.always`), since the allocation may then be in the env.
//! `gpufence-poststop.json` removes the container's state directory after it stopped.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::config::{Config, Dialect};

/// Hook file names written by `install`.
pub const PRESTART_FILE: &str = "gpufence.json";
pub const POSTSTOP_FILE: &str = "gpufence-poststop.json";

/// Annotation key prefixes (Go RE2 syntax) of the enabled annotation dialects.
pub fn annotation_prefixes(cfg: &Config) -> Vec<&'static str> {
    let mut v = Vec::new();
    if cfg.allocation.enabled(Dialect::Gpufence) {
        v.push(r"gpufence\.dev");
    }
    if cfg.allocation.enabled(Dialect::Cdi) {
        v.push(r"cdi\.k8s\.io");
    }
    if cfg.allocation.enabled(Dialect::Hami) {
        v.push(r"hami\.io");
    }
    if cfg.allocation.enabled(Dialect::Kai) {
        v.push(r"nvidia\.com");
    }
    if cfg.allocation.enabled(Dialect::Koordinator) {
        v.push(r"scheduling\.koordinator\.sh");
    }
    if cfg.allocation.enabled(Dialect::Volcano) {
        v.push(r"volcano\.sh");
    }
    v
}

/// `when` of the drop-ins: `always` if an env dialect is honoured, else one annotation key
/// pattern covering every annotation dialect (hooks schema 1.0.0 ANDs the entries of
/// `when.annotations`; its `or` is not settable from JSON). `None`: no dialect enabled.
pub fn when(cfg: &Config) -> Option<Value> {
    let ac = &cfg.allocation;
    if Dialect::ALL.iter().any(|d| {
        d.is_env_based() && (ac.honours(*d) || (ac.enabled(*d) && ac.trust_env.is_kubelet()))
    }) {
        // trust-env = "kubelet" too: the env may be backed by kubelet's record, and image env
        // kubelet has no record of is neutralised by the same run.
        return Some(json!({ "always": true }));
    }
    let prefixes = annotation_prefixes(cfg);
    let gpushare = ac.enabled(Dialect::Gpushare);
    let key = match (prefixes.is_empty(), gpushare) {
        (true, false) => return None,
        (false, false) => format!("^({})/.+$", prefixes.join("|")),
        // gpushare's extender annotations have no prefix: ALIYUN_COM_GPU_MEM_IDX, …
        (true, true) => "^ALIYUN_COM_GPU_MEM_.+$".to_string(),
        (false, true) => format!("^(({})/.+|ALIYUN_COM_GPU_MEM_.+)$", prefixes.join("|")),
    };
    Some(json!({ "annotations": { key: ".*" } }))
}

/// One drop-in.
pub fn hook_json(
    binary: &Path,
    config: Option<&Path>,
    subcommand: &str,
    stage: &str,
    when: &Value,
) -> Value {
    let mut args = vec!["gpufence".to_string()];
    if let Some(c) = config {
        args.push("--config".into());
        args.push(c.display().to_string());
    }
    args.extend(["hook".to_string(), subcommand.to_string()]);
    json!({
        "version": "1.0.0",
        "hook": {
            "path": binary.display().to_string(),
            "args": args,
            "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
            "timeout": 30
        },
        "when": when,
        "stages": [stage]
    })
}

/// The drop-ins for this configuration: (file name, contents). Empty when no dialect is enabled.
pub fn drop_ins(
    cfg: &Config,
    binary: &Path,
    config: Option<&Path>,
    stage: super::Stage,
) -> Vec<(&'static str, Value)> {
    let Some(w) = when(cfg) else {
        return Vec::new();
    };
    let sub = match stage {
        super::Stage::Prestart => "prestart",
        super::Stage::CreateRuntime => "create-runtime",
    };
    vec![
        (
            PRESTART_FILE,
            hook_json(binary, config, sub, stage.name(), &w),
        ),
        (
            POSTSTOP_FILE,
            hook_json(binary, config, "poststop", "poststop", &w),
        ),
    ]
}

/// Write the drop-ins into `dir` atomically; returns the paths written.
pub fn install(
    cfg: &Config,
    dir: &Path,
    binary: &Path,
    config: Option<&Path>,
    stage: super::Stage,
) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let files = drop_ins(cfg, binary, config, stage);
    for name in [PRESTART_FILE, POSTSTOP_FILE] {
        let path = dir.join(name);
        match files.iter().find(|(n, _)| *n == name) {
            Some((_, v)) => {
                let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
                std::fs::write(&tmp, format!("{}\n", serde_json::to_string_pretty(v)?))?;
                std::fs::rename(&tmp, &path)?;
                written.push(path);
            }
            None => match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            },
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_match_by_default_always_when_env_trusted() {
        // trust-env = "kubelet" (the default): always.
        assert_eq!(when(&Config::default()).unwrap(), json!({"always": true}));
        let mut cfg = Config::default();
        cfg.allocation.trust_env = crate::config::TrustEnv::All(false);
        let w = when(&cfg).unwrap();
        let keys: Vec<&String> = w["annotations"].as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                r"^((gpufence\.dev|cdi\.k8s\.io|hami\.io|nvidia\.com|scheduling\.koordinator\.sh|volcano\.sh)/.+|ALIYUN_COM_GPU_MEM_.+)$"
            ]
        );
        let mut cfg = Config::default();
        cfg.allocation.trust_env = crate::config::TrustEnv::Dialects(vec![Dialect::Hami]);
        assert_eq!(when(&cfg).unwrap(), json!({"always": true}));
        cfg.allocation.dialects = vec![Dialect::Gpufence];
        assert!(when(&cfg).unwrap().get("annotations").is_some());
        assert_eq!(
            when(&cfg).unwrap()["annotations"],
            json!({r"^(gpufence\.dev)/.+$": ".*"})
        );
        cfg.allocation.dialects = vec![];
        assert!(when(&cfg).is_none());
    }

    #[test]
    fn install_writes_binary_and_config() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config::default();
        let w = install(
            &cfg,
            d.path(),
            Path::new("/opt/gf/bin/gpufence"),
            Some(Path::new("/etc/gf.toml")),
            super::super::Stage::Prestart,
        )
        .unwrap();
        assert_eq!(w.len(), 2);
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(d.path().join(PRESTART_FILE)).unwrap())
                .unwrap();
        assert_eq!(v["version"], "1.0.0");
        assert_eq!(v["hook"]["path"], "/opt/gf/bin/gpufence");
        assert_eq!(
            v["hook"]["args"],
            json!(["gpufence", "--config", "/etc/gf.toml", "hook", "prestart"])
        );
        assert_eq!(v["stages"], json!(["prestart"]));
        let p: Value =
            serde_json::from_str(&std::fs::read_to_string(d.path().join(POSTSTOP_FILE)).unwrap())
                .unwrap();
        assert_eq!(p["stages"], json!(["poststop"]));
    }
}

#[cfg(test)]
mod shipped {
    /// The drop-ins shipped in `hooks/` (installed by the packages under
    /// /usr/share/gpufence/hooks) are what `install` writes for the default configuration.
    #[test]
    fn shipped_files_match_generated() {
        let files = super::drop_ins(
            &crate::config::Config::default(),
            std::path::Path::new("/usr/bin/gpufence"),
            None,
            crate::Stage::Prestart,
        );
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hooks");
        for (name, v) in files {
            let shipped: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap();
            assert_eq!(
                shipped, v,
                "hooks/{name} is stale: regenerate with `gpufence hook install --dir hooks --binary /usr/bin/gpufence`"
            );
        }
    }
}
