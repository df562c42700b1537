//! containerd's configuration for the NRI applier (`gpufence install --mode nri`,
//! `gpufence runtime configure --mode nri`): a drop-in `conf.d/<name>-nri.toml` beside the main
//! file, pulled in by an `imports` entry (as the runtime mode does), holding containerd's NRI
//! plugin section (`plugins.'io.containerd.nri.v1.nri'`, copied from the main file when it has
//! one) with NRI enabled and its default validator requiring the plugin `<name>`:
//!
//! ```toml
//! [plugins.'io.containerd.nri.v1.nri']
//!   disable = false
//!   [plugins.'io.containerd.nri.v1.nri'.default_validator]
//!     enable = true
//!     required_plugins = ['gpufence']
//!     tolerate_missing_plugins_annotation = ''
//! ```
//!
//! The validator (containerd ≥ 2.2, config version 3 or 4) refuses every container the plugin
//! did not process; its pod-annotation escape hatch is cleared (any pod author could write it:
//! the pre-registered plugin that `install` writes starts with containerd and needs none).
//! A version 2 file is refused: containerd 1.7 has no default validator, so NRI could not fail
//! closed there (use the runtime handler). docs/nri.md says what the validator does not close.
//!
//! CRI-O (≥ 1.34: `[crio.nri.default_validator]`): a drop-in `crio.conf.d/99-<name>-nri.conf`
//! ([`crio`]), which CRI-O loads after the operator's files key by key:
//!
//! ```toml
//! [crio.nri]
//! enable_nri = true
//!
//! [crio.nri.default_validator]
//! nri_enable_default_validator = true
//! nri_validator_required_plugins = ["gpufence"]
//! nri_validator_tolerate_missing_plugins_annotation = ""
//! ```
//!
//! The pre-registered plugin: [`wrapper`] is the executable the runtime starts from its plugin
//! directory (containerd's `plugin_path`, [`plugin_path`]; CRI-O's `nri_plugin_dir`,
//! [`crio_plugin_path`]) as `<index>-<name>`, with the connection on fd 3.

use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item, Table, value};

use crate::engine::{
    ConfigureError, Engine, FileWrite, OWN_FILE_MARK, add_import, drop_in_path, file_write,
    in_root, parse_containerd, read_optional, string_array,
};

/// containerd's NRI plugin (config version 3 and 4).
pub const NRI_PLUGIN: &str = "io.containerd.nri.v1.nri";
/// NRI's default directory of pre-registered plugins.
pub const DEFAULT_PLUGIN_PATH: &str = "/opt/nri/plugins";
pub use gpufence_core::config::NRI_PLUGIN_INDEX as PLUGIN_INDEX;

/// The name the configuration for plugin `name` is kept under (drop-in, record): `<name>-nri`.
pub fn config_name(name: &str) -> String {
    format!("{name}-nri")
}

/// The files the NRI mode writes: the drop-in and the main file with its `imports` entry.
pub fn plan_writes(
    root: &Path,
    engine: Engine,
    config: &Path,
    name: &str,
) -> Result<Vec<FileWrite>, ConfigureError> {
    let unsupported = |message: String| ConfigureError::Unsupported {
        path: config.to_path_buf(),
        message,
    };
    let drop_in_path = drop_in_path(engine, config, &config_name(name)).ok_or_else(|| {
        unsupported("--mode nri configures containerd and CRI-O (docker has no NRI)".into())
    })?;
    let here = |p: &Path| in_root(root, p);
    if engine == Engine::Crio {
        let layers = crio_layers(&here(config), &here(&drop_in_path))?;
        let drop_in = crio(&layers, name).map_err(|(file, message)| ConfigureError::Parse {
            path: file,
            message,
        })?;
        return Ok(vec![file_write(here(&drop_in_path), drop_in, 0o644)?]);
    }
    let main = read_optional(&here(config))?.ok_or_else(|| {
        unsupported("no such file: create it first (`containerd config default`)".into())
    })?;
    let (new_main, drop_in) = containerd(&main, config, &drop_in_path, name)?;
    Ok(vec![
        file_write(here(&drop_in_path), drop_in, 0o644)?,
        file_write(here(config), new_main, 0o644)?,
    ])
}

/// containerd: (new main file, NRI drop-in) requiring plugin `name`.
pub fn containerd(
    main: &str,
    main_path: &Path,
    drop_in_path: &Path,
    name: &str,
) -> Result<(String, String), ConfigureError> {
    let parse_err = |message: String| ConfigureError::Parse {
        path: main_path.to_path_buf(),
        message,
    };
    let (mut doc, version) = parse_containerd(main, main_path)?;
    if !matches!(version, 3 | 4) {
        return Err(ConfigureError::Unsupported {
            path: main_path.to_path_buf(),
            message: format!(
                "containerd config version {version}: the NRI applier needs containerd ≥ 2.2 (config version 3 or 4) for NRI's default validator, without which a missing plugin lets containers start unfenced; use the runtime handler, or migrate with `containerd config migrate`"
            ),
        });
    }
    let mut section = nri_section(&doc).map_err(parse_err)?;
    section.insert("disable", value(false));
    let validator = match section.get_mut("default_validator") {
        Some(Item::Table(t)) => t,
        Some(_) => {
            return Err(parse_err(format!(
                "plugins.'{NRI_PLUGIN}'.default_validator is not a table"
            )));
        }
        None => {
            section.insert("default_validator", Item::Table(Table::new()));
            section["default_validator"]
                .as_table_mut()
                .expect("just inserted")
        }
    };
    validator.insert("enable", value(true));
    let mut required: Vec<String> = validator
        .get("required_plugins")
        .and_then(Item::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if !required.iter().any(|r| r == name) {
        required.push(name.to_string());
    }
    validator.insert(
        "required_plugins",
        value(string_array(required.iter().map(String::as_str))),
    );
    validator.insert("tolerate_missing_plugins_annotation", value(""));

    let mut drop_in = DocumentMut::new();
    drop_in.insert("version", value(version));
    let mut plugins = Table::new();
    plugins.set_implicit(true);
    plugins.insert(NRI_PLUGIN, Item::Table(section));
    drop_in.insert("plugins", Item::Table(plugins));
    drop_in.decor_mut().set_prefix(format!(
        "{OWN_FILE_MARK} --mode nri`: NRI enabled, its default validator requiring the\n\
         # `{name}` plugin (every container is refused unless `gpufence nri` processed it).\n\
         # A copy of plugins.'{NRI_PLUGIN}' from {} as it was when written:\n\
         # run configure again after editing that section there.\n",
        main_path.display()
    ));
    add_import(&mut doc, drop_in_path).map_err(parse_err)?;
    Ok((doc.to_string(), drop_in.to_string()))
}

/// CRI-O's configuration as it loads it, before gpufence's drop-in: (file, text) of the main
/// file (when present) and of every other `crio.conf.d/*.conf`, in CRI-O's order (lexical).
pub fn crio_layers(main: &Path, own: &Path) -> Result<Vec<(PathBuf, String)>, ConfigureError> {
    let mut out = Vec::new();
    if let Some(t) = read_optional(main)? {
        out.push((main.to_path_buf(), t));
    }
    let dir = own.parent().unwrap_or(Path::new("/"));
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "conf") && p != own)
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    for p in names {
        if let Some(t) = read_optional(&p)? {
            out.push((p, t));
        }
    }
    Ok(out)
}

/// The last value `key` of table `crio.nri[.sub]` has across CRI-O's `layers`; an unparsable
/// layer is the error (file, why).
fn crio_nri_value(
    layers: &[(PathBuf, String)],
    sub: Option<&str>,
    key: &str,
) -> Result<Option<Item>, (PathBuf, String)> {
    let mut found = None;
    for (file, text) in layers {
        let doc: DocumentMut = text
            .parse()
            .map_err(|e: toml_edit::TomlError| (file.clone(), e.message().to_string()))?;
        let mut t = doc.get("crio").and_then(|c| c.get("nri"));
        if let Some(sub) = sub {
            t = t.and_then(|n| n.get(sub));
        }
        if let Some(v) = t.and_then(|t| t.get(key)) {
            found = Some(v.clone());
        }
    }
    Ok(found)
}

/// CRI-O's drop-in (`crio.conf.d/99-<name>-nri.conf`, loaded after the operator's files, key by
/// key): NRI on, its default validator (CRI-O ≥ 1.34) requiring plugin `name` besides the ones
/// `layers` already require, its pod-annotation escape hatch cleared.
pub fn crio(layers: &[(PathBuf, String)], name: &str) -> Result<String, (PathBuf, String)> {
    let mut required: Vec<String> = crio_nri_value(
        layers,
        Some("default_validator"),
        "nri_validator_required_plugins",
    )?
    .and_then(|v| {
        v.as_array().map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
    })
    .unwrap_or_default();
    if !required.iter().any(|r| r == name) {
        required.push(name.to_string());
    }
    let mut validator = Table::new();
    validator.insert("nri_enable_default_validator", value(true));
    validator.insert(
        "nri_validator_required_plugins",
        value(string_array(required.iter().map(String::as_str))),
    );
    validator.insert(
        "nri_validator_tolerate_missing_plugins_annotation",
        value(""),
    );
    let mut nri = Table::new();
    nri.insert("enable_nri", value(true));
    nri.insert("default_validator", Item::Table(validator));
    let mut crio = Table::new();
    crio.set_implicit(true);
    crio.insert("nri", Item::Table(nri));
    let mut doc = DocumentMut::new();
    doc.insert("crio", Item::Table(crio));
    doc.decor_mut().set_prefix(format!(
        "{OWN_FILE_MARK} --mode nri`: NRI enabled, its default validator requiring the\n\
         # `{name}` plugin (every container is refused unless `gpufence nri` processed it).\n\
         # The required plugins already set in CRI-O's other files are kept: run configure again\n\
         # after editing them there.\n"
    ));
    Ok(doc.to_string())
}

/// Where CRI-O looks for pre-registered plugins (`[crio.nri] nri_plugin_dir` of its `layers`,
/// else NRI's default), as the host sees it.
pub fn crio_plugin_path(layers: &[(PathBuf, String)]) -> PathBuf {
    crio_nri_value(layers, None, "nri_plugin_dir")
        .ok()
        .flatten()
        .and_then(|v| v.as_str().filter(|p| p.starts_with('/')).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PLUGIN_PATH))
}

/// The main file's NRI plugin section (a copy, without its comments), or an empty one.
fn nri_section(doc: &DocumentMut) -> Result<Table, String> {
    let mut section = match doc.get("plugins").and_then(|p| p.get(NRI_PLUGIN)) {
        Some(Item::Table(t)) => t.clone(),
        Some(Item::Value(toml_edit::Value::InlineTable(t))) => t.clone().into_table(),
        Some(_) => return Err(format!("plugins.'{NRI_PLUGIN}' is not a table")),
        None => Table::new(),
    };
    section.decor_mut().clear();
    Ok(section)
}

/// Where containerd looks for pre-registered plugins (`plugin_path` of its NRI section in the
/// main file, else NRI's default), as the host sees it.
pub fn plugin_path(main: &str) -> PathBuf {
    main.parse::<DocumentMut>()
        .ok()
        .and_then(|d| {
            d.get("plugins")?
                .get(NRI_PLUGIN)?
                .get("plugin_path")?
                .as_str()
                .filter(|p| p.starts_with('/'))
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PLUGIN_PATH))
}

/// The pre-registered plugin's file name: `<index>-<name>`.
pub fn plugin_file(name: &str) -> String {
    format!("{PLUGIN_INDEX}-{name}")
}

/// The executable the runtime starts as the pre-registered plugin: absolute paths (it gives it
/// no `PATH` and no `GPUFENCE_CONFIG`), the configuration named.
pub fn wrapper(gpufence: &Path, config: &Path) -> String {
    format!(
        "#!/bin/sh\n\
         # Written by `gpufence install --mode nri`: the gpufence NRI plugin, started by\n\
         # the runtime with its connection on fd 3 (NRI_PLUGIN_SOCKET).\n\
         exec {} --config {} nri\n",
        gpufence.display(),
        config.display()
    )
}

/// A CRI-O drop-in's required plugins, once checked to turn NRI and its validator on with the
/// escape hatch cleared (tests).
#[cfg(test)]
pub(crate) fn crio_required(drop_in: &str) -> Vec<String> {
    let doc: DocumentMut = drop_in.parse().unwrap();
    let nri = &doc["crio"]["nri"];
    assert_eq!(nri["enable_nri"].as_bool(), Some(true), "{drop_in}");
    let v = &nri["default_validator"];
    assert_eq!(v["nri_enable_default_validator"].as_bool(), Some(true));
    assert_eq!(
        v["nri_validator_tolerate_missing_plugins_annotation"].as_str(),
        Some("")
    );
    v["nri_validator_required_plugins"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x.as_str().map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAIN: &str = "# operator's file\nversion = 3\nroot = '/var/lib/containerd' # keep\n\n[plugins.'io.containerd.nri.v1.nri']\n  plugin_path = '/custom/nri'\n  plugin_request_timeout = '3s'\n  [plugins.'io.containerd.nri.v1.nri'.default_validator]\n    required_plugins = ['other']\n    tolerate_missing_plugins_annotation = 'tolerate-missing-plugins.noderesource.dev'\n";

    fn drop_in() -> PathBuf {
        PathBuf::from("/etc/containerd/conf.d/gpufence-nri.toml")
    }

    #[test]
    fn enables_nri_and_requires_the_plugin_keeping_the_operator_s_keys() {
        let (main, d) = containerd(
            MAIN,
            Path::new("/etc/containerd/config.toml"),
            &drop_in(),
            "gpufence",
        )
        .unwrap();
        // The main file: only the imports entry added, comments kept.
        let added: Vec<&str> = main.lines().filter(|l| !MAIN.contains(*l)).collect();
        assert_eq!(
            added,
            vec!["imports = [\"/etc/containerd/conf.d/gpufence-nri.toml\"]"]
        );
        assert!(main.contains("root = '/var/lib/containerd' # keep"));
        assert!(d.starts_with(OWN_FILE_MARK), "{d}");
        let doc: DocumentMut = d.parse().unwrap();
        assert_eq!(doc["version"].as_integer(), Some(3));
        let s = &doc["plugins"][NRI_PLUGIN];
        assert_eq!(s["disable"].as_bool(), Some(false));
        assert_eq!(s["plugin_path"].as_str(), Some("/custom/nri"));
        assert_eq!(s["plugin_request_timeout"].as_str(), Some("3s"));
        let v = &s["default_validator"];
        assert_eq!(v["enable"].as_bool(), Some(true));
        let req: Vec<&str> = v["required_plugins"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|x| x.as_str())
            .collect();
        assert_eq!(req, vec!["other", "gpufence"]);
        // The escape hatch any pod author could use is closed.
        assert_eq!(v["tolerate_missing_plugins_annotation"].as_str(), Some(""));
        // Idempotent: configuring the result again changes nothing more.
        let (main2, d2) = containerd(
            &main,
            Path::new("/etc/containerd/config.toml"),
            &drop_in(),
            "gpufence",
        )
        .unwrap();
        assert_eq!(main2, main);
        assert_eq!(
            d2.lines().skip(4).collect::<Vec<_>>(),
            d.lines().skip(4).collect::<Vec<_>>()
        );
    }

    #[test]
    fn an_empty_v4_file_gets_the_whole_section() {
        let (_, d) = containerd("version = 4\n", Path::new("/c.toml"), &drop_in(), "gf").unwrap();
        let doc: DocumentMut = d.parse().unwrap();
        let v = &doc["plugins"][NRI_PLUGIN]["default_validator"];
        assert_eq!(v["enable"].as_bool(), Some(true));
        assert_eq!(v["required_plugins"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn version_2_and_other_engines_are_refused() {
        for main in ["version = 2\n", "", "version = 5\n"] {
            let e = containerd(main, Path::new("/c.toml"), &drop_in(), "gf")
                .unwrap_err()
                .to_string();
            assert!(e.contains("default validator"), "{e}");
        }
        let e = plan_writes(Path::new("/"), Engine::Docker, Path::new("/c"), "gf").unwrap_err();
        assert!(e.to_string().contains("docker has no NRI"), "{e}");
        let e = containerd(
            "version = 3\n[plugins]\n'io.containerd.nri.v1.nri' = 1\n",
            Path::new("/c.toml"),
            &drop_in(),
            "gf",
        )
        .unwrap_err();
        assert!(e.to_string().contains("is not a table"), "{e}");
    }

    #[test]
    fn crio_gets_nri_and_its_validator_keeping_required_plugins() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc/crio");
        std::fs::create_dir_all(etc.join("crio.conf.d")).unwrap();
        std::fs::write(
            etc.join("crio.conf"),
            "[crio.nri]\nnri_plugin_dir = \"/custom/nri\"\n[crio.nri.default_validator]\nnri_validator_required_plugins = [\"a\"]\n",
        )
        .unwrap();
        std::fs::write(
            etc.join("crio.conf.d/10-op.conf"),
            "[crio.nri.default_validator]\nnri_validator_required_plugins = [\"b\"]\n",
        )
        .unwrap();
        std::fs::write(etc.join("crio.conf.d/notes.txt"), "not toml [").unwrap();
        let w = plan_writes(
            dir.path(),
            Engine::Crio,
            Path::new("/etc/crio/crio.conf"),
            "gpufence",
        )
        .unwrap();
        assert_eq!(w.len(), 1, "the main file is not touched");
        assert_eq!(w[0].path, etc.join("crio.conf.d/99-gpufence-nri.conf"));
        assert!(
            w[0].contents.starts_with(OWN_FILE_MARK),
            "{}",
            w[0].contents
        );
        // The last layer's list (CRI-O replaces arrays), plus gpufence.
        assert_eq!(crio_required(&w[0].contents), ["b", "gpufence"]);
        assert!(!w[0].contents.contains("\n[crio]\n"), "implicit parent");
        // Its own earlier file is not a layer: configuring again gives the same file.
        std::fs::write(&w[0].path, &w[0].contents).unwrap();
        let again = plan_writes(
            dir.path(),
            Engine::Crio,
            Path::new("/etc/crio/crio.conf"),
            "gpufence",
        )
        .unwrap();
        assert_eq!(again[0].contents, w[0].contents);
        let layers = crio_layers(&etc.join("crio.conf"), &w[0].path).unwrap();
        assert_eq!(crio_plugin_path(&layers), PathBuf::from("/custom/nri"));
        assert_eq!(crio_plugin_path(&[]), PathBuf::from(DEFAULT_PLUGIN_PATH));
        // No main file: a node running on CRI-O's defaults.
        std::fs::remove_file(etc.join("crio.conf")).unwrap();
        assert!(
            plan_writes(
                dir.path(),
                Engine::Crio,
                Path::new("/etc/crio/crio.conf"),
                "gf"
            )
            .is_ok()
        );
        // A layer that is not TOML is named.
        std::fs::write(etc.join("crio.conf.d/20-bad.conf"), "[crio").unwrap();
        let e = plan_writes(
            dir.path(),
            Engine::Crio,
            Path::new("/etc/crio/crio.conf"),
            "gf",
        )
        .unwrap_err();
        assert!(e.to_string().contains("20-bad.conf"), "{e}");
    }

    #[test]
    fn plugin_path_and_wrapper() {
        assert_eq!(plugin_path(MAIN), PathBuf::from("/custom/nri"));
        assert_eq!(
            plugin_path("version = 3\n"),
            PathBuf::from(DEFAULT_PLUGIN_PATH)
        );
        assert_eq!(
            plugin_path("not toml ["),
            PathBuf::from(DEFAULT_PLUGIN_PATH)
        );
        assert_eq!(plugin_file("gpufence"), "90-gpufence");
        let w = wrapper(
            Path::new("/usr/bin/gpufence"),
            Path::new("/etc/gpufence/config.toml"),
        );
        assert!(w.starts_with("#!/bin/sh\n"));
        assert!(w.ends_with("exec /usr/bin/gpufence --config /etc/gpufence/config.toml nri\n"));
    }
}
