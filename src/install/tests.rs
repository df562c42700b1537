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
    };
    (host, o)
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
    assert_eq!(mode("usr/lib/gpufence/libgpufence.so"), 0o644);

    // Again: nothing changes, nothing restarts.
    let after = tree(&host);
    let mut h2 = RecordingHost::default();
    install(&o, &mut h2).unwrap();
    assert_eq!(tree(&host), after);
    assert!(h2.calls.is_empty(), "{:?}", h2.calls);

    let mut h3 = RecordingHost::default();
    uninstall(&o, &mut h3).unwrap();
    assert_eq!(tree(&host), before);
    assert_eq!(h3.calls.len(), 1, "restarted once: {:?}", h3.calls);
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
