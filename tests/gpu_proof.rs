//! `scripts/gpu-proof.sh`, the proof prepared for a machine with a real GPU (docs/frameworks.md,
//! "On a real GPU: the prepared proof"), rehearsed over the simulated node (`SIM=1`) so that the
//! script's own logic is known to work before the one run it gets there.
//!
//! - the driver, inventory, CDI, NVML and device-memory path checks, with a bundle made from this
//!   build's binaries (`FROM`): seconds, part of `make test`;
//! - a bundle that is missing is one `FAIL bundle` line and exit 1, never a silent pass;
//! - the whole rehearsal, the frameworks programs under the shim, in a gpufence-runtime container
//!   and without gpufence: ignored (the frameworks venvs, about 10 GiB, come from
//!   `scripts/frameworks.sh`); `make test-frameworks` runs it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-proof.sh")
}

/// The bundle `prepare` makes in `scratch` from this build's binaries and the engines' runc;
/// None (after a skip note) without root, gcc or the static runc of `ENGINES_DIR`.
fn bundle(scratch: &Path) -> Option<PathBuf> {
    if common::skip_unless(&["gcc", "readelf", "objdump"]) {
        return None;
    }
    let Some(engines) = common::engines_dir() else {
        assert!(
            std::env::var("CI").is_err(),
            "no ENGINES_DIR with runc 1.5.1: the bundle needs its static runc"
        );
        eprintln!("SKIP: no ENGINES_DIR with runc 1.5.1 (static)");
        return None;
    };
    let b = scratch.join("gpu-proof");
    let (code, out, err) = common::run(
        Command::new("bash")
            .arg(script())
            .arg("prepare")
            .env("BUNDLE", &b)
            .env("FROM", common::target_dir())
            .env("ENGINES_DIR", engines),
    );
    assert_eq!(code, 0, "gpu-proof.sh prepare: {out}\n{err}");
    // its last line: `du -sh`'s size of the bundle
    assert!(
        out.trim_end().ends_with(&*b.to_string_lossy()),
        "no size: {out}"
    );
    Some(b)
}

/// `SIM=1 gpu-proof.sh run` with the bundle at `bundle` and `env`; (exit code, summary.txt, the
/// files it wrote in OUT).
fn rehearse(scratch: &Path, bundle: &Path, env: &[(&str, &str)]) -> (i32, String, Vec<String>) {
    let out = scratch.join("out");
    let mut cmd = Command::new("bash");
    cmd.arg(script())
        .arg("run")
        .env("SIM", "1")
        .env("BUNDLE", bundle)
        .env("OUT", &out)
        .env("SIM_BIN", common::target_dir())
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let (code, stdout, err) = common::run(&mut cmd);
    let summary = std::fs::read_to_string(out.join("summary.txt"))
        .unwrap_or_else(|e| panic!("no summary.txt ({e}): {stdout}\n{err}"));
    let mut files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    (code, summary, files)
}

/// The names of the summary's lines with `status`.
fn with_status<'a>(summary: &'a str, status: &str) -> Vec<&'a str> {
    summary
        .lines()
        .filter_map(|l| l.strip_prefix(status)?.strip_prefix(' '))
        .filter_map(|l| l.split_once(':').map(|(name, _)| name))
        .collect()
}

#[test]
fn the_driver_nvml_and_memory_path_checks_pass_over_the_simulated_node() {
    let s = common::scratch("gpu-proof");
    let Some(b) = bundle(&s) else {
        return;
    };
    for f in [
        "bin/gpufence",
        "bin/gpufence-runtime",
        "bin/gpufence-runtime-wrapper",
        "bin/runc",
        "bin/cuda_client",
        "lib/libgpufence.so",
        "MANIFEST",
    ] {
        assert!(b.join(f).is_file(), "the bundle has no {f}");
    }
    let (code, summary, files) = rehearse(&s, &b, &[("STEPS", "driver inventory cdi nvml paths")]);
    assert_eq!(code, 0, "{summary}");
    assert_eq!(
        with_status(&summary, "PASS"),
        [
            "driver",
            "inventory",
            "cdi",
            "nvml-smi-whole",
            "nvml-smi-slice",
            "nvml-whole-py",
            "nvml-whole-c",
            "nvml-slice-py",
            "nvml-slice-c",
            "paths-proc",
        ],
        "{summary}"
    );
    assert!(summary.contains("TOTAL 10 passed, 0 failed"), "{summary}");
    // what the device tool brings back: at most 8 files
    assert_eq!(
        files,
        [
            "container.txt",
            "control.txt",
            "cuda-paths.txt",
            "env.txt",
            "inventory.txt",
            "nvml.txt",
            "shim.txt",
            "summary.txt"
        ]
    );
}

#[test]
fn a_missing_bundle_fails_the_run_in_one_line() {
    let s = common::scratch("gpu-proof-nobundle");
    let (code, summary, _) = rehearse(&s, &s.join("absent"), &[]);
    assert_eq!(code, 1, "{summary}");
    assert_eq!(with_status(&summary, "FAIL"), ["bundle"], "{summary}");
    assert!(with_status(&summary, "PASS").is_empty(), "{summary}");
}

/// The venv `scripts/frameworks.sh` installs (`set` empty: PyTorch + CuPy; "jax").
fn frameworks_python(set: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/frameworks.sh");
    let (code, out, err) = common::run(Command::new("bash").arg(script).args(set));
    assert_eq!(code, 0, "scripts/frameworks.sh failed: {err}");
    format!("{}/bin/python", out.trim())
}

#[test]
#[ignore = "the frameworks venvs (about 10 GiB) from scripts/frameworks.sh: make test-frameworks"]
fn the_whole_rehearsal_passes_over_the_simulated_node() {
    if common::skip_unless(&["runc", "unshare"]) {
        return;
    }
    let s = common::scratch("gpu-proof-all");
    let Some(b) = bundle(&s) else {
        return;
    };
    let (torch, jax) = (frameworks_python(&[]), frameworks_python(&["jax"]));
    let (code, summary, _) = rehearse(&s, &b, &[("PYTHON", &torch), ("PYTHON_JAX", &jax)]);
    println!("{summary}");
    assert_eq!(code, 0, "{summary}");
    let passed = with_status(&summary, "PASS");
    // 10 driver, NVML and path checks, 14 programs under the shim, 14 in the container, 11 controls
    assert_eq!(passed.len(), 49, "{summary}");
    for prefix in ["shim/", "container/", "control/"] {
        assert!(
            passed.iter().any(|n| n.starts_with(prefix)),
            "{prefix}: {summary}"
        );
    }
}
