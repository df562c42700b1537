//! `gpufence runtime configure` against real files: what it writes, and that everything else is
//! left as it was. (The containerd drop-in is also exercised by a real containerd in
//! runtime_cri.rs.) No root needed.

mod common;

use std::path::Path;
use std::process::Command;

/// `gpufence runtime configure ARGS` in front of a (fake) fixed runc: the version check has its
/// own tests below.
fn configure(args: &[&str]) -> (i32, String, String) {
    engine_cmd("configure", args)
}

/// `gpufence runtime configure|unconfigure ARGS` in front of the fixed runc, keeping its records
/// in this process's own directory (not the node's /var/lib/gpufence).
fn engine_cmd(verb: &str, args: &[&str]) -> (i32, String, String) {
    static FIXED: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let cfg = FIXED.get_or_init(|| {
        fake_runtime(
            &common::scratch("cfg-fixed-rt"),
            "runc",
            "runc version 1.3.3",
        )
    });
    common::run(
        Command::new(common::bin("gpufence"))
            .env("GPUFENCE_CONFIG", cfg)
            .args(["runtime", verb])
            .args(args)
            .arg("--record-dir")
            .arg(records()),
    )
}

fn records() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("gpufence-cfg-records-{}", std::process::id()))
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = Vec::new();
    fn walk(d: &Path, base: &Path, v: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, base, v);
            } else {
                v.push((
                    p.strip_prefix(base).unwrap().display().to_string(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    walk(dir, dir, &mut v);
    v.sort();
    v
}

#[test]
fn containerd_v2_and_v3_drop_ins() {
    for (version, plugin) in [
        (2, "io.containerd.grpc.v1.cri"),
        (3, "io.containerd.cri.v1.runtime"),
    ] {
        let s = common::scratch(&format!("cfg-ctrd{version}"));
        let main = s.join("config.toml");
        let original = format!(
            "# operator comment\nversion = {version}\n\n[plugins]\n  # keep me too\n  [plugins.\"{plugin}\".containerd]\n    default_runtime_name = \"runc\" # trailing\n    [plugins.\"{plugin}\".containerd.runtimes.runc.options]\n      SystemdCgroup = true\n"
        );
        std::fs::write(&main, &original).unwrap();
        std::fs::create_dir_all(s.join("conf.d")).unwrap();
        std::fs::write(
            s.join("conf.d/other.toml"),
            "version = 2\n# someone else's\n",
        )
        .unwrap();

        // Dry run: prints both files, writes nothing.
        let before = snapshot(&s);
        let (code, out, err) = configure(&[
            "--runtime",
            "containerd",
            "--config",
            main.to_str().unwrap(),
            "--dry-run",
        ]);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("conf.d/gpufence.toml") && out.contains("BinaryName"),
            "{out}"
        );
        assert_eq!(snapshot(&s), before, "dry run wrote nothing");

        let (code, out, err) = configure(&[
            "--runtime",
            "containerd",
            "--config",
            main.to_str().unwrap(),
            "--runtime-binary",
            "/opt/gf/gpufence-runtime",
        ]);
        assert_eq!(code, 0, "{out}{err}");
        let now = std::fs::read_to_string(&main).unwrap();
        let expected_import = format!(
            "imports = [\"{}\"]",
            s.join("conf.d/gpufence.toml").display()
        );
        let added: Vec<&str> = now
            .lines()
            .filter(|l| !original.lines().any(|o| o == *l))
            .collect();
        assert_eq!(added, vec![expected_import.as_str()], "{now}");
        assert_eq!(now.replace(&format!("{expected_import}\n"), ""), original);
        assert_eq!(
            std::fs::read_to_string(s.join("conf.d/other.toml")).unwrap(),
            "version = 2\n# someone else's\n"
        );

        let d: toml::Table =
            toml::from_str(&std::fs::read_to_string(s.join("conf.d/gpufence.toml")).unwrap())
                .unwrap();
        assert_eq!(d["version"].as_integer(), Some(version));
        let rt = &d["plugins"][plugin]["containerd"]["runtimes"]["gpufence"];
        assert_eq!(rt["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
        assert_eq!(
            rt["options"]["BinaryName"].as_str(),
            Some("/opt/gf/gpufence-runtime")
        );
        assert_eq!(
            rt["options"]["SystemdCgroup"].as_bool(),
            Some(true),
            "cgroup driver matches runc's"
        );
        let pods: Vec<&str> = rt["pod_annotations"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert!(pods.contains(&"gpufence.dev/*") && pods.contains(&"cdi.k8s.io/*"));

        // Second run: nothing changes.
        let after = snapshot(&s);
        let (code, out, _) = configure(&[
            "--runtime",
            "containerd",
            "--config",
            main.to_str().unwrap(),
            "--runtime-binary",
            "/opt/gf/gpufence-runtime",
        ]);
        assert_eq!(code, 0);
        assert!(out.contains("already up to date"), "{out}");
        assert_eq!(snapshot(&s), after);

        // unconfigure: every file as it was before configure, byte for byte; twice is a no-op.
        for _ in 0..2 {
            let (code, out, err) = engine_cmd(
                "unconfigure",
                &[
                    "--runtime",
                    "containerd",
                    "--config",
                    main.to_str().unwrap(),
                ],
            );
            assert_eq!(code, 0, "{out}{err}");
            assert_eq!(snapshot(&s), before, "{out}");
        }
    }
}

#[test]
fn containerd_refuses_v1() {
    let s = common::scratch("cfg-ctrd1");
    let main = s.join("config.toml");
    std::fs::write(&main, "[plugins.cri]\n").unwrap();
    let (code, _, err) = configure(&[
        "--runtime",
        "containerd",
        "--config",
        main.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("version 1") && err.contains("config.toml"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&main).unwrap(), "[plugins.cri]\n");
    assert!(!s.join("conf.d").exists());
}

#[test]
fn crio_drop_in_leaves_the_rest() {
    let s = common::scratch("cfg-crio");
    let main = s.join("crio.conf");
    std::fs::write(
        &main,
        "# operator\n[crio.runtime]\ndefault_runtime = \"runc\"\n",
    )
    .unwrap();
    std::fs::create_dir_all(s.join("crio.conf.d")).unwrap();
    std::fs::write(
        s.join("crio.conf.d/01-operator.conf"),
        "[crio.runtime]\nlog_level = \"info\"\n",
    )
    .unwrap();
    let before = snapshot(&s);
    let (code, out, err) = configure(&[
        "--runtime",
        "crio",
        "--config",
        main.to_str().unwrap(),
        "--dry-run",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("[crio.runtime.runtimes.gpufence]"), "{out}");
    assert_eq!(snapshot(&s), before);
    let (code, _, err) = configure(&[
        "--runtime",
        "crio",
        "--config",
        main.to_str().unwrap(),
        "--runtime-binary",
        "/opt/gf/gpufence-runtime",
    ]);
    assert_eq!(code, 0, "{err}");
    let after = snapshot(&s);
    let new: Vec<_> = after.iter().filter(|f| !before.contains(f)).collect();
    assert_eq!(new.len(), 1, "only the drop-in is new: {new:?}");
    assert_eq!(new[0].0, "crio.conf.d/99-gpufence.conf");
    let t: toml::Table = toml::from_str(std::str::from_utf8(&new[0].1).unwrap()).unwrap();
    let rt = &t["crio"]["runtime"]["runtimes"]["gpufence"];
    assert_eq!(
        rt["runtime_path"].as_str(),
        Some("/opt/gf/gpufence-runtime")
    );
    assert_ne!(
        rt["runtime_root"].as_str(),
        Some("/run/gpufence"),
        "never gpufence's state-dir"
    );
}

#[test]
fn docker_daemon_json_keeps_other_keys() {
    let s = common::scratch("cfg-docker");
    let p = s.join("daemon.json");
    let original = r#"{
  "log-driver": "json-file",
  "log-opts": {"max-size": "10m"},
  "runtimes": {
    "nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}
  },
  "default-runtime": "runc"
}
"#;
    std::fs::write(&p, original).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, out, _) = configure(&[
        "--runtime",
        "docker",
        "--config",
        p.to_str().unwrap(),
        "--dry-run",
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("\"gpufence\""));
    assert_eq!(std::fs::read_to_string(&p).unwrap(), original);
    let (code, _, err) = configure(&[
        "--runtime",
        "docker",
        "--config",
        p.to_str().unwrap(),
        "--runtime-binary",
        "/opt/gf/gpufence-runtime",
    ]);
    assert_eq!(code, 0, "{err}");
    let mut before: serde_json::Value = serde_json::from_str(original).unwrap();
    let after: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    before["runtimes"]["gpufence"] = serde_json::json!({"path": "/opt/gf/gpufence-runtime"});
    assert_eq!(after, before, "only runtimes.gpufence added");
    let keys: Vec<&String> = after.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["log-driver", "log-opts", "runtimes", "default-runtime"],
        "order kept"
    );
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600,
        "mode kept"
    );

    // unconfigure restores the operator's bytes (and mode).
    let (code, out, err) = engine_cmd(
        "unconfigure",
        &["--runtime", "docker", "--config", p.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::read_to_string(&p).unwrap(), original);
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // Broken daemon.json: refused, untouched.
    std::fs::write(&p, "{ not json").unwrap();
    let (code, _, err) = configure(&["--runtime", "docker", "--config", p.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("daemon.json"), "{err}");
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "{ not json");
}

/// A fake real runtime printing `version_line` for `--version` (and checking it gets an empty
/// environment), named in a gpufence config.
fn fake_runtime(dir: &Path, name: &str, version_line: &str) -> std::path::PathBuf {
    let rt = dir.join(name);
    std::fs::write(
        &rt,
        format!(
            "#!/bin/sh\n[ -z \"$HOME$GPUFENCE_CONFIG\" ] || {{ echo \"env not empty\" >&2; exit 9; }}\n[ \"$1\" = --version ] && printf '%s\\n' '{version_line}' 'commit: x'\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&rt, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(&cfg, format!("[runtime]\npath = \"{}\"\n", rt.display())).unwrap();
    cfg
}

/// configure with `gpufence_cfg` as gpufence-runtime's configuration (GPUFENCE_CONFIG, as
/// gpufence-runtime reads it).
fn configure_with(gpufence_cfg: &Path, args: &[&str]) -> (i32, String, String) {
    common::run(
        Command::new(common::bin("gpufence"))
            .env("GPUFENCE_CONFIG", gpufence_cfg)
            .args(["runtime", "configure"])
            .args(args)
            .arg("--record-dir")
            .arg(records()),
    )
}

/// Issue 15 (8): runc 1.1.5 (this distribution's) creates files on the host under a rootfs race
/// (CVE-2024-45310) and leaks a host fd (CVE-2024-21626): configure refuses to put gpufence in
/// front of it, and names the CVEs and fixed releases in one line; with
/// `--allow-vulnerable-runtime` it warns and writes.
#[test]
fn vulnerable_runtime_is_refused_unless_allowed() {
    let s = common::scratch("cfg-vuln");
    let main = s.join("crio.conf");
    let drop_in = s.join("crio.conf.d/99-gpufence.conf");
    let old = fake_runtime(&s, "runc", "runc version 1.1.5+ds1");
    let (code, out, err) = configure_with(
        &old,
        &["--runtime", "crio", "--config", main.to_str().unwrap()],
    );
    assert_eq!(code, 2, "{out}{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("runc 1.1.5 has known container escapes"),
        "{err}"
    );
    assert!(
        lines[0].contains("CVE-2024-21626 (fixed in 1.1.12"),
        "{err}"
    );
    assert!(
        lines[0].contains("CVE-2024-45310 (fixed in 1.1.14"),
        "{err}"
    );
    assert!(lines[0].contains("--allow-vulnerable-runtime"), "{err}");
    assert!(!drop_in.exists(), "nothing written");

    let (code, out, err) = configure_with(
        &old,
        &[
            "--runtime",
            "crio",
            "--config",
            main.to_str().unwrap(),
            "--allow-vulnerable-runtime",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.starts_with("warning: ") && err.contains("CVE-2024-45310"),
        "{err}"
    );
    assert!(drop_in.exists());

    // A fixed release: no warning.
    std::fs::remove_file(&drop_in).unwrap();
    let new = fake_runtime(&s, "runc-new", "runc version 1.3.3");
    let (code, out, err) = configure_with(
        &new,
        &["--runtime", "crio", "--config", main.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.is_empty(), "{err}");
    assert!(drop_in.exists());

    // Unknown runtime: a warning, nothing refused.
    let other = fake_runtime(&s, "youki", "youki version 0.3.3");
    let (code, out, err) = configure_with(
        &other,
        &[
            "--runtime",
            "crio",
            "--config",
            main.to_str().unwrap(),
            "--dry-run",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.starts_with("warning: ") && err.contains("no known advisory"),
        "{err}"
    );

    // An old crun.
    let crun = fake_runtime(&s, "crun", "crun version 1.4.3");
    let (code, _, err) = configure_with(
        &crun,
        &["--runtime", "crio", "--config", main.to_str().unwrap()],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("CVE-2022-27650"), "{err}");
}

/// The check runs this machine's real runc: at runc 1.1.5 (Debian 12) configure refuses.
#[test]
fn this_machines_runc_is_judged() {
    // The distribution's runc (Debian 12: 1.1.5, refused), whatever is first on PATH.
    if !Path::new("/usr/sbin/runc").is_file() {
        return;
    }
    let (_, version, _) = common::run(Command::new("/usr/sbin/runc").arg("--version"));
    let vulnerable = matches!(
        gpufence::engines::vulnerable::judge(&version),
        gpufence::engines::vulnerable::Verdict::Vulnerable(_)
    );
    let s = common::scratch("cfg-host-runc");
    let cfg = s.join("gpufence.toml");
    std::fs::write(&cfg, "[runtime]\npath = \"/usr/sbin/runc\"\n").unwrap();
    let main = s.join("crio.conf");
    let (code, out, err) = configure_with(
        &cfg,
        &[
            "--runtime",
            "crio",
            "--config",
            main.to_str().unwrap(),
            "--dry-run",
        ],
    );
    assert_eq!(code == 2, vulnerable, "{version}: {out}{err}");
}

/// containerd 2.3 writes config version 4 (`containerd config default`): configure adds the
/// handler through a version-4 drop-in, and a real containerd 2.3.4 (the engines') loads it —
/// `containerd config dump` merges the import and shows the `gpufence` runtime with the
/// allow-list and gpufence-runtime as its binary.
#[test]
fn containerd_2_3_loads_the_version_4_drop_in() {
    let Some(engines) = common::engines_dir() else {
        eprintln!("SKIP: no ENGINES_DIR with containerd 2.3");
        return;
    };
    let containerd = engines.join("containerd");
    let s = common::scratch("cfg-containerd-2-3");
    let (code, default, err) = common::run(Command::new(&containerd).args(["config", "default"]));
    assert_eq!(code, 0, "{err}");
    assert!(default.starts_with("version = 4"), "{default}");
    let main = s.join("config.toml");
    // The operator's defaults, on private paths (dump never starts anything).
    let original = default
        .replace(
            "'/var/lib/containerd'",
            &format!("'{}'", s.join("root").display()),
        )
        .replace(
            "'/run/containerd'",
            &format!("'{}'", s.join("state").display()),
        );
    std::fs::write(&main, &original).unwrap();
    let (code, out, err) = configure(&[
        "--runtime",
        "containerd",
        "--config",
        main.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let drop_in = std::fs::read_to_string(s.join("conf.d/gpufence.toml")).unwrap();
    assert!(drop_in.contains("version = 4"), "{drop_in}");

    let (code, dump, err) = common::run(
        Command::new(&containerd)
            .arg("--config")
            .arg(&main)
            .args(["config", "dump"]),
    );
    assert_eq!(code, 0, "containerd 2.3 refused the configuration: {err}");
    let merged: toml::Table = toml::from_str(&dump).unwrap_or_else(|e| panic!("{e}: {dump}"));
    let rt =
        &merged["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["gpufence"];
    assert_eq!(
        rt["runtime_type"].as_str(),
        Some("io.containerd.runc.v2"),
        "{dump}"
    );
    assert_eq!(
        rt["options"]["BinaryName"].as_str(),
        Some(common::bin("gpufence-runtime").to_str().unwrap()),
        "{dump}"
    );
    let allowed = rt["pod_annotations"].as_array().unwrap();
    assert!(
        allowed.iter().any(|a| a.as_str() == Some("gpufence.dev/*")),
        "{dump}"
    );
    // The operator's runc handler is still there, and of the main file only its `imports`
    // line changed (2.3's default already imports /etc/containerd/conf.d/*.toml).
    assert!(
        merged["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
            .get("runc")
            .is_some(),
        "{dump}"
    );
    let now = std::fs::read_to_string(&main).unwrap();
    let changed: Vec<(&str, &str)> = original
        .lines()
        .zip(now.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(now.lines().count(), original.lines().count(), "{now}");
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert!(changed[0].1.starts_with("imports = ["), "{changed:?}");
}
