//! gpufence-runtime's own start-up (the entry and the wrapper beside it that it execs, both
//! `#![no_main]`, no std runtime init): what std's start-up did that matters still holds on
//! both paths. Standard descriptors closed by the caller are opened on /dev/null
//! before anything else (so no file the wrapper opens becomes stdout/stderr, and the real runtime
//! inherits the placeholders), SIGPIPE is back at its default for the real runtime, argv passes
//! through unchanged. No root needed: a pass-through subcommand execs the configured "runtime",
//! here a script that records what it inherited.

mod common;

use std::os::unix::process::CommandExt;
use std::process::Command;

fn recording_runtime(s: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let record = s.join("inherited.txt");
    let script = s.join("fake-runc");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nf0=$(readlink /proc/$$/fd/0); f1=$(readlink /proc/$$/fd/1); \
             f2=$(readlink /proc/$$/fd/2)\n{{ echo \"fd0 $f0\"; echo \"fd1 $f1\"; echo \"fd2 $f2\"\n\
             grep '^SigIgn:' /proc/$$/status\necho \"args $*\"; }} >{}\n",
            record.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = s.join("gpufence.toml");
    std::fs::write(
        &config,
        format!(
            "state-dir = \"{}\"\n[runtime]\npath = \"{}\"\n",
            s.join("state").display(),
            script.display()
        ),
    )
    .unwrap();
    (config, record)
}

#[test]
fn closed_std_fds_become_dev_null_and_sigpipe_is_default_for_runc() {
    let s = common::scratch("rt-start");
    let (config, record) = recording_runtime(&s);
    // Twice: the first call parses the configuration (and records which runtime it names), the
    // second takes the pass-through path on that record (`passthrough.rs`); both hand the
    // runtime the same descriptors and signal dispositions.
    for call in ["slow path", "pass-through record"] {
        let _ = std::fs::remove_file(&record);
        // A configuration changed within the last 100 ms is not recorded yet.
        std::thread::sleep(std::time::Duration::from_millis(150));
        let mut cmd = Command::new(common::bin("gpufence-runtime"));
        cmd.env("GPUFENCE_CONFIG", &config).args([
            "--root",
            "/nonexistent-root",
            "state",
            "some-id",
        ]);
        // SAFETY: only async-signal-safe close(2) and signal(2) calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                for fd in 0..=2 {
                    libc::close(fd);
                }
                // Ignored by the caller: the wrapper still hands the default to runc.
                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
                Ok(())
            });
        }
        let status = cmd.status().unwrap();
        assert!(status.success(), "{call}: {status:?}");
        check_inherited(&std::fs::read_to_string(&record).unwrap(), call);
    }
}

fn check_inherited(got: &str, call: &str) {
    for fd in 0..=2 {
        assert!(got.contains(&format!("fd{fd} /dev/null")), "{call}: {got}");
    }
    let ign = got
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(
        ign & (1 << (libc::SIGPIPE - 1)),
        0,
        "{call}: SIGPIPE ignored in runc: {got}"
    );
    assert!(
        got.contains("args --root /nonexistent-root state some-id"),
        "{call}: {got}"
    );
}

#[test]
fn open_std_fds_are_left_alone() {
    let s = common::scratch("rt-start-open");
    let (config, record) = recording_runtime(&s);
    let out = s.join("out.txt");
    let status = Command::new(common::bin("gpufence-runtime"))
        .env("GPUFENCE_CONFIG", &config)
        .args(["list"])
        .stdout(std::fs::File::create(&out).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    let got = std::fs::read_to_string(&record).unwrap();
    assert!(got.contains(&format!("fd1 {}", out.display())), "{got}");
}

/// The pass-through record is the configuration's, never older: a changed `runtime.path` is
/// followed by the very next call, and a runtime path that became gpufence-runtime itself is
/// refused rather than exec'd in a loop.
#[test]
fn pass_through_follows_a_changed_configuration() {
    let s = common::scratch("rt-start-changed");
    let (config, record) = recording_runtime(&s);
    let call = || {
        Command::new(common::bin("gpufence-runtime"))
            .env("GPUFENCE_CONFIG", &config)
            .args(["state", "x"])
            .output()
            .unwrap()
    };
    for _ in 0..2 {
        std::thread::sleep(std::time::Duration::from_millis(150));
        assert!(call().status.success());
        assert!(
            std::fs::read_to_string(&record)
                .unwrap()
                .contains("args state x")
        );
        std::fs::remove_file(&record).unwrap();
    }
    let second = s.join("second-runc");
    let marker = s.join("second.txt");
    std::fs::write(
        &second,
        format!("#!/bin/sh\necho \"$*\" >{}\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&second, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    let first = text.lines().find(|l| l.starts_with("path = ")).unwrap();
    std::fs::write(
        &config,
        text.replace(first, &format!("path = \"{}\"", second.display())),
    )
    .unwrap();
    assert!(call().status.success());
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "state x\n");
    assert!(!record.exists(), "the first runtime ran again");

    // runtime.path naming gpufence-runtime itself, or the wrapper it execs: refused, on every
    // call.
    for own in ["gpufence-runtime", "gpufence-runtime-wrapper"] {
        let me = common::bin(own);
        std::fs::write(
            &config,
            text.replace(first, &format!("path = \"{}\"", me.display())),
        )
        .unwrap();
        for _ in 0..2 {
            let out = call();
            assert!(!out.status.success(), "{own}");
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("is gpufence-runtime itself"),
                "{own}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The entry runs its wrapper from its own directory only: copied alone, without the wrapper
/// beside it, it fails a call it cannot pass through, with one line naming the missing binary —
/// even with a wrapper on PATH.
#[test]
fn the_entry_runs_only_the_wrapper_beside_it() {
    let s = common::scratch("rt-start-alone");
    let (config, _record) = recording_runtime(&s);
    let alone = s.join("alone");
    std::fs::create_dir_all(&alone).unwrap();
    std::fs::copy(
        common::bin("gpufence-runtime"),
        alone.join("gpufence-runtime"),
    )
    .unwrap();
    let on_path = common::bin("gpufence-runtime-wrapper");
    let run = || {
        Command::new(alone.join("gpufence-runtime"))
            .env("GPUFENCE_CONFIG", &config)
            .env("PATH", on_path.parent().unwrap())
            .args(["create", "--bundle", "/nonexistent-bundle", "x"])
            .output()
    };
    // The copy's write descriptor may still be open in a child another test thread is forking
    // (ETXTBSY until that child execs): retry for up to a second.
    let mut tries = 0;
    let out = loop {
        match run() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => break r.unwrap(),
        }
    };
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "cannot run its wrapper {}",
            alone.join("gpufence-runtime-wrapper").display()
        )),
        "{err}"
    );
}
