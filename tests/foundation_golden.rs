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
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(golden);
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
    let normalise = |s: String| s.replace(&sim, "/SIM").replace(&bin, "/BIN");

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
