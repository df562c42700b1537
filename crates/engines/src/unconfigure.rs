//! `gpufence runtime unconfigure`: take back exactly what `configure` added.
//!
//! `configure` keeps a [`Record`] (JSON, in `--record-dir`, default `/var/lib/gpufence/configure`)
//! of every engine file it wrote: what the file held before (or that it did not exist) and what
//! was written. `unconfigure` puts a file back byte-for-byte when it still holds what was
//! written; a file the operator edited since only loses gpufence's part ([`strip`]: the
//! containerd `imports` entry, docker's `runtimes.<handler>`, gpufence's own drop-in), so their
//! edits survive. Without a record (configured by hand or by an older gpufence) the same
//! stripping applies.
//!
//! Pure functions decide ([`plan_configure`], [`plan_unconfigure`]); the CLI writes.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::configure::{self, ConfigureError, Engine, FileWrite};
pub use crate::engine::OWN_FILE_MARK;

/// Default directory of the records.
pub const DEFAULT_RECORD_DIR: &str = "/var/lib/gpufence/configure";

/// What `configure` changed in one engine's files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub engine: Engine,
    pub handler: String,
    /// The engine's main configuration, as the host sees it.
    pub config: PathBuf,
    pub files: Vec<RecordedFile>,
    /// Directories `configure` created (removed again when empty), deepest last.
    #[serde(default)]
    pub created_dirs: Vec<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedFile {
    /// As the host sees it.
    pub path: PathBuf,
    /// The contents before gpufence; `None`: the file did not exist.
    pub original: Option<String>,
    /// What gpufence wrote.
    pub written: String,
}

/// One change `unconfigure` makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undo {
    /// Write these contents (the original, or the file without gpufence's part).
    Write(FileWrite),
    /// Remove this file (gpufence created it).
    Remove(PathBuf),
    /// Leave this file: `why`.
    Keep { path: PathBuf, why: String },
}

#[derive(Debug, thiserror::Error)]
pub enum UnconfigureError {
    #[error(transparent)]
    Configure(#[from] ConfigureError),
    #[error("record {path}: {message}")]
    Record { path: PathBuf, message: String },
}

/// Where the record of (`engine`, `handler`, host `config`) lives inside `record_dir`.
pub fn record_path(record_dir: &Path, engine: Engine, config: &Path, handler: &str) -> PathBuf {
    let key = crate::fnv::fnv1a64(config.display().to_string().as_bytes());
    record_dir.join(format!(
        "{}-{handler}-{key:016x}.json",
        engine.config().identity().id
    ))
}

/// Read a record; `None` when there is none.
pub fn load_record(path: &Path) -> Result<Option<Record>, UnconfigureError> {
    let bad = |message: String| UnconfigureError::Record {
        path: path.to_path_buf(),
        message,
    };
    match configure::read_optional(path)? {
        None => Ok(None),
        Some(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| bad(e.to_string())),
    }
}

/// `text` without gpufence's part, for the file `path` (as the host sees it) of `engine`.
/// `None`: the whole file is gpufence's (its own drop-in: remove it). Text without gpufence's
/// part comes back unchanged. The engine's type says what its part is
/// (`EngineConfig::give_back`).
pub fn strip(
    engine: Engine,
    config: &Path,
    handler: &str,
    path: &Path,
    text: &str,
) -> Result<Option<String>, ConfigureError> {
    let engine = engine.config();
    if Some(path) == engine.drop_in(config, handler).as_deref() {
        return Ok((!text.starts_with(OWN_FILE_MARK)).then(|| text.to_string()));
    }
    engine.give_back(config, handler, path, text).map(Some)
}

/// The record `configure` keeps for `writes` (from [`configure::plan_writes_at`] with the same
/// `root`), given the `previous` record: a file that still holds what gpufence wrote keeps its
/// recorded original; any other file's original is its current contents without gpufence's part.
pub fn plan_configure(
    root: &Path,
    engine: Engine,
    config: &Path,
    handler: &str,
    writes: &[FileWrite],
    previous: Option<&Record>,
) -> Result<Record, ConfigureError> {
    let mut files = Vec::new();
    let mut created_dirs: Vec<PathBuf> =
        previous.map(|r| r.created_dirs.clone()).unwrap_or_default();
    for w in writes {
        let host = host_path(root, &w.path);
        let current = configure::read_optional(&w.path)?;
        let recorded = previous.and_then(|r| r.files.iter().find(|f| f.path == host));
        let original = match (recorded, &current) {
            (Some(f), Some(c)) if *c == f.written => f.original.clone(),
            (Some(f), None) if f.original.is_none() => None,
            (_, None) => None,
            (_, Some(c)) => strip(engine, config, handler, &host, c)?,
        };
        // Directories the write will create, outermost first.
        let mut missing = Vec::new();
        let mut d = host.parent();
        while let Some(dir) = d {
            if dir == Path::new("/") || configure::in_root(root, dir).exists() {
                break;
            }
            missing.push(dir.to_path_buf());
            d = dir.parent();
        }
        for dir in missing.into_iter().rev() {
            if !created_dirs.contains(&dir) {
                created_dirs.push(dir);
            }
        }
        files.push(RecordedFile {
            path: host,
            original,
            written: w.contents.clone(),
        });
    }
    Ok(Record {
        engine,
        handler: handler.to_string(),
        config: config.to_path_buf(),
        files,
        created_dirs,
    })
}

/// The host's view of `path` lying under `root`.
pub fn host_path(root: &Path, path: &Path) -> PathBuf {
    match path.strip_prefix(root) {
        Ok(rel) => Path::new("/").join(rel),
        Err(_) => path.to_path_buf(),
    }
}

/// What `unconfigure` does to the engine's files under `root`: from the `record` when there is
/// one, else by stripping gpufence's part from the files `configure` would write.
pub fn plan_unconfigure(
    root: &Path,
    engine: Engine,
    config: &Path,
    handler: &str,
    record: Option<&Record>,
) -> Result<Vec<Undo>, ConfigureError> {
    let files: Vec<(PathBuf, Option<&RecordedFile>)> = match record {
        Some(r) => r.files.iter().map(|f| (f.path.clone(), Some(f))).collect(),
        None => engine
            .config()
            .written_files(config, handler)
            .into_iter()
            .map(|f| (f, None))
            .collect(),
    };
    let mut out = Vec::new();
    for (host, recorded) in files {
        let here = configure::in_root(root, &host);
        let Some(current) = configure::read_optional(&here)? else {
            continue;
        };
        let target = match recorded {
            Some(f) if f.written == current => f.original.clone(),
            _ => strip(engine, config, handler, &host, &current)?,
        };
        match target {
            None => out.push(Undo::Remove(here)),
            Some(t) if t == current => {
                if recorded.is_some_and(|f| f.original.as_deref() != Some(current.as_str())) {
                    out.push(Undo::Keep {
                        path: here,
                        why: "edited since configure and holds no gpufence entry".into(),
                    });
                }
            }
            Some(t) => out.push(Undo::Write(FileWrite {
                path: here,
                contents: t,
                unchanged: false,
                mode: 0o644,
            })),
        }
    }
    Ok(out)
}

/// Where one engine's files are: the host's root directory as mounted here, the engine's main
/// file and `gpufence-runtime` as the host sees them, the handler, and the record directory
/// (from here).
#[derive(Debug, Clone)]
pub struct Target {
    pub root: PathBuf,
    pub engine: Engine,
    pub config: PathBuf,
    pub binary: PathBuf,
    /// The runtime handler, or with [`configure::Mode::Nri`] the NRI plugin's name.
    pub handler: String,
    pub record_dir: PathBuf,
    pub mode: configure::Mode,
}

impl Target {
    /// What the engine configuration is kept under (drop-in, record): the handler, or
    /// `<name>-nri` for the NRI mode.
    pub fn config_name(&self) -> String {
        match self.mode {
            configure::Mode::Runtime => self.handler.clone(),
            configure::Mode::Nri => crate::nri_config::config_name(&self.handler),
        }
    }
    pub fn record_path(&self) -> PathBuf {
        record_path(
            &self.record_dir,
            self.engine,
            &self.config,
            &self.config_name(),
        )
    }
}

/// Why `configure` / `unconfigure` could not finish: one line naming the file.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Plan(#[from] UnconfigureError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl From<ConfigureError> for ApplyError {
    fn from(e: ConfigureError) -> Self {
        ApplyError::Plan(UnconfigureError::Configure(e))
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ApplyError + '_ {
    move |source| ApplyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One line per file: what was (or, with `dry_run`, would be) done.
pub type Report = Vec<String>;

/// `configure`: record, then write the engine's files. With `dry_run` nothing is written and
/// the report carries the new contents.
pub fn apply_configure(t: &Target, dry_run: bool) -> Result<Report, ApplyError> {
    let writes =
        configure::plan_writes_mode(&t.root, t.engine, &t.config, &t.binary, &t.handler, t.mode)?;
    let mut report = Vec::new();
    if dry_run {
        for w in &writes {
            let mut c = w.contents.clone();
            if !c.ends_with('\n') {
                c.push('\n');
            }
            report.push(format!(
                "# {} (dry run: not written)\n{c}",
                w.path.display()
            ));
        }
        return Ok(report);
    }
    let rpath = t.record_path();
    let previous = load_record(&rpath)?;
    let record = plan_configure(
        &t.root,
        t.engine,
        &t.config,
        &t.config_name(),
        &writes,
        previous.as_ref(),
    )?;
    if previous.as_ref() != Some(&record) {
        let mut json = serde_json::to_string_pretty(&record).expect("record serialises");
        json.push('\n');
        configure::write(&FileWrite {
            path: rpath.clone(),
            contents: json,
            unchanged: false,
            mode: 0o600,
        })
        .map_err(io_err(&rpath))?;
    }
    for w in &writes {
        if w.unchanged {
            report.push(format!("{}: already up to date", w.path.display()));
        } else {
            configure::write(w).map_err(io_err(&w.path))?;
            report.push(format!("wrote {}", w.path.display()));
        }
    }
    Ok(report)
}

/// `unconfigure`: put the engine's files back, remove the directories `configure` created (when
/// empty) and the record.
pub fn apply_unconfigure(t: &Target, dry_run: bool) -> Result<Report, ApplyError> {
    let rpath = t.record_path();
    let record = load_record(&rpath)?;
    let plan = plan_unconfigure(
        &t.root,
        t.engine,
        &t.config,
        &t.config_name(),
        record.as_ref(),
    )?;
    let verb = |done: &str, would: &str| {
        if dry_run {
            would.to_string()
        } else {
            done.to_string()
        }
    };
    let mut report = Vec::new();
    for u in &plan {
        match u {
            Undo::Write(w) => {
                if !dry_run {
                    configure::write(w).map_err(io_err(&w.path))?;
                }
                report.push(format!(
                    "{} {}",
                    verb("restored", "would restore"),
                    w.path.display()
                ));
            }
            Undo::Remove(p) => {
                if !dry_run {
                    std::fs::remove_file(p).map_err(io_err(p))?;
                }
                report.push(format!(
                    "{} {}",
                    verb("removed", "would remove"),
                    p.display()
                ));
            }
            Undo::Keep { path, why } => report.push(format!("kept {}: {why}", path.display())),
        }
    }
    if dry_run {
        return Ok(report);
    }
    if let Some(r) = &record {
        for d in r.created_dirs.iter().rev() {
            let here = configure::in_root(&t.root, d);
            // Only when empty: anything an operator put there stays.
            if std::fs::remove_dir(&here).is_ok() {
                report.push(format!("removed {}/", here.display()));
            }
        }
        std::fs::remove_file(&rpath).map_err(io_err(&rpath))?;
    }
    if report.is_empty() {
        report.push(format!(
            "{}: nothing of gpufence's to remove",
            t.config.display()
        ));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAIN: &str = "# operator\nversion = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n    default_runtime_name = \"runc\" # keep\n";

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpufence-unconf-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn configure_under(
        root: &Path,
        engine: Engine,
        config: &Path,
        prev: Option<&Record>,
    ) -> Record {
        let writes = configure::plan_writes_at(
            root,
            engine,
            config,
            Path::new("/usr/bin/gpufence-runtime"),
            "gpufence",
        )
        .unwrap();
        let rec = plan_configure(root, engine, config, "gpufence", &writes, prev).unwrap();
        for w in &writes {
            configure::write(w).unwrap();
        }
        rec
    }

    fn undo(root: &Path, engine: Engine, config: &Path, rec: Option<&Record>) -> Vec<Undo> {
        let plan = plan_unconfigure(root, engine, config, "gpufence", rec).unwrap();
        for u in &plan {
            match u {
                Undo::Write(w) => configure::write(w).unwrap(),
                Undo::Remove(p) => std::fs::remove_file(p).unwrap(),
                Undo::Keep { .. } => {}
            }
        }
        plan
    }

    #[test]
    fn containerd_round_trip_is_byte_for_byte_and_idempotent() {
        let root = scratch("ctrd");
        let cfg = Path::new("/etc/containerd/config.toml");
        std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
        std::fs::write(root.join("etc/containerd/config.toml"), MAIN).unwrap();
        let rec = configure_under(&root, Engine::Containerd, cfg, None);
        assert_eq!(
            rec.created_dirs,
            vec![PathBuf::from("/etc/containerd/conf.d")]
        );
        let main_now = std::fs::read_to_string(root.join("etc/containerd/config.toml")).unwrap();
        assert!(main_now.contains("imports = [\"/etc/containerd/conf.d/gpufence.toml\"]"));
        // Configure again: the record keeps the first original.
        let rec2 = configure_under(&root, Engine::Containerd, cfg, Some(&rec));
        assert_eq!(rec2, rec);
        undo(&root, Engine::Containerd, cfg, Some(&rec));
        assert_eq!(
            std::fs::read_to_string(root.join("etc/containerd/config.toml")).unwrap(),
            MAIN
        );
        assert!(!root.join("etc/containerd/conf.d/gpufence.toml").exists());
        // Nothing left to do the second time, with or without the record.
        assert!(undo(&root, Engine::Containerd, cfg, Some(&rec)).is_empty());
        assert!(undo(&root, Engine::Containerd, cfg, None).is_empty());
    }

    #[test]
    fn operator_edits_after_configure_survive() {
        let root = scratch("edit");
        let cfg = Path::new("/etc/containerd/config.toml");
        std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
        std::fs::write(root.join("etc/containerd/config.toml"), MAIN).unwrap();
        let rec = configure_under(&root, Engine::Containerd, cfg, None);
        let main = root.join("etc/containerd/config.toml");
        let edited = format!(
            "{}# added later by the operator\n",
            std::fs::read_to_string(&main).unwrap()
        );
        std::fs::write(&main, &edited).unwrap();
        undo(&root, Engine::Containerd, cfg, Some(&rec));
        assert_eq!(
            std::fs::read_to_string(&main).unwrap(),
            format!("{MAIN}# added later by the operator\n")
        );
    }

    #[test]
    fn docker_without_record_and_with() {
        let root = scratch("docker");
        let cfg = Path::new("/etc/docker/daemon.json");
        std::fs::create_dir_all(root.join("etc/docker")).unwrap();
        let orig = "{\n  \"log-driver\": \"json-file\",\n  \"data-root\":\"/d\"\n}\n";
        std::fs::write(root.join("etc/docker/daemon.json"), orig).unwrap();
        let rec = configure_under(&root, Engine::Docker, cfg, None);
        undo(&root, Engine::Docker, cfg, Some(&rec));
        assert_eq!(
            std::fs::read_to_string(root.join("etc/docker/daemon.json")).unwrap(),
            orig
        );
        // Without a record the entry goes, the rest stays (re-serialised).
        configure_under(&root, Engine::Docker, cfg, None);
        undo(&root, Engine::Docker, cfg, None);
        let v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(root.join("etc/docker/daemon.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"log-driver": "json-file", "data-root": "/d"})
        );
        // A daemon.json that did not exist is removed again.
        std::fs::remove_file(root.join("etc/docker/daemon.json")).unwrap();
        let rec = configure_under(&root, Engine::Docker, cfg, None);
        assert_eq!(rec.files[0].original, None);
        undo(&root, Engine::Docker, cfg, Some(&rec));
        assert!(!root.join("etc/docker/daemon.json").exists());
    }

    #[test]
    fn crio_drop_in_removed_operator_file_kept() {
        let root = scratch("crio");
        let cfg = Path::new("/etc/crio/crio.conf");
        let rec = configure_under(&root, Engine::Crio, cfg, None);
        assert!(root.join("etc/crio/crio.conf.d/99-gpufence.conf").exists());
        undo(&root, Engine::Crio, cfg, Some(&rec));
        assert!(!root.join("etc/crio/crio.conf.d/99-gpufence.conf").exists());
        // An operator's file at that path (not written by gpufence) is left alone.
        std::fs::write(
            root.join("etc/crio/crio.conf.d/99-gpufence.conf"),
            "# mine\n",
        )
        .unwrap();
        assert!(undo(&root, Engine::Crio, cfg, None).is_empty());
        assert!(root.join("etc/crio/crio.conf.d/99-gpufence.conf").exists());
    }

    #[test]
    fn strip_leaves_other_imports() {
        let cfg = Path::new("/etc/containerd/config.toml");
        let text = "version = 2\nimports = [\"/x/other.toml\", \"/etc/containerd/conf.d/gpufence.toml\"]\n";
        let out = strip(Engine::Containerd, cfg, "gpufence", cfg, text)
            .unwrap()
            .unwrap();
        assert_eq!(out, "version = 2\nimports = [\"/x/other.toml\"]\n");
        assert_eq!(
            record_path(Path::new("/r"), Engine::Containerd, cfg, "gpufence"),
            record_path(Path::new("/r"), Engine::Containerd, cfg, "gpufence")
        );
    }
}
