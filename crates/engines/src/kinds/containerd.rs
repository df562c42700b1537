//! containerd: a drop-in `conf.d/<name>.toml` beside the main file, pulled in by an `imports`
//! entry added to the main file (the only change there; its comments and layout are kept by
//! `toml_edit`). containerd 1.x *replaces* a whole plugin section from an imported file instead
//! of merging it, so the drop-in carries a copy of the operator's section plus gpufence's part;
//! re-run `configure` after editing that section in the main file.
//!
//! What the drop-in holds depends on the main file's config `version`, one type per version
//! ([`ContainerdVersion`]: [`ConfigV2`], [`ConfigV3`], [`ConfigV4`]), and the same answer serves
//! every question: the CRI runtime plugin's table holds both the `gpufence` handler that
//! `configure` writes and the `cdi_spec_dirs` the CDI-directory check reads.
//!
//! * The runtime handler: `containerd.runtimes.<handler>` in the CRI runtime plugin, with the
//!   pod-annotation allow-list (`pod_annotations`, `container_annotations`).
//! * NRI (containerd ≥ 2.2, config version 3 or 4): `plugins.'io.containerd.nri.v1.nri'` (copied
//!   from the main file when it has one) with NRI enabled and its default validator requiring
//!   the plugin `<name>`:
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
//!   The validator refuses every container the plugin did not process; its pod-annotation escape
//!   hatch is cleared (any pod author could write it: the pre-registered plugin that `install`
//!   writes starts with containerd and needs none). A version 2 file is refused: containerd 1.7
//!   has no default validator, so NRI could not fail closed there (use the runtime handler).
//!   docs/nri.md says what the validator does not close.
//! * Given back: the drop-in is gpufence's whole; the main file loses its `imports` entry.

use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item, Table, value};

use super::engine_config::{EngineConfig, Identity, PodAnnotations};
use crate::cdi_dirs::{engine_default, spec_dirs};
use crate::engine::{
    ConfigureError, FileWrite, OWN_FILE_MARK, file_write, in_root, read_optional, string_array,
};
use crate::nri_config::{DEFAULT_PLUGIN_PATH, config_name};

/// containerd's NRI plugin (config version 3 and 4).
pub const NRI_PLUGIN: &str = "io.containerd.nri.v1.nri";

/// One config version of containerd's main file: where its keys live.
pub trait ContainerdVersion: Sync {
    /// The `version` the file declares.
    fn number(&self) -> i64;
    /// The plugin whose table holds the CRI runtime's keys: `containerd.runtimes` (the runtime
    /// handlers) and `cdi_spec_dirs`.
    fn cri_runtime_plugin(&self) -> &'static str;
    /// Whether NRI's default validator exists (containerd ≥ 2.2), without which a missing plugin
    /// lets containers start unfenced: the NRI applier needs it.
    fn nri_default_validator(&self) -> bool;
}

/// Config version 2 (containerd 1.x): the CRI plugin `io.containerd.grpc.v1.cri`; no NRI
/// validator.
#[derive(Debug, Clone, Copy)]
pub struct ConfigV2;
/// Config version 3 (containerd 2.0–2.2): the CRI runtime plugin `io.containerd.cri.v1.runtime`.
#[derive(Debug, Clone, Copy)]
pub struct ConfigV3;
/// Config version 4 (containerd 2.3): the CRI runtime plugin and its runtime keys as in 3.
#[derive(Debug, Clone, Copy)]
pub struct ConfigV4;

impl ContainerdVersion for ConfigV2 {
    fn number(&self) -> i64 {
        2
    }
    fn cri_runtime_plugin(&self) -> &'static str {
        "io.containerd.grpc.v1.cri"
    }
    fn nri_default_validator(&self) -> bool {
        false
    }
}

impl ContainerdVersion for ConfigV3 {
    fn number(&self) -> i64 {
        3
    }
    fn cri_runtime_plugin(&self) -> &'static str {
        "io.containerd.cri.v1.runtime"
    }
    fn nri_default_validator(&self) -> bool {
        true
    }
}

impl ContainerdVersion for ConfigV4 {
    fn number(&self) -> i64 {
        4
    }
    fn cri_runtime_plugin(&self) -> &'static str {
        ConfigV3.cri_runtime_plugin()
    }
    fn nri_default_validator(&self) -> bool {
        true
    }
}

/// Every config version gpufence writes, oldest first.
pub const VERSIONS: [&dyn ContainerdVersion; 3] = [&ConfigV2, &ConfigV3, &ConfigV4];

/// The supported version numbered `n`.
pub fn version(n: i64) -> Option<&'static dyn ContainerdVersion> {
    VERSIONS.into_iter().find(|v| v.number() == n)
}

/// "2, 3 or 4": the supported versions, for messages.
fn supported() -> String {
    let n: Vec<String> = VERSIONS.iter().map(|v| v.number().to_string()).collect();
    match n.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => n.join(""),
    }
}

/// The main file's config `version` (absent: 1) from its `version` key: `None` absent,
/// `Some(None)` not an integer.
fn declared_version(key: Option<Option<i64>>) -> Result<i64, String> {
    match key {
        None => Ok(1),
        Some(Some(v)) => Ok(v),
        Some(None) => Err("version is not an integer".to_string()),
    }
}

/// Why config version `n` has no type here.
fn unsupported(n: i64) -> String {
    format!(
        "containerd config version {n} is not supported ({}): migrate it with `containerd config migrate`",
        supported()
    )
}

const IDENTITY: Identity = Identity {
    id: "containerd",
    name: "containerd",
    default_config: "/etc/containerd/config.toml",
    restart_hint: "restart containerd to load the gpufence runtime handler",
    reload_on_hangup: None,
};

/// containerd (`config.toml` and `conf.d/`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Containerd;

impl EngineConfig for Containerd {
    fn identity(&self) -> &'static Identity {
        &IDENTITY
    }
    fn drop_in(&self, config: &Path, name: &str) -> Option<PathBuf> {
        let dir = config.parent().unwrap_or(Path::new("/"));
        Some(dir.join("conf.d").join(format!("{name}.toml")))
    }
    fn written_files(&self, config: &Path, name: &str) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.drop_in(config, name).into_iter().collect();
        files.push(config.to_path_buf());
        files
    }
    fn pod_annotations(&self) -> PodAnnotations {
        PodAnnotations::AllowList(&gpufence_core::allocation::ANNOTATION_ALLOW_LIST)
    }
    fn runtime_handler(
        &self,
        root: &Path,
        config: &Path,
        binary: &Path,
        handler: &str,
    ) -> Result<Vec<FileWrite>, ConfigureError> {
        let drop_in_path = self.drop_in(config, handler).unwrap_or_default();
        let main = read_main(root, config)?;
        let (new_main, drop_in) = runtime_drop_in(&main, config, &drop_in_path, binary, handler)?;
        Ok(vec![
            file_write(in_root(root, &drop_in_path), drop_in, 0o644)?,
            file_write(in_root(root, config), new_main, 0o644)?,
        ])
    }
    fn nri(
        &self,
        root: &Path,
        config: &Path,
        name: &str,
    ) -> Result<Vec<FileWrite>, ConfigureError> {
        let drop_in_path = self.drop_in(config, &config_name(name)).unwrap_or_default();
        let main = read_main(root, config)?;
        let (new_main, drop_in) = nri_drop_in(&main, config, &drop_in_path, name)?;
        Ok(vec![
            file_write(in_root(root, &drop_in_path), drop_in, 0o644)?,
            file_write(in_root(root, config), new_main, 0o644)?,
        ])
    }
    fn nri_plugin_dir(&self, root: &Path, config: &Path, _name: &str) -> Option<PathBuf> {
        let main = std::fs::read_to_string(in_root(root, config)).unwrap_or_default();
        Some(plugin_dir(&main))
    }
    fn cdi_dirs(&self, root: &Path, config: &Path) -> Result<Option<Vec<PathBuf>>, String> {
        let found = match read_optional(&in_root(root, config)).map_err(|e| e.to_string())? {
            Some(text) => cdi_spec_dirs(&text).map_err(|e| format!("{}: {e}", config.display()))?,
            None => None,
        };
        Ok(Some(found.unwrap_or_else(engine_default)))
    }
    fn give_back(
        &self,
        config: &Path,
        name: &str,
        path: &Path,
        text: &str,
    ) -> Result<String, ConfigureError> {
        let Some(drop_in) = self.drop_in(config, name) else {
            return Ok(text.to_string());
        };
        let mut doc: DocumentMut =
            text.parse()
                .map_err(|e: toml_edit::TomlError| ConfigureError::Parse {
                    path: path.to_path_buf(),
                    message: e.message().to_string(),
                })?;
        let import = drop_in.display().to_string();
        let Some(arr) = doc.get_mut("imports").and_then(|i| i.as_array_mut()) else {
            return Ok(text.to_string());
        };
        let before = arr.len();
        arr.retain(|v| v.as_str() != Some(import.as_str()));
        if arr.len() == before {
            return Ok(text.to_string());
        }
        if arr.is_empty() {
            doc.remove("imports");
        }
        Ok(doc.to_string())
    }
}

/// The main file, which must exist.
fn read_main(root: &Path, config: &Path) -> Result<String, ConfigureError> {
    read_optional(&in_root(root, config))?.ok_or_else(|| ConfigureError::Unsupported {
        path: config.to_path_buf(),
        message: "no such file: create it first (`containerd config default`)".into(),
    })
}

/// A containerd main file parsed, with its config `version` (absent: 1).
pub fn parse(main: &str, main_path: &Path) -> Result<(DocumentMut, i64), ConfigureError> {
    let parse_err = |message: String| ConfigureError::Parse {
        path: main_path.to_path_buf(),
        message,
    };
    let doc: DocumentMut = main
        .parse()
        .map_err(|e: toml_edit::TomlError| parse_err(e.message().to_string()))?;
    let version = declared_version(doc.get("version").map(Item::as_integer)).map_err(parse_err)?;
    Ok((doc, version))
}

/// The main file's only change: an `imports` entry for `drop_in_path`, unless an entry (the
/// file, or a glob of its directory) already covers it.
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

/// The main file's table `plugins.<plugin>` (a copy, without its comments), or an empty one.
fn plugin_section(doc: &DocumentMut, plugin: &str) -> Result<Table, String> {
    let mut section = match doc.get("plugins").and_then(|p| p.get(plugin)) {
        Some(Item::Table(t)) => t.clone(),
        Some(Item::Value(toml_edit::Value::InlineTable(t))) => t.clone().into_table(),
        Some(_) => return Err(format!("plugins.\"{plugin}\" is not a table")),
        None => Table::new(),
    };
    section.decor_mut().clear();
    Ok(section)
}

/// A drop-in of config `version` holding `plugins.<plugin>` = `section`, under `header`.
fn drop_in_doc(version: i64, plugin: &str, section: Table, header: String) -> String {
    let mut drop_in = DocumentMut::new();
    drop_in.insert("version", value(version));
    let mut plugins = Table::new();
    plugins.set_implicit(true);
    plugins.insert(plugin, Item::Table(section));
    drop_in.insert("plugins", Item::Table(plugins));
    drop_in.decor_mut().set_prefix(header);
    drop_in.to_string()
}

/// The table `key` of `parent`, created (implicit) when absent.
fn child_table<'a>(
    parent: &'a mut dyn toml_edit::TableLike,
    key: &str,
    name: &str,
) -> Result<&'a mut dyn toml_edit::TableLike, String> {
    if parent.get(key).is_none() {
        let mut t = Table::new();
        t.set_implicit(true);
        parent.insert(key, Item::Table(t));
    }
    parent
        .get_mut(key)
        .and_then(Item::as_table_like_mut)
        .ok_or_else(|| format!("{name} is not a table"))
}

/// The runtime handler: (new main file, drop-in). Errors on an unsupported config version or
/// an unparsable file.
pub fn runtime_drop_in(
    main: &str,
    main_path: &Path,
    drop_in_path: &Path,
    binary: &Path,
    handler: &str,
) -> Result<(String, String), ConfigureError> {
    let parse_err = |message: String| ConfigureError::Parse {
        path: main_path.to_path_buf(),
        message,
    };
    let (mut doc, number) = parse(main, main_path)?;
    let plugin = version(number)
        .ok_or_else(|| ConfigureError::Unsupported {
            path: main_path.to_path_buf(),
            message: unsupported(number),
        })?
        .cri_runtime_plugin();

    // The operator's CRI runtime section, copied whole (containerd 1.x replaces plugin sections
    // from imports rather than merging them).
    let mut section = plugin_section(&doc, plugin).map_err(parse_err)?;
    let ctr = child_table(
        &mut section,
        "containerd",
        &format!("plugins.\"{plugin}\".containerd"),
    )
    .map_err(parse_err)?;
    // Options of the default runtime we must match (cgroup driver).
    let default_name = ctr
        .get("default_runtime_name")
        .and_then(Item::as_str)
        .unwrap_or("runc")
        .to_string();
    let systemd = ctr
        .get("runtimes")
        .and_then(|r| r.get(&default_name))
        .and_then(|r| r.get("options"))
        .and_then(|o| o.get("SystemdCgroup"))
        .and_then(Item::as_bool);
    let runtimes = child_table(
        ctr,
        "runtimes",
        &format!("plugins.\"{plugin}\".containerd.runtimes"),
    )
    .map_err(parse_err)?;
    let mut rt = Table::new();
    rt.insert("runtime_type", value("io.containerd.runc.v2"));
    if let PodAnnotations::AllowList(list) = Containerd.pod_annotations() {
        rt.insert("pod_annotations", value(string_array(list.iter().copied())));
        rt.insert(
            "container_annotations",
            value(string_array(list.iter().copied())),
        );
    }
    let mut opts = Table::new();
    opts.insert("BinaryName", value(binary.display().to_string()));
    if let Some(s) = systemd {
        opts.insert("SystemdCgroup", value(s));
    }
    rt.insert("options", Item::Table(opts));
    runtimes.insert(handler, Item::Table(rt));

    let drop_in = drop_in_doc(
        number,
        plugin,
        section,
        format!(
            "# Written by `gpufence runtime configure --runtime containerd`: the `{handler}` runtime handler.\n\
             # containerd replaces a whole plugin section from an imported file, so this holds a copy of\n\
             # plugins.\"{plugin}\" from {} as it was when written:\n\
             # run configure again after editing that section there.\n",
            main_path.display()
        ),
    );
    add_import(&mut doc, drop_in_path).map_err(parse_err)?;
    Ok((doc.to_string(), drop_in))
}

/// NRI: (new main file, drop-in) requiring plugin `name`.
pub fn nri_drop_in(
    main: &str,
    main_path: &Path,
    drop_in_path: &Path,
    name: &str,
) -> Result<(String, String), ConfigureError> {
    let parse_err = |message: String| ConfigureError::Parse {
        path: main_path.to_path_buf(),
        message,
    };
    let (mut doc, number) = parse(main, main_path)?;
    if !version(number).is_some_and(|v| v.nri_default_validator()) {
        return Err(ConfigureError::Unsupported {
            path: main_path.to_path_buf(),
            message: format!(
                "containerd config version {number}: the NRI applier needs containerd ≥ 2.2 (config version 3 or 4) for NRI's default validator, without which a missing plugin lets containers start unfenced; use the runtime handler, or migrate with `containerd config migrate`"
            ),
        });
    }
    let mut section = plugin_section(&doc, NRI_PLUGIN)
        .map_err(|_| parse_err(format!("plugins.'{NRI_PLUGIN}' is not a table")))?;
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

    let drop_in = drop_in_doc(
        number,
        NRI_PLUGIN,
        section,
        format!(
            "{OWN_FILE_MARK} --mode nri`: NRI enabled, its default validator requiring the\n\
             # `{name}` plugin (every container is refused unless `gpufence nri` processed it).\n\
             # A copy of plugins.'{NRI_PLUGIN}' from {} as it was when written:\n\
             # run configure again after editing that section there.\n",
            main_path.display()
        ),
    );
    add_import(&mut doc, drop_in_path).map_err(parse_err)?;
    Ok((doc.to_string(), drop_in))
}

/// Where containerd looks for pre-registered NRI plugins (`plugin_path` of its NRI section in
/// the main file, else NRI's default), as the host sees it.
pub fn plugin_dir(main: &str) -> PathBuf {
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

/// `cdi_spec_dirs` of a containerd main file, from the CRI runtime plugin of the version it
/// declares (the table `configure` writes the handler into); `Ok(None)` when unset (the
/// engine's default applies). An unsupported version is an error.
pub fn cdi_spec_dirs(text: &str) -> Result<Option<Vec<PathBuf>>, String> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| e.message().to_string())?;
    let number = declared_version(doc.get("version").map(toml::Value::as_integer))?;
    let plugin = version(number)
        .ok_or_else(|| unsupported(number))?
        .cri_runtime_plugin();
    match doc
        .get("plugins")
        .and_then(|p| p.get(plugin))
        .and_then(|t| t.get("cdi_spec_dirs"))
    {
        Some(v) => spec_dirs(v, &format!("plugins.\"{plugin}\".cdi_spec_dirs")).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V2: &str = r#"# Operator's containerd config — keep me
version = 2
root = "/var/lib/containerd"

[grpc]
  address = "/run/containerd/containerd.sock" # the socket

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "localhost/pause:test"
    restrict_oom_score_adj = true          # needed here
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "native"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true
"#;

    const NRI_MAIN: &str = "# operator's file\nversion = 3\nroot = '/var/lib/containerd' # keep\n\n[plugins.'io.containerd.nri.v1.nri']\n  plugin_path = '/custom/nri'\n  plugin_request_timeout = '3s'\n  [plugins.'io.containerd.nri.v1.nri'.default_validator]\n    required_plugins = ['other']\n    tolerate_missing_plugins_annotation = 'tolerate-missing-plugins.noderesource.dev'\n";

    fn bin() -> &'static Path {
        Path::new("/usr/bin/gpufence-runtime")
    }

    fn handler(main: &str) -> Result<(String, String), ConfigureError> {
        runtime_drop_in(
            main,
            Path::new("/etc/containerd/config.toml"),
            Path::new("/etc/containerd/conf.d/gpufence.toml"),
            bin(),
            "gpufence",
        )
    }

    fn nri_drop_in_path() -> PathBuf {
        PathBuf::from("/etc/containerd/conf.d/gpufence-nri.toml")
    }

    #[test]
    fn containerd_v2() {
        let (main, drop) = handler(V2).unwrap();
        // The main file gains only the imports line.
        let added: Vec<&str> = main
            .lines()
            .filter(|l| !V2.lines().any(|o| o == *l))
            .collect();
        assert_eq!(
            added,
            vec![r#"imports = ["/etc/containerd/conf.d/gpufence.toml"]"#]
        );
        assert_eq!(main.lines().count(), V2.lines().count() + 1);
        assert!(main.starts_with("# Operator's containerd config — keep me\n"));
        let idx_imports = main.find("imports").unwrap();
        assert!(idx_imports < main.find("[grpc]").unwrap());

        let d: toml::Table = toml::from_str(&drop).unwrap();
        assert_eq!(d["version"].as_integer(), Some(2));
        let cri = &d["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(cri["sandbox_image"].as_str(), Some("localhost/pause:test"));
        assert_eq!(cri["restrict_oom_score_adj"].as_bool(), Some(true));
        let rt = &cri["containerd"]["runtimes"]["gpufence"];
        assert_eq!(rt["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
        assert_eq!(
            rt["options"]["BinaryName"].as_str(),
            Some("/usr/bin/gpufence-runtime")
        );
        assert_eq!(rt["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(
            rt["pod_annotations"].as_array().unwrap()[0].as_str(),
            Some("gpufence.dev/*")
        );
        // The runc handler is still there.
        assert!(cri["containerd"]["runtimes"].get("runc").is_some());
        assert!(drop.starts_with("# Written by"));

        // Idempotent: configuring the configured file changes nothing.
        let (main2, drop2) = handler(&main).unwrap();
        assert_eq!(main2, main);
        assert_eq!(drop2, drop);
    }

    #[test]
    fn containerd_v3_and_existing_imports() {
        let v3 = "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n# cmt\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\ndefault_runtime_name = 'runc'\n";
        let (main, drop) = handler(v3).unwrap();
        assert_eq!(main, v3, "glob import already covers the drop-in");
        let d: toml::Table = toml::from_str(&drop).unwrap();
        assert_eq!(d["version"].as_integer(), Some(3));
        let rt =
            &d["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["gpufence"];
        assert_eq!(rt["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
        assert!(d["plugins"].get("io.containerd.grpc.v1.cri").is_none());

        let other = "version = 2\nimports = [\"/x/other.toml\"]\n";
        let (main, _) = handler(other).unwrap();
        assert!(
            main.contains(r#"imports = ["/x/other.toml", "/etc/containerd/conf.d/gpufence.toml"]"#),
            "{main}"
        );
    }

    #[test]
    fn containerd_rejects_v1_and_garbage() {
        for bad in [
            "[plugins.cri]\n",
            "version = 1\n",
            "version = 2\n[[[\n",
            "version = \"2\"\n",
        ] {
            assert!(
                runtime_drop_in(
                    bad,
                    Path::new("c.toml"),
                    Path::new("d.toml"),
                    bin(),
                    "gpufence"
                )
                .is_err(),
                "{bad}"
            );
        }
        let e = runtime_drop_in(
            "version = 1\n",
            Path::new("c.toml"),
            Path::new("d.toml"),
            bin(),
            "gpufence",
        )
        .unwrap_err();
        assert!(e.to_string().contains("c.toml"), "{e}");
        assert!(
            e.to_string()
                .contains("config version 1 is not supported (2, 3 or 4)"),
            "{e}"
        );
    }

    #[test]
    fn enables_nri_and_requires_the_plugin_keeping_the_operator_s_keys() {
        let cfg = Path::new("/etc/containerd/config.toml");
        let (main, d) = nri_drop_in(NRI_MAIN, cfg, &nri_drop_in_path(), "gpufence").unwrap();
        // The main file: only the imports entry added, comments kept.
        let added: Vec<&str> = main.lines().filter(|l| !NRI_MAIN.contains(*l)).collect();
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
        let (main2, d2) = nri_drop_in(&main, cfg, &nri_drop_in_path(), "gpufence").unwrap();
        assert_eq!(main2, main);
        assert_eq!(
            d2.lines().skip(4).collect::<Vec<_>>(),
            d.lines().skip(4).collect::<Vec<_>>()
        );
    }

    #[test]
    fn an_empty_v4_file_gets_the_whole_nri_section() {
        let (_, d) = nri_drop_in(
            "version = 4\n",
            Path::new("/c.toml"),
            &nri_drop_in_path(),
            "gf",
        )
        .unwrap();
        let doc: DocumentMut = d.parse().unwrap();
        let v = &doc["plugins"][NRI_PLUGIN]["default_validator"];
        assert_eq!(v["enable"].as_bool(), Some(true));
        assert_eq!(v["required_plugins"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn nri_on_version_2_and_unknown_versions_is_refused() {
        for main in ["version = 2\n", "", "version = 5\n"] {
            let e = nri_drop_in(main, Path::new("/c.toml"), &nri_drop_in_path(), "gf")
                .unwrap_err()
                .to_string();
            assert!(e.contains("default validator"), "{e}");
        }
        let e = nri_drop_in(
            "version = 3\n[plugins]\n'io.containerd.nri.v1.nri' = 1\n",
            Path::new("/c.toml"),
            &nri_drop_in_path(),
            "gf",
        )
        .unwrap_err();
        assert!(e.to_string().contains("is not a table"), "{e}");
    }

    #[test]
    fn the_nri_plugin_dir() {
        assert_eq!(plugin_dir(NRI_MAIN), PathBuf::from("/custom/nri"));
        assert_eq!(
            plugin_dir("version = 3\n"),
            PathBuf::from(DEFAULT_PLUGIN_PATH)
        );
        assert_eq!(plugin_dir("not toml ["), PathBuf::from(DEFAULT_PLUGIN_PATH));
    }

    #[test]
    fn cdi_spec_dirs_come_from_the_version_s_cri_runtime_plugin_only() {
        let v2 = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = true\ncdi_spec_dirs = [\"/etc/cdi\", \"/run/cdi\"]\n";
        assert_eq!(
            cdi_spec_dirs(v2).unwrap(),
            Some(vec![PathBuf::from("/etc/cdi"), PathBuf::from("/run/cdi")])
        );
        let v3 = "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\ncdi_spec_dirs = [\"/opt/cdi\"]\n";
        assert_eq!(
            cdi_spec_dirs(v3).unwrap(),
            Some(vec![PathBuf::from("/opt/cdi")])
        );
        assert_eq!(cdi_spec_dirs("version = 3\n").unwrap(), None);
        // The other version's table is not where this version keeps the key.
        let v3_in_v2_table =
            "version = 3\n[plugins.\"io.containerd.grpc.v1.cri\"]\ncdi_spec_dirs = [\"/x\"]\n";
        assert_eq!(cdi_spec_dirs(v3_in_v2_table).unwrap(), None);
        let e = cdi_spec_dirs("[plugins.\"io.containerd.grpc.v1.cri\"]\n").unwrap_err();
        assert!(e.contains("version 1 is not supported"), "{e}");
        assert!(
            cdi_spec_dirs(
                "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\ncdi_spec_dirs = \"/x\"\n"
            )
            .is_err()
        );
        assert!(
            cdi_spec_dirs(
                "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\ncdi_spec_dirs = [\"rel\"]\n"
            )
            .is_err()
        );
    }

    /// Each version type: the table `configure` writes the handler into is the table the CDI
    /// check reads, and NRI is offered where the validator exists.
    #[test]
    fn each_version_writes_and_reads_one_table() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Path::new("/etc/containerd/config.toml");
        std::fs::create_dir_all(d.path().join("etc/containerd")).unwrap();
        for v in VERSIONS {
            let plugin = v.cri_runtime_plugin();
            let main = format!(
                "version = {}\n[plugins.\"{plugin}\"]\ncdi_spec_dirs = [\"/v{}\"]\n",
                v.number(),
                v.number()
            );
            std::fs::write(d.path().join("etc/containerd/config.toml"), &main).unwrap();
            let w = Containerd
                .runtime_handler(d.path(), cfg, bin(), "gf")
                .unwrap();
            assert_eq!(w.len(), 2);
            assert_eq!(w[0].path, d.path().join("etc/containerd/conf.d/gf.toml"));
            let drop: toml::Table = toml::from_str(&w[0].contents).unwrap();
            assert_eq!(drop["version"].as_integer(), Some(v.number()));
            assert!(
                drop["plugins"][plugin]["containerd"]["runtimes"]
                    .get("gf")
                    .is_some(),
                "{}",
                w[0].contents
            );
            assert_eq!(
                drop["plugins"].as_table().unwrap().len(),
                1,
                "one plugin table: {}",
                w[0].contents
            );
            assert_eq!(
                Containerd.cdi_dirs(d.path(), cfg),
                Ok(Some(vec![PathBuf::from(format!("/v{}", v.number()))]))
            );
            assert_eq!(
                Containerd.nri(d.path(), cfg, "gf").is_ok(),
                v.nri_default_validator()
            );
            // Given back: the main file as the operator wrote it.
            assert_eq!(
                Containerd
                    .give_back(cfg, "gf", cfg, &w[1].contents)
                    .unwrap(),
                main
            );
        }
        assert!(version(1).is_none() && version(5).is_none());
        assert_eq!(supported(), "2, 3 or 4");
    }

    #[test]
    fn the_trait_s_other_answers() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Path::new("/etc/containerd/config.toml");
        // No main file: configure refuses, the CDI check gives the default.
        let e = Containerd
            .runtime_handler(d.path(), cfg, bin(), "gf")
            .unwrap_err();
        assert!(e.to_string().contains("no such file"), "{e}");
        assert_eq!(
            Containerd.cdi_dirs(d.path(), cfg),
            Ok(Some(engine_default()))
        );
        assert_eq!(
            Containerd.written_files(cfg, "gf"),
            [
                PathBuf::from("/etc/containerd/conf.d/gf.toml"),
                cfg.to_path_buf()
            ]
        );
        assert_eq!(
            Containerd.pod_annotations(),
            PodAnnotations::AllowList(&gpufence_core::allocation::ANNOTATION_ALLOW_LIST)
        );
        assert_eq!(
            Containerd.nri_plugin_dir(d.path(), cfg, "gf"),
            Some(PathBuf::from(DEFAULT_PLUGIN_PATH))
        );
        // Other imports stay when gpufence's goes.
        let text = "version = 2\nimports = [\"/x/other.toml\", \"/etc/containerd/conf.d/gpufence.toml\"]\n";
        assert_eq!(
            Containerd.give_back(cfg, "gpufence", cfg, text).unwrap(),
            "version = 2\nimports = [\"/x/other.toml\"]\n"
        );
        assert!(Containerd.give_back(cfg, "gf", cfg, "[[[").is_err());
    }
}
