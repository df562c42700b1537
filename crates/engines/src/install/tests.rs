use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::host::RecordingHost;
use super::*;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpufence-install-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every path under `root` with its kind, mode and contents.
fn tree(root: &Path) -> BTreeMap<PathBuf, String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).unwrap();
        let desc = if md.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            format!("dir {:o}", md.mode())
        } else {
            format!("file {:o} {:?}", md.mode(), std::fs::read(&p).unwrap())
        };
        out.insert(p.strip_prefix(root).unwrap().to_path_buf(), desc);
    }
    out
}

const CONTAINERD: &str = "# the operator's\nversion = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"runc\"\n";

/// A host root with a containerd config, and the installer's own files.
fn setup(name: &str, engine: Engine) -> (PathBuf, Options) {
    let d = scratch(name);
    let host = d.join("host");
    std::fs::create_dir_all(host.join("etc/containerd")).unwrap();
    std::fs::create_dir_all(host.join("usr/bin")).unwrap();
    std::fs::write(host.join("etc/containerd/config.toml"), CONTAINERD).unwrap();
    let src = d.join("image/usr/bin");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(d.join("image/usr/lib/gpufence")).unwrap();
    std::fs::write(src.join("gpufence"), "gpufence v2").unwrap();
    std::fs::write(src.join("gpufence-runtime"), "runtime v2").unwrap();
    std::fs::write(src.join("gpufence-runtime-wrapper"), "runtime wrapper v2").unwrap();
    std::fs::write(d.join("image/usr/lib/gpufence/libgpufence.so"), "shim v2").unwrap();
    let o = Options {
        host_root: host.clone(),
        engine,
        engine_config: PathBuf::from(engine.default_config()),
        handler: "gpufence".into(),
        sources: Sources::beside(&src),
        restart: Restart::Auto,
        dry_run: false,
        // No runc in these host roots: the version check has its own tests.
        allow_vulnerable_runtime: true,
        mode: Mode::Runtime,
    };
    (host, o)
}

/// Installed: installing again changes nothing and restarts nothing; uninstalling puts the
/// host back as `before` (byte for byte) and restarts the engine once.
fn again_then_uninstall(o: &Options, host: &Path, before: &BTreeMap<PathBuf, String>) {
    let after = tree(host);
    let mut h2 = RecordingHost::default();
    install(o, &mut h2).unwrap();
    assert_eq!(tree(host), after);
    assert!(h2.calls.is_empty(), "{:?}", h2.calls);
    let mut h3 = RecordingHost::default();
    uninstall(o, &mut h3).unwrap();
    assert_eq!(&tree(host), before);
    assert_eq!(h3.calls.len(), 1, "restarted once: {:?}", h3.calls);
}

#[test]
fn install_then_uninstall_leaves_the_host_as_it_was() {
    let (host, o) = setup("roundtrip", Engine::Containerd);
    // The host already has an older gpufence binary: kept and put back.
    std::fs::write(host.join("usr/bin/gpufence"), "host's own").unwrap();
    std::fs::create_dir_all(host.join("run/systemd/system")).unwrap();
    let before = tree(&host);

    let mut h = RecordingHost::default();
    let report = install(&o, &mut h).unwrap();
    assert_eq!(
        std::fs::read(host.join("usr/bin/gpufence")).unwrap(),
        b"gpufence v2"
    );
    assert_eq!(
        std::fs::read(host.join("usr/lib/gpufence/libgpufence.so")).unwrap(),
        b"shim v2"
    );
    assert_eq!(
        std::fs::read_to_string(host.join("etc/gpufence/config.toml")).unwrap(),
        DEFAULT_CONFIG
    );
    let drop_in =
        std::fs::read_to_string(host.join("etc/containerd/conf.d/gpufence.toml")).unwrap();
    assert!(
        drop_in.contains("BinaryName = \"/usr/bin/gpufence-runtime\""),
        "{drop_in}"
    );
    let main = std::fs::read_to_string(host.join("etc/containerd/config.toml")).unwrap();
    assert!(
        main.contains("imports = [\"/etc/containerd/conf.d/gpufence.toml\"]"),
        "{main}"
    );
    assert_eq!(
        h.calls,
        vec![format!(
            "chroot {} systemctl restart containerd",
            host.display()
        )],
        "{report:?}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(host.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("usr/bin/gpufence-runtime"), 0o755);
    assert_eq!(mode("usr/bin/gpufence-runtime-wrapper"), 0o755);
    assert_eq!(mode("usr/lib/gpufence/libgpufence.so"), 0o644);

    again_then_uninstall(&o, &host, &before);
    // And again: nothing to do.
    let mut h4 = RecordingHost::default();
    let r = uninstall(&o, &mut h4).unwrap();
    assert_eq!(tree(&host), before);
    assert!(h4.calls.is_empty(), "{r:?}");
}

#[test]
fn dry_run_changes_nothing() {
    let (host, mut o) = setup("dry", Engine::Containerd);
    o.dry_run = true;
    let before = tree(&host);
    let mut h = RecordingHost::default();
    let r = install(&o, &mut h).unwrap();
    assert_eq!(tree(&host), before);
    assert!(h.calls.is_empty());
    assert!(
        r.iter()
            .any(|l| l.contains("would install") && l.ends_with("usr/bin/gpufence-runtime")),
        "{r:?}"
    );
    assert!(
        r.iter().any(|l| l.contains("dry run: not written")),
        "{r:?}"
    );
    o.dry_run = false;
    install(&o, &mut h).unwrap();
    let installed = tree(&host);
    o.dry_run = true;
    uninstall(&o, &mut h).unwrap();
    assert_eq!(tree(&host), installed);
}

#[test]
fn operator_config_and_edited_files_are_kept() {
    let (host, o) = setup("keep", Engine::Containerd);
    std::fs::create_dir_all(host.join("etc/gpufence")).unwrap();
    std::fs::write(
        host.join("etc/gpufence/config.toml"),
        "state-dir = \"/run/x\"\n",
    )
    .unwrap();
    let mut h = RecordingHost::default();
    install(&o, &mut h).unwrap();
    assert_eq!(
        std::fs::read_to_string(host.join("etc/gpufence/config.toml")).unwrap(),
        "state-dir = \"/run/x\"\n"
    );
    // The operator replaces the runtime binary after install: uninstall leaves it.
    std::fs::write(host.join("usr/bin/gpufence-runtime"), "patched").unwrap();
    let r = uninstall(&o, &mut h).unwrap();
    assert!(
        r.iter().any(
            |l| l.starts_with("kept") && l.ends_with("gpufence-runtime: changed since install")
        ),
        "{r:?}"
    );
    assert!(host.join("usr/bin/gpufence-runtime").exists());
    assert!(host.join("etc/gpufence/config.toml").exists());
    assert!(!host.join("usr/bin/gpufence").exists());
    assert!(!host.join("usr/bin/gpufence-runtime-wrapper").exists());
    assert_eq!(
        std::fs::read_to_string(host.join("etc/containerd/config.toml")).unwrap(),
        CONTAINERD
    );
}

#[test]
fn driver_present_warms_the_inventory_and_failure_is_not_fatal() {
    let (host, o) = setup("warm", Engine::Containerd);
    std::fs::create_dir_all(host.join("dev")).unwrap();
    std::fs::write(host.join("dev/nvidiactl"), "").unwrap();
    let mut h = RecordingHost {
        failing: vec!["/usr/bin/gpufence".into()],
        ..Default::default()
    };
    let r = install(&o, &mut h).unwrap();
    assert_eq!(
        h.calls,
        vec![format!(
            "chroot {} /usr/bin/gpufence inventory",
            host.display()
        )]
    );
    assert!(
        r.iter()
            .any(|l| l.starts_with("inventory cache not warmed")),
        "{r:?}"
    );
    assert!(
        r.iter().any(|l| l.starts_with("not restarted")),
        "no systemd: {r:?}"
    );
}

#[test]
fn docker_reloads_on_sighup_and_crio_restarts_under_systemd() {
    let (host, o) = setup("docker", Engine::Docker);
    std::fs::create_dir_all(host.join("run")).unwrap();
    std::fs::write(host.join("run/docker.pid"), "4242\n").unwrap();
    let mut h = RecordingHost::default();
    install(&o, &mut h).unwrap();
    assert_eq!(h.calls, vec!["SIGHUP 4242".to_string()]);
    assert!(
        std::fs::read_to_string(host.join("etc/docker/daemon.json"))
            .unwrap()
            .contains("/usr/bin/gpufence-runtime")
    );
    uninstall(&o, &mut h).unwrap();
    assert!(
        !host.join("etc/docker/daemon.json").exists(),
        "docker had none"
    );
    assert!(!host.join("etc/docker").exists(), "nor its directory");

    let (host, mut o) = setup("crio", Engine::Crio);
    std::fs::create_dir_all(host.join("run/systemd/system")).unwrap();
    let mut h = RecordingHost {
        failing: vec!["systemctl".into()],
        ..Default::default()
    };
    let e = install(&o, &mut h).unwrap_err();
    assert!(
        e.to_string().starts_with("restart crio: systemctl: failed"),
        "{e}"
    );
    o.restart = Restart::Signal;
    let e = uninstall(&o, &mut h).unwrap_err();
    assert!(e.to_string().contains("only dockerd reloads"), "{e}");
}

#[test]
fn bad_host_root_and_missing_sources_are_one_line() {
    let (host, mut o) = setup("bad", Engine::Containerd);
    o.host_root = host.join("nope");
    let e = install(&o, &mut RecordingHost::default()).unwrap_err();
    assert!(e.to_string().contains("nope: not a directory"), "{e}");
    o.host_root = host.clone();
    // The host's runc/crun is checked before the engine is touched; none found is a refusal.
    o.allow_vulnerable_runtime = false;
    let e = install(&o, &mut RecordingHost::default()).unwrap_err();
    assert!(
        e.to_string().ends_with("host: no runc or crun in the host"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(host.join("etc/containerd/config.toml")).unwrap(),
        CONTAINERD
    );
    o.allow_vulnerable_runtime = true;
    o.sources.shim = PathBuf::from("/nonexistent/libgpufence.so");
    let e = install(&o, &mut RecordingHost::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/nonexistent/libgpufence.so: No such file or directory (os error 2)"
    );
}

/// containerd 2.x's file (version 3) with the operator's own NRI settings.
const CONTAINERD_V3: &str = "# the operator's\nversion = 3\n\n[plugins.'io.containerd.nri.v1.nri']\n  plugin_path = '/opt/custom-nri' # theirs\n";

#[test]
fn install_mode_nri_pre_registers_the_plugin_and_requires_it_and_uninstall_reverses_it() {
    let (host, mut o) = setup("nri", Engine::Containerd);
    o.mode = Mode::Nri;
    std::fs::write(host.join("etc/containerd/config.toml"), CONTAINERD_V3).unwrap();
    std::fs::create_dir_all(host.join("run/systemd/system")).unwrap();
    let before = tree(&host);

    let mut h = RecordingHost::default();
    let report = install(&o, &mut h).unwrap();
    // The plugin where containerd's plugin_path says, with absolute paths and the config.
    let wrapper = host.join("opt/custom-nri/90-gpufence");
    let text = std::fs::read_to_string(&wrapper).unwrap();
    assert!(
        text.ends_with("exec /usr/bin/gpufence --config /etc/gpufence/config.toml nri\n"),
        "{text}"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&wrapper).unwrap().permissions().mode() & 0o777,
        0o755
    );
    // No runtime handler binary in this mode.
    assert!(!host.join("usr/bin/gpufence-runtime").exists());
    assert!(!host.join("usr/bin/gpufence-runtime-wrapper").exists());
    // NRI on, the default validator requiring `gpufence`, pod-annotation escape closed.
    let drop_in =
        std::fs::read_to_string(host.join("etc/containerd/conf.d/gpufence-nri.toml")).unwrap();
    let doc: toml_edit::DocumentMut = drop_in.parse().unwrap();
    let nri = &doc["plugins"]["io.containerd.nri.v1.nri"];
    assert_eq!(nri["disable"].as_bool(), Some(false), "{drop_in}");
    assert_eq!(nri["plugin_path"].as_str(), Some("/opt/custom-nri"));
    let v = &nri["default_validator"];
    assert_eq!(v["enable"].as_bool(), Some(true), "{drop_in}");
    assert_eq!(
        v["required_plugins"]
            .as_array()
            .unwrap()
            .get(0)
            .and_then(|x| x.as_str()),
        Some("gpufence")
    );
    assert_eq!(v["tolerate_missing_plugins_annotation"].as_str(), Some(""));
    let main = std::fs::read_to_string(host.join("etc/containerd/config.toml")).unwrap();
    assert_eq!(
        main,
        // Only the imports entry is added; the operator's comments stay.
        CONTAINERD_V3.replacen(
            "version = 3\n",
            "version = 3\nimports = [\"/etc/containerd/conf.d/gpufence-nri.toml\"]\n",
            1
        ),
        "{main}"
    );
    assert_eq!(h.calls.len(), 1, "restarted: {report:?}");

    again_then_uninstall(&o, &host, &before);
}

#[test]
fn install_mode_nri_refuses_what_cannot_fail_closed() {
    // containerd 1.7's version 2 file: no default validator, so no install (nothing written).
    let (host, mut o) = setup("nri-v2", Engine::Containerd);
    o.mode = Mode::Nri;
    let before = tree(&host);
    let e = install(&o, &mut RecordingHost::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("default validator"), "{e}");
    let after = tree(&host);
    let engine_files: Vec<&PathBuf> = after
        .keys()
        .filter(|p| p.starts_with("etc/containerd") || p.starts_with("opt"))
        .collect();
    let before_engine: Vec<&PathBuf> = before
        .keys()
        .filter(|p| p.starts_with("etc/containerd") || p.starts_with("opt"))
        .collect();
    assert_eq!(engine_files, before_engine);
    assert_eq!(
        std::fs::read_to_string(host.join("etc/containerd/config.toml")).unwrap(),
        CONTAINERD
    );
    // docker has no NRI.
    let (_, mut o) = setup("nri-docker", Engine::Docker);
    o.mode = Mode::Nri;
    let e = install(&o, &mut RecordingHost::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("docker has no NRI"), "{e}");
}

/// CRI-O's main file with the operator's NRI plugin directory and a required plugin of theirs.
const CRIO: &str = "# the operator's\n[crio.nri]\nnri_plugin_dir = \"/opt/crio-nri\" # theirs\n\n[crio.nri.default_validator]\nnri_validator_required_plugins = [\"theirs\"]\n";

#[test]
fn install_mode_nri_on_crio_writes_its_drop_in_and_plugin_and_uninstall_reverses_it() {
    let (host, mut o) = setup("nri-crio", Engine::Crio);
    o.mode = Mode::Nri;
    std::fs::create_dir_all(host.join("etc/crio/crio.conf.d")).unwrap();
    std::fs::write(host.join("etc/crio/crio.conf"), CRIO).unwrap();
    std::fs::write(host.join("etc/crio/crio.conf.d/10-op.conf"), "# theirs\n").unwrap();
    std::fs::create_dir_all(host.join("run/systemd/system")).unwrap();
    let before = tree(&host);

    let mut h = RecordingHost::default();
    let report = install(&o, &mut h).unwrap();
    // The plugin where CRI-O's nri_plugin_dir says.
    let text = std::fs::read_to_string(host.join("opt/crio-nri/90-gpufence")).unwrap();
    assert!(text.ends_with("exec /usr/bin/gpufence --config /etc/gpufence/config.toml nri\n"));
    assert!(!host.join("usr/bin/gpufence-runtime").exists());
    assert!(!host.join("usr/bin/gpufence-runtime-wrapper").exists());
    // The drop-in: NRI on, the validator requiring theirs and gpufence, no escape hatch.
    let drop_in =
        std::fs::read_to_string(host.join("etc/crio/crio.conf.d/99-gpufence-nri.conf")).unwrap();
    assert_eq!(
        crate::kinds::crio::nri_required(&drop_in),
        ["theirs", "gpufence"]
    );
    // The operator's files are not touched.
    assert_eq!(
        std::fs::read_to_string(host.join("etc/crio/crio.conf")).unwrap(),
        CRIO
    );
    assert_eq!(h.calls.len(), 1, "{report:?}");
    assert!(
        h.calls[0].contains("systemctl restart crio"),
        "{:?}",
        h.calls
    );

    again_then_uninstall(&o, &host, &before);
}

#[test]
fn install_writes_the_engines_cdi_dirs_and_says_when_they_disagree() {
    let (host, o) = setup("cdi-dirs", Engine::Containerd);
    let with_dirs = format!(
        "{CONTAINERD}[plugins.\"io.containerd.grpc.v1.cri\"]\n  enable_cdi = true\n  cdi_spec_dirs = [\"/opt/cdi\", \"/var/run/cdi\"]\n"
    );
    std::fs::write(host.join("etc/containerd/config.toml"), &with_dirs).unwrap();
    std::fs::create_dir_all(host.join("run/systemd/system")).unwrap();
    let before = tree(&host);
    let mut h = RecordingHost::default();
    install(&o, &mut h).unwrap();
    let text = std::fs::read_to_string(host.join("etc/gpufence/config.toml")).unwrap();
    let cfg = crate::config::Config::from_toml(&text, Path::new(HOST_CONFIG)).unwrap();
    assert_eq!(
        cfg.cdi.spec_dirs,
        [PathBuf::from("/opt/cdi"), PathBuf::from("/var/run/cdi")]
    );
    again_then_uninstall(&o, &host, &before);

    // An existing config.toml is kept, and the disagreement said plainly.
    std::fs::create_dir_all(host.join("etc/gpufence")).unwrap();
    std::fs::write(host.join("etc/gpufence/config.toml"), "# the operator's\n").unwrap();
    let report = install(&o, &mut RecordingHost::default()).unwrap();
    assert!(
        report
            .iter()
            .any(|l| l.starts_with("CDI directories disagree") && l.contains("/opt/cdi")),
        "{report:?}"
    );
}
