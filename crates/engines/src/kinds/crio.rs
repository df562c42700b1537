//! CRI-O: everything in drop-ins under `crio.conf.d/` beside the main file, which CRI-O loads
//! after the main file in name order, merging key by key; the main file is never written.
//!
//! * The runtime handler: `99-<handler>.conf`, a `[crio.runtime.runtimes.<handler>]` table.
//!   CRI-O passes every pod annotation into the OCI spec, so there is no allow-list to write.
//! * NRI (CRI-O ≥ 1.34: `[crio.nri.default_validator]`): `99-<name>-nri.conf`:
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
//! * CDI: `[crio.runtime] cdi_spec_dirs`, the last file that sets it winning.
//! * Given back: the drop-ins are gpufence's whole; nothing else is touched.

use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item, Table, value};

use super::engine_config::{EngineConfig, Identity, PodAnnotations};
use crate::cdi_dirs::{engine_default, spec_dirs};
use crate::engine::{
    ConfigureError, FileWrite, OWN_FILE_MARK, file_write, in_root, read_optional, string_array,
};
use crate::nri_config::{DEFAULT_PLUGIN_PATH, config_name};

const IDENTITY: Identity = Identity {
    id: "crio",
    name: "CRI-O",
    default_config: "/etc/crio/crio.conf",
    restart_hint: "restart CRI-O (or send it SIGHUP) to load the gpufence runtime",
    reload_on_hangup: None,
};

/// CRI-O (`crio.conf` and `crio.conf.d/`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Crio;

impl EngineConfig for Crio {
    fn identity(&self) -> &'static Identity {
        &IDENTITY
    }
    fn drop_in(&self, config: &Path, name: &str) -> Option<PathBuf> {
        let dir = config.parent().unwrap_or(Path::new("/"));
        Some(dir.join("crio.conf.d").join(format!("99-{name}.conf")))
    }
    fn written_files(&self, config: &Path, name: &str) -> Vec<PathBuf> {
        self.drop_in(config, name).into_iter().collect()
    }
    fn pod_annotations(&self) -> PodAnnotations {
        PodAnnotations::All
    }
    fn runtime_handler(
        &self,
        root: &Path,
        config: &Path,
        binary: &Path,
        handler: &str,
    ) -> Result<Vec<FileWrite>, ConfigureError> {
        let path = self.drop_in(config, handler).unwrap_or_default();
        Ok(vec![file_write(
            in_root(root, &path),
            runtime_drop_in(binary, handler),
            0o644,
        )?])
    }
    fn nri(
        &self,
        root: &Path,
        config: &Path,
        name: &str,
    ) -> Result<Vec<FileWrite>, ConfigureError> {
        let own = in_root(
            root,
            &self.drop_in(config, &config_name(name)).unwrap_or_default(),
        );
        let layers = layers(&in_root(root, config), &own)?;
        let drop_in =
            nri_drop_in(&layers, name).map_err(|(file, message)| ConfigureError::Parse {
                path: file,
                message,
            })?;
        Ok(vec![file_write(own, drop_in, 0o644)?])
    }
    fn nri_plugin_dir(&self, root: &Path, config: &Path, name: &str) -> Option<PathBuf> {
        let own = in_root(
            root,
            &self.drop_in(config, &config_name(name)).unwrap_or_default(),
        );
        Some(
            layers(&in_root(root, config), &own)
                .map(|l| plugin_dir(&l))
                .unwrap_or_else(|_| PathBuf::from(DEFAULT_PLUGIN_PATH)),
        )
    }
    fn cdi_dirs(&self, root: &Path, config: &Path) -> Result<Option<Vec<PathBuf>>, String> {
        let read = |p: &Path| read_optional(&in_root(root, p)).map_err(|e| e.to_string());
        let mut files = vec![config.to_path_buf()];
        let dropins = Path::new("/etc/crio/crio.conf.d");
        if let Ok(rd) = std::fs::read_dir(in_root(root, dropins)) {
            let mut names: Vec<PathBuf> = rd
                .filter_map(|e| e.ok())
                .map(|e| dropins.join(e.file_name()))
                .filter(|p| p.extension().is_some_and(|x| x == "conf"))
                .collect();
            names.sort();
            files.extend(names);
        }
        let mut found = None;
        for f in files {
            if let Some(text) = read(&f)?
                && let Some(d) =
                    cdi_spec_dirs(&text).map_err(|e| format!("{}: {e}", f.display()))?
            {
                found = Some(d);
            }
        }
        Ok(Some(found.unwrap_or_else(engine_default)))
    }
    fn give_back(
        &self,
        _config: &Path,
        _name: &str,
        _path: &Path,
        text: &str,
    ) -> Result<String, ConfigureError> {
        Ok(text.to_string())
    }
}

/// The runtime handler's drop-in.
pub fn runtime_drop_in(binary: &Path, handler: &str) -> String {
    let mut doc = DocumentMut::new();
    let mut rt = Table::new();
    rt.insert("runtime_path", value(binary.display().to_string()));
    rt.insert("runtime_type", value("oci"));
    // Its own state root: never the same directory as gpufence's `state-dir` (/run/gpufence).
    rt.insert("runtime_root", value(format!("/run/{handler}-runtime")));
    let mut runtimes = Table::new();
    runtimes.set_implicit(true);
    runtimes.insert(handler, Item::Table(rt));
    let mut runtime = Table::new();
    runtime.set_implicit(true);
    runtime.insert("runtimes", Item::Table(runtimes));
    let mut crio = Table::new();
    crio.set_implicit(true);
    crio.insert("runtime", Item::Table(runtime));
    doc.insert("crio", Item::Table(crio));
    doc.decor_mut().set_prefix(format!(
        "# Written by `gpufence runtime configure --runtime crio`: the `{handler}` runtime handler.\n\
         # CRI-O passes pod annotations into the OCI spec, where gpufence-runtime reads them.\n"
    ));
    doc.to_string()
}

/// `[crio.runtime] cdi_spec_dirs` of a CRI-O file; `Ok(None)` when unset.
pub fn cdi_spec_dirs(text: &str) -> Result<Option<Vec<PathBuf>>, String> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| e.message().to_string())?;
    match doc
        .get("crio")
        .and_then(|c| c.get("runtime"))
        .and_then(|r| r.get("cdi_spec_dirs"))
    {
        Some(v) => spec_dirs(v, "crio.runtime.cdi_spec_dirs").map(Some),
        None => Ok(None),
    }
}

/// CRI-O's configuration as it loads it, before gpufence's drop-in `own`: (file, text) of the
/// main file (when present) and of every other `crio.conf.d/*.conf`, in CRI-O's order (lexical).
pub fn layers(main: &Path, own: &Path) -> Result<Vec<(PathBuf, String)>, ConfigureError> {
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
fn nri_value(
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

/// The NRI drop-in (`crio.conf.d/99-<name>-nri.conf`, loaded after the operator's files, key by
/// key): NRI on, its default validator (CRI-O ≥ 1.34) requiring plugin `name` besides the ones
/// `layers` already require, its pod-annotation escape hatch cleared.
pub fn nri_drop_in(layers: &[(PathBuf, String)], name: &str) -> Result<String, (PathBuf, String)> {
    let mut required: Vec<String> = nri_value(
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
pub fn plugin_dir(layers: &[(PathBuf, String)]) -> PathBuf {
    nri_value(layers, None, "nri_plugin_dir")
        .ok()
        .flatten()
        .and_then(|v| v.as_str().filter(|p| p.starts_with('/')).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PLUGIN_PATH))
}

/// An NRI drop-in's required plugins, once checked to turn NRI and its validator on with the
/// escape hatch cleared (tests).
#[cfg(test)]
pub(crate) fn nri_required(drop_in: &str) -> Vec<String> {
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

    fn bin() -> &'static Path {
        Path::new("/usr/bin/gpufence-runtime")
    }

    #[test]
    fn crio_drop_in() {
        let s = runtime_drop_in(bin(), "gpufence");
        let t: toml::Table = toml::from_str(&s).unwrap();
        let rt = &t["crio"]["runtime"]["runtimes"]["gpufence"];
        assert_eq!(
            rt["runtime_path"].as_str(),
            Some("/usr/bin/gpufence-runtime")
        );
        assert_eq!(rt["runtime_type"].as_str(), Some("oci"));
        assert!(!s.contains("[crio]\n"), "implicit parents: {s}");
    }

    #[test]
    fn crio_gets_nri_and_its_validator_keeping_required_plugins() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc/crio");
        let cfg = Path::new("/etc/crio/crio.conf");
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
        let w = Crio.nri(dir.path(), cfg, "gpufence").unwrap();
        assert_eq!(w.len(), 1, "the main file is not touched");
        assert_eq!(w[0].path, etc.join("crio.conf.d/99-gpufence-nri.conf"));
        assert!(
            w[0].contents.starts_with(OWN_FILE_MARK),
            "{}",
            w[0].contents
        );
        // The last layer's list (CRI-O replaces arrays), plus gpufence.
        assert_eq!(nri_required(&w[0].contents), ["b", "gpufence"]);
        assert!(!w[0].contents.contains("\n[crio]\n"), "implicit parent");
        // Its own earlier file is not a layer: configuring again gives the same file.
        std::fs::write(&w[0].path, &w[0].contents).unwrap();
        let again = Crio.nri(dir.path(), cfg, "gpufence").unwrap();
        assert_eq!(again[0].contents, w[0].contents);
        assert_eq!(
            Crio.nri_plugin_dir(dir.path(), cfg, "gpufence"),
            Some(PathBuf::from("/custom/nri"))
        );
        assert_eq!(plugin_dir(&[]), PathBuf::from(DEFAULT_PLUGIN_PATH));
        // No main file: a node running on CRI-O's defaults.
        std::fs::remove_file(etc.join("crio.conf")).unwrap();
        assert!(Crio.nri(dir.path(), cfg, "gf").is_ok());
        // A layer that is not TOML is named.
        std::fs::write(etc.join("crio.conf.d/20-bad.conf"), "[crio").unwrap();
        let e = Crio.nri(dir.path(), cfg, "gf").unwrap_err();
        assert!(e.to_string().contains("20-bad.conf"), "{e}");
    }

    #[test]
    fn the_trait_writes_only_drop_ins_and_reads_cdi_dirs_from_the_last_file() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Path::new("/etc/crio/crio.conf");
        let w = Crio.runtime_handler(d.path(), cfg, bin(), "gf").unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].path, d.path().join("etc/crio/crio.conf.d/99-gf.conf"));
        assert_eq!(
            Crio.written_files(cfg, "gf"),
            [PathBuf::from("/etc/crio/crio.conf.d/99-gf.conf")]
        );
        assert_eq!(
            Crio.give_back(cfg, "gf", cfg, "x = 1\n").unwrap(),
            "x = 1\n"
        );
        assert_eq!(Crio.pod_annotations(), PodAnnotations::All);
        assert_eq!(Crio.identity().reload_on_hangup, None);
        // CDI: the default, then the main file's, then the last drop-in's.
        assert_eq!(Crio.cdi_dirs(d.path(), cfg), Ok(Some(engine_default())));
        let etc = d.path().join("etc/crio");
        std::fs::create_dir_all(etc.join("crio.conf.d")).unwrap();
        std::fs::write(
            etc.join("crio.conf"),
            "[crio.runtime]\ncdi_spec_dirs = [\"/a\"]\n",
        )
        .unwrap();
        assert_eq!(
            Crio.cdi_dirs(d.path(), cfg),
            Ok(Some(vec![PathBuf::from("/a")]))
        );
        std::fs::write(
            etc.join("crio.conf.d/50-x.conf"),
            "[crio.runtime]\ncdi_spec_dirs = [\"/b\"]\n",
        )
        .unwrap();
        assert_eq!(
            Crio.cdi_dirs(d.path(), cfg),
            Ok(Some(vec![PathBuf::from("/b")]))
        );
        std::fs::write(etc.join("crio.conf.d/60-y.conf"), "[crio").unwrap();
        let e = Crio.cdi_dirs(d.path(), cfg).unwrap_err();
        assert!(e.contains("60-y.conf"), "{e}");
    }

    #[test]
    fn crio_cdi_spec_dirs() {
        assert_eq!(
            cdi_spec_dirs("[crio.runtime]\ncdi_spec_dirs = [\"/etc/cdi\"]\n").unwrap(),
            Some(vec![PathBuf::from("/etc/cdi")])
        );
        assert_eq!(cdi_spec_dirs("[crio.runtime]\n").unwrap(), None);
    }
}
