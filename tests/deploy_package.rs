//! The packages `make package` builds, installed for real: the .deb (cargo-deb) into a clean
//! Debian root made from this machine's files (busybox for the maintainer scripts, the C
//! libraries, a dpkg database holding the packages it depends on), with `dpkg --root`:
//! the files and modes, `gpufence --version` run chrooted there, an operator's edit of the
//! conffile surviving an upgrade and a remove, and gone with purge. The .rpm
//! (cargo-generate-rpm) lists the same files (`rpm -qlp`). Built from this build's binaries.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn ok(cmd: &mut Command) -> String {
    let (code, out, err) = common::run(cmd);
    assert_eq!(code, 0, "{cmd:?}: {out}{err}");
    out
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// The profile these tests were built with (`dev` for target/debug).
fn profile() -> &'static str {
    if common::target_dir().ends_with("release") {
        "release"
    } else {
        "dev"
    }
}

/// A .deb of this build with Debian revision `rev`, in `dir`.
fn build_deb(dir: &Path, rev: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let out = ok(cargo()
        .args(["deb", "--no-build", "--fast", "--profile", profile()])
        .args([
            "--deb-version",
            &format!("{}-{rev}", env!("CARGO_PKG_VERSION")),
        ])
        .arg("-o")
        .arg(dir));
    PathBuf::from(out.lines().last().unwrap().trim())
}

/// A Debian root with only what dpkg and the package need.
fn debian_root(s: &Path) -> PathBuf {
    let r = common::busybox_rootfs(s);
    for d in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/log",
        "usr/bin",
        "usr/sbin",
    ] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::write(r.join("var/lib/dpkg/available"), "").unwrap();
    for applet in ["chmod", "mkdir", "touch"] {
        let _ = std::os::unix::fs::symlink("busybox", r.join("bin").join(applet));
    }
    // The packages the .deb depends on, as installed here (their libraries copied in).
    let mut status = String::new();
    for pkg in ["libc6", "libgcc-s1", "runc"] {
        status.push_str(&ok(Command::new("dpkg").args(["-s", pkg])));
        status.push('\n');
    }
    std::fs::write(r.join("var/lib/dpkg/status"), status).unwrap();
    let ldd = ok(Command::new("ldd").arg(common::bin("gpufence")));
    for l in ldd.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let lib = match w.as_slice() {
            [_, "=>", p, ..] if p.starts_with('/') => *p,
            [p, ..] if p.starts_with('/') => *p,
            _ => continue,
        };
        let dest = r.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(std::fs::canonicalize(lib).unwrap(), dest).unwrap();
    }
    r
}

fn dpkg(root: &Path, args: &[&str]) -> String {
    ok(Command::new("dpkg")
        .arg(format!("--root={}", root.display()))
        .arg("--force-confold")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// The package's files (not directories), from `dpkg -L`.
fn deb_files(root: &Path) -> BTreeSet<String> {
    dpkg(root, &["-L", "gpufence"])
        .lines()
        .filter(|p| root.join(p.trim_start_matches('/')).is_file())
        .map(str::to_string)
        .collect()
}

const EXPECTED: &[&str] = &[
    "/usr/bin/gpufence",
    "/usr/bin/gpufence-runtime",
    "/usr/bin/gpufence-runtime-wrapper",
    "/usr/lib/gpufence/libgpufence.so",
    "/etc/gpufence/config.toml",
    "/usr/share/gpufence/hooks/gpufence.json",
    "/usr/share/gpufence/k8s/daemonset.yaml",
    "/usr/share/gpufence/k8s/runtimeclass.yaml",
    "/usr/share/gpufence/k8s/admission-policy.yaml",
    "/usr/share/gpufence/cdi/sim-2gpu.json",
    "/usr/share/gpufence/cdi/sim-2gpu-mig1.yaml",
];

#[test]
fn deb_installs_upgrades_and_purges_in_a_clean_root_and_rpm_lists_the_same_files() {
    let tools = ["dpkg", "rpm", "cargo-deb", "cargo-generate-rpm", "ldd"];
    common::install_with_make("package-deps", "packaging test", &tools);
    if common::skip_unless(&tools) {
        return;
    }
    let s = common::scratch("deploy-package");
    let v1 = build_deb(&s.join("v1"), "1");
    let root = debian_root(&s.join("root"));

    dpkg(&root, &["-i", v1.to_str().unwrap()]);
    let files = deb_files(&root);
    for f in EXPECTED {
        assert!(files.contains(*f), "{f} not installed: {files:?}");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(root.join(p.trim_start_matches('/')))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("/usr/bin/gpufence-runtime"), 0o755);
    assert_eq!(mode("/usr/bin/gpufence-runtime-wrapper"), 0o755);
    assert_eq!(mode("/usr/lib/gpufence/libgpufence.so"), 0o644);
    assert!(root.join("var/log/gpufence.log").is_file(), "postinst ran");
    let conffiles = dpkg(&root, &["--status", "gpufence"]);
    assert!(
        conffiles.contains(" /etc/gpufence/config.toml "),
        "{conffiles}"
    );
    let version = ok(Command::new("chroot")
        .arg(&root)
        .args(["/usr/bin/gpufence", "--version"]));
    assert_eq!(
        version.trim(),
        format!("gpufence {}", env!("CARGO_PKG_VERSION"))
    );

    // The operator edits the conffile; an upgrade keeps the edit, so does remove; purge not.
    let conf = root.join("etc/gpufence/config.toml");
    let edited = format!(
        "{}# operator: edited\n",
        std::fs::read_to_string(&conf).unwrap()
    );
    std::fs::write(&conf, &edited).unwrap();
    let v2 = build_deb(&s.join("v2"), "2");
    dpkg(&root, &["-i", v2.to_str().unwrap()]);
    let st = dpkg(&root, &["--status", "gpufence"]);
    assert!(
        st.contains(&format!("Version: {}-2", env!("CARGO_PKG_VERSION"))),
        "{st}"
    );
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), edited);
    dpkg(&root, &["--remove", "gpufence"]);
    assert!(!root.join("usr/bin/gpufence").exists());
    assert_eq!(
        std::fs::read_to_string(&conf).unwrap(),
        edited,
        "remove keeps conffiles"
    );
    dpkg(&root, &["--purge", "gpufence"]);
    assert!(!conf.exists(), "purge removes the conffile");
    assert!(!root.join("etc/gpufence").exists());

    // The .rpm: the same files.
    let rpm_dir = s.join("rpm");
    std::fs::create_dir_all(&rpm_dir).unwrap();
    let out = ok(cargo()
        .args([
            "generate-rpm",
            "--profile",
            profile(),
            "--payload-compress",
            "none",
        ])
        .arg("-o")
        .arg(&rpm_dir));
    let _ = out;
    let rpm = std::fs::read_dir(&rpm_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "rpm"))
        .expect("an .rpm");
    let listed: BTreeSet<String> = ok(Command::new("rpm").arg("-qlp").arg(&rpm))
        .lines()
        .map(str::to_string)
        .collect();
    // (less the copyright file Debian policy puts in every .deb)
    let deb: BTreeSet<String> = files
        .into_iter()
        .filter(|f| f != "/usr/share/doc/gpufence/copyright")
        .collect();
    assert_eq!(listed, deb, "rpm and deb ship the same files");
    let config = ok(Command::new("rpm").arg("-qcp").arg(&rpm));
    assert_eq!(config.trim(), "/etc/gpufence/config.toml");
}
