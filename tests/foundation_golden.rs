//! Golden file pinning the CDI spec of a simulated 2-GPU node with MIG on GPU 1. Paths that vary
//! per run are replaced: the simulated node's directory by `/SIM`, the build directory (the
//! `gpufence` binary named in the hook) by `/BIN`.
//! Regenerate after an intended change: `GPUFENCE_UPDATE_GOLDEN=1 cargo test --test foundation_golden`.
//! Needs root (mknod); skips otherwise (fails under CI).

mod common;

use std::path::Path;
use std::process::Command;

fn generate(cfg: &Path, format: &str) -> String {
    let (rc, out, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(cfg)
            .args(["cdi", "generate", "--format", format]),
    );
    assert_eq!(rc, 0, "{err}");
    out
}

fn check(golden: &str, actual: &str) {
    check_file(&Path::new("tests/golden").join(golden), actual)
}

/// Compare `actual` with the file at `rel` (from the repository root), or rewrite the file under
/// `GPUFENCE_UPDATE_GOLDEN=1`.
fn check_file(rel: &Path, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    if std::env::var_os("GPUFENCE_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the generated spec at line {}:\n  golden: {:?}\n  actual: {:?}\n(set GPUFENCE_UPDATE_GOLDEN=1 to accept)",
            path.display(),
            line + 1,
            expected.lines().nth(line),
            actual.lines().nth(line)
        );
    }
}

/// The driver folders' directory is named by the driver files' identities (inodes, mtimes):
/// `driver-folders/<version>-<16 hex digits>` reads `driver-folders/<version>-HASH`.
fn unhash(s: &str) -> String {
    const AT: &str = "driver-folders/";
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(AT) {
        let (head, tail) = rest.split_at(i + AT.len());
        out.push_str(head);
        let name_end = tail.find(['/', '"', '\n']).unwrap_or(tail.len());
        let name = &tail[..name_end];
        match name.rsplit_once('-') {
            Some((version, hash))
                if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                out.push_str(version);
                out.push_str("-HASH");
            }
            _ => out.push_str(name),
        }
        rest = &tail[name_end..];
    }
    out.push_str(rest);
    out
}

#[test]
fn cdi_spec_is_pinned() {
    if common::skip_unless(&[]) {
        return;
    }
    let dir = common::scratch("golden");
    let cfg = common::sim_node(&dir, 2, Some(1));
    let sim = dir.canonicalize().unwrap().display().to_string();
    let bin = common::target_dir()
        .canonicalize()
        .unwrap()
        .display()
        .to_string();
    let normalise = |s: String| unhash(&s.replace(&sim, "/SIM").replace(&bin, "/BIN"));

    let yaml = normalise(generate(&cfg, "yaml"));
    check("cdi-2gpu-mig1.yaml", &yaml);
    let json = normalise(generate(&cfg, "json"));
    check("cdi-2gpu-mig1.json", &json);

    // Both forms describe the same spec, which parses strictly (unknown fields rejected).
    let a: gpufence::cdi::Spec = yaml_serde::from_str(&yaml).unwrap();
    let b: gpufence::cdi::Spec = serde_json::from_str(&json).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.cdi_version, "0.5.0");
    assert_eq!(a.devices.len(), 2 * 2 + 7 * 2 + 1);
}

/// The operator-facing examples in `cdi/`: the simulated node's specs as they read on a node
/// whose driver is installed at `/` (the simulated node's `dev/` → `/dev`, its driver root → `/`,
/// the build directory → `/usr/bin`, its config → `/etc/gpufence/config.toml`). The test fails
/// when the generator's output drifts from them.
#[test]
fn cdi_examples_are_what_the_generator_writes() {
    if common::skip_unless(&[]) {
        return;
    }
    for (name, mig) in [("sim-2gpu", None), ("sim-2gpu-mig1", Some(1))] {
        let dir = common::scratch(&format!("cdi-example-{name}"));
        let cfg = common::sim_node(&dir, 2, mig);
        let sim = dir.canonicalize().unwrap().display().to_string();
        let bin = common::target_dir()
            .canonicalize()
            .unwrap()
            .display()
            .to_string();
        let as_on_a_node = |s: String| {
            unhash(&s)
                .replace(
                    &format!("{sim}/driver-folders/"),
                    "/var/lib/gpufence/driver-folders/",
                )
                .replace(&format!("{sim}/driver/"), "/")
                .replace(&format!("{sim}/config.toml"), "/etc/gpufence/config.toml")
                .replace(&format!("{sim}/dev/"), "/dev/")
                .replace(&format!("{bin}/gpufence"), "/usr/bin/gpufence")
        };
        let mut specs = Vec::new();
        for format in ["json", "yaml"] {
            let spec = as_on_a_node(generate(&cfg, format));
            assert!(
                !spec.contains(&sim) && !spec.contains(&bin),
                "unmapped path in {spec}"
            );
            check_file(&Path::new("cdi").join(format!("{name}.{format}")), &spec);
            specs.push(spec);
        }
        let a: gpufence::cdi::Spec = serde_json::from_str(&specs[0]).unwrap();
        let b: gpufence::cdi::Spec = yaml_serde::from_str(&specs[1]).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.kind, "gpufence.dev/gpu");
        let mig_devices = if mig.is_some() { 7 * 2 } else { 0 };
        assert_eq!(a.devices.len(), 2 * 2 + mig_devices + 1, "{name}");
    }
}
