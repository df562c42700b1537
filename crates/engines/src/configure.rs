//! Register `gpufence-runtime` with a container engine, as drop-ins wherever the engine has
//! them, never rewriting what the operator wrote.
//!
//! * containerd (config `version = 2`, `3` or `4`): a drop-in `conf.d/gpufence.toml` beside the main
//!   file, pulled in by an `imports` entry added to the main file (the only change there; its
//!   comments and layout are kept by `toml_edit`). containerd 1.x *replaces* a whole plugin
//!   section from an imported file instead of merging it, so the drop-in carries a copy of the
//!   operator's CRI runtime plugin section plus the `gpufence` handler; re-run `configure` after
//!   editing that section in the main file.
//! * CRI-O: a drop-in `crio.conf.d/99-gpufence.conf` (CRI-O merges drop-ins key by key).
//! * docker: a `runtimes.gpufence` entry in `daemon.json`; every other key is kept, in order.
//!
//! Pure functions compute the file contents ([`plan_writes`]); [`write`] writes atomically.

use std::path::Path;

use toml_edit::{DocumentMut, Item, Table, value};

pub use crate::engine::{
    ConfigureError, Engine, FileWrite, Mode, add_import, drop_in_path, file_write, in_root,
    parse_containerd, read_optional, string_array,
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
/// enables NRI and requires the plugin named `handler` ([`crate::nri_config`]); `binary` is
/// then unused.
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
    let here = |p: &Path| in_root(root, p);
    if mode == Mode::Nri {
        return crate::nri_config::plan_writes(root, engine, config, handler);
    }
    let drop_in = drop_in_path(engine, config, handler);
    match (engine, drop_in) {
        (Engine::Containerd, Some(drop_in_path)) => {
            let main =
                read_optional(&here(config))?.ok_or_else(|| ConfigureError::Unsupported {
                    path: config.to_path_buf(),
                    message: "no such file: create it first (`containerd config default`)".into(),
                })?;
            let (new_main, drop_in) = containerd(&main, config, &drop_in_path, binary, handler)?;
            Ok(vec![
                file_write(here(&drop_in_path), drop_in, 0o644)?,
                file_write(here(config), new_main, 0o644)?,
            ])
        }
        (Engine::Crio, Some(path)) => {
            Ok(vec![file_write(here(&path), crio(binary, handler), 0o644)?])
        }
        _ => {
            let text = read_optional(&here(config))?;
            let new = docker(text.as_deref(), config, binary, handler)?;
            Ok(vec![file_write(here(config), new, 0o644)?])
        }
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

/// containerd: (new main file, drop-in). Errors on config version 1 or an unparsable file.
pub fn containerd(
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
    let (mut doc, version) = parse_containerd(main, main_path)?;
    let plugin = match version {
        2 => "io.containerd.grpc.v1.cri",
        // containerd 2.0–2.2 write version 3, 2.3 writes version 4: the CRI runtime plugin
        // and its runtime keys are the same in both.
        3 | 4 => "io.containerd.cri.v1.runtime",
        v => {
            return Err(ConfigureError::Unsupported {
                path: main_path.to_path_buf(),
                message: format!(
                    "containerd config version {v} is not supported (2, 3 or 4): migrate it with `containerd config migrate`"
                ),
            });
        }
    };

    // The operator's CRI runtime section, copied whole (containerd 1.x replaces plugin sections
    // from imports rather than merging them).
    let mut section: Table = match doc.get("plugins").and_then(|p| p.get(plugin)) {
        Some(Item::Table(t)) => t.clone(),
        Some(Item::Value(toml_edit::Value::InlineTable(t))) => t.clone().into_table(),
        Some(_) => return Err(parse_err(format!("plugins.\"{plugin}\" is not a table"))),
        None => Table::new(),
    };
    section.decor_mut().clear();
    if section.get("containerd").is_none() {
        let mut t = Table::new();
        t.set_implicit(true);
        section.insert("containerd", Item::Table(t));
    }
    let ctr = section
        .get_mut("containerd")
        .and_then(Item::as_table_like_mut)
        .ok_or_else(|| parse_err(format!("plugins.\"{plugin}\".containerd is not a table")))?;
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
    if ctr.get("runtimes").is_none() {
        let mut t = Table::new();
        t.set_implicit(true);
        ctr.insert("runtimes", Item::Table(t));
    }
    let runtimes = ctr
        .get_mut("runtimes")
        .and_then(Item::as_table_like_mut)
        .ok_or_else(|| {
            parse_err(format!(
                "plugins.\"{plugin}\".containerd.runtimes is not a table"
            ))
        })?;
    let mut rt = Table::new();
    rt.insert("runtime_type", value("io.containerd.runc.v2"));
    rt.insert(
        "pod_annotations",
        value(string_array(ANNOTATION_ALLOW_LIST)),
    );
    rt.insert(
        "container_annotations",
        value(string_array(ANNOTATION_ALLOW_LIST)),
    );
    let mut opts = Table::new();
    opts.insert("BinaryName", value(binary.display().to_string()));
    if let Some(s) = systemd {
        opts.insert("SystemdCgroup", value(s));
    }
    rt.insert("options", Item::Table(opts));
    runtimes.insert(handler, Item::Table(rt));

    let mut drop_in = DocumentMut::new();
    drop_in.insert("version", value(version));
    let mut plugins = Table::new();
    plugins.set_implicit(true);
    plugins.insert(plugin, Item::Table(section));
    drop_in.insert("plugins", Item::Table(plugins));
    drop_in.decor_mut().set_prefix(format!(
        "# Written by `gpufence runtime configure --runtime containerd`: the `{handler}` runtime handler.\n\
         # containerd replaces a whole plugin section from an imported file, so this holds a copy of\n\
         # plugins.\"{plugin}\" from {} as it was when written:\n\
         # run configure again after editing that section there.\n",
        main_path.display()
    ));
    let drop_in = drop_in.to_string();

    add_import(&mut doc, drop_in_path).map_err(parse_err)?;
    Ok((doc.to_string(), drop_in))
}

/// CRI-O drop-in.
pub fn crio(binary: &Path, handler: &str) -> String {
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

/// docker `daemon.json` with `runtimes.<handler>` set; other keys kept in their order.
pub fn docker(
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
    docker_render(&v, text).map_err(|e| parse_err(e.to_string()))
}

/// `daemon.json` text for `v`, indented like the operator's `text` (first indented line), 4
/// spaces by default; ends with a newline.
pub fn docker_render(
    v: &serde_json::Value,
    text: Option<&str>,
) -> Result<String, serde_json::Error> {
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

    fn bin() -> &'static Path {
        Path::new("/usr/bin/gpufence-runtime")
    }

    #[test]
    fn containerd_v2() {
        let (main, drop) = containerd(
            V2,
            Path::new("/etc/containerd/config.toml"),
            Path::new("/etc/containerd/conf.d/gpufence.toml"),
            bin(),
            "gpufence",
        )
        .unwrap();
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
        let (main2, drop2) = containerd(
            &main,
            Path::new("/etc/containerd/config.toml"),
            Path::new("/etc/containerd/conf.d/gpufence.toml"),
            bin(),
            "gpufence",
        )
        .unwrap();
        assert_eq!(main2, main);
        assert_eq!(drop2, drop);
    }

    #[test]
    fn containerd_v3_and_existing_imports() {
        let v3 = "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n# cmt\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\ndefault_runtime_name = 'runc'\n";
        let (main, drop) = containerd(
            v3,
            Path::new("/etc/containerd/config.toml"),
            Path::new("/etc/containerd/conf.d/gpufence.toml"),
            bin(),
            "gpufence",
        )
        .unwrap();
        assert_eq!(main, v3, "glob import already covers the drop-in");
        let d: toml::Table = toml::from_str(&drop).unwrap();
        assert_eq!(d["version"].as_integer(), Some(3));
        let rt =
            &d["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["gpufence"];
        assert_eq!(rt["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
        assert!(d["plugins"].get("io.containerd.grpc.v1.cri").is_none());

        let other = "version = 2\nimports = [\"/x/other.toml\"]\n";
        let (main, _) = containerd(
            other,
            Path::new("/etc/containerd/config.toml"),
            Path::new("/etc/containerd/conf.d/gpufence.toml"),
            bin(),
            "gpufence",
        )
        .unwrap();
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
                containerd(
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
        let e = containerd(
            "version = 1\n",
            Path::new("c.toml"),
            Path::new("d.toml"),
            bin(),
            "gpufence",
        )
        .unwrap_err();
        assert!(e.to_string().contains("c.toml"), "{e}");
    }

    #[test]
    fn crio_drop_in() {
        let s = crio(bin(), "gpufence");
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
    fn docker_keeps_keys() {
        let orig = "{\n  \"log-driver\": \"json-file\",\n  \"runtimes\": {\n    \"nvidia\": {\"path\": \"nvidia-container-runtime\", \"runtimeArgs\": []}\n  },\n  \"data-root\": \"/d\"\n}\n";
        let out = docker(Some(orig), Path::new("daemon.json"), bin(), "gpufence").unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["log-driver", "runtimes", "data-root"]);
        assert_eq!(v["runtimes"]["nvidia"]["path"], "nvidia-container-runtime");
        assert_eq!(
            v["runtimes"]["gpufence"]["path"],
            "/usr/bin/gpufence-runtime"
        );
        assert!(out.contains("\n  \"log-driver\""), "indent kept: {out}");
        let again = docker(Some(&out), Path::new("daemon.json"), bin(), "gpufence").unwrap();
        assert_eq!(again, out);
        let fresh = docker(None, Path::new("daemon.json"), bin(), "gpufence").unwrap();
        assert!(fresh.contains("\"gpufence\""));
        assert!(docker(Some("[1]"), Path::new("daemon.json"), bin(), "gpufence").is_err());
        assert!(
            docker(
                Some("{\"runtimes\": 3}"),
                Path::new("daemon.json"),
                bin(),
                "gpufence"
            )
            .is_err()
        );
    }

    #[test]
    fn handler_name_checked() {
        assert!(plan_writes(Engine::Crio, Path::new("/x/crio.conf"), bin(), "a/b").is_err());
    }
}
