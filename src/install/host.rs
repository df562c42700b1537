//! The privileged calls `install` makes besides writing files: running a command in the host
//! (restart the engine, warm the inventory cache) and signalling the engine. Behind a trait so
//! the plan's effects can be recorded in tests.

use std::path::Path;

/// What the installer asks of the host.
pub trait Host {
    /// Run `argv` (already prefixed with `chroot HOST_ROOT` where needed); `Err` carries one
    /// line: the exit status and the last line of stderr.
    fn run(&mut self, argv: &[String]) -> Result<(), String>;
    /// Send SIGHUP to `pid`.
    fn hangup(&mut self, pid: i32) -> Result<(), String>;
}

/// The real host.
pub struct RealHost;

impl Host for RealHost {
    fn run(&mut self, argv: &[String]) -> Result<(), String> {
        let (prog, args) = argv.split_first().ok_or("empty command")?;
        let out = std::process::Command::new(prog)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("{prog}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        Err(format!(
            "`{}` failed ({}): {last}",
            argv.join(" "),
            out.status
        ))
    }

    fn hangup(&mut self, pid: i32) -> Result<(), String> {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGHUP,
        )
        .map_err(|e| format!("SIGHUP to pid {pid}: {e}"))
    }
}

/// `argv` as run inside the host's root directory `root` (no chroot when it is `/`).
pub fn in_host(root: &Path, argv: &[&str]) -> Vec<String> {
    let mut v = Vec::new();
    if root != Path::new("/") {
        v.push("chroot".to_string());
        v.push(root.display().to_string());
    }
    v.extend(argv.iter().map(|s| s.to_string()));
    v
}

/// A host that records what it was asked (and fails the commands whose first word after any
/// `chroot ROOT` is in `failing`).
#[derive(Debug, Default)]
pub struct RecordingHost {
    pub calls: Vec<String>,
    pub failing: Vec<String>,
}

impl Host for RecordingHost {
    fn run(&mut self, argv: &[String]) -> Result<(), String> {
        self.calls.push(argv.join(" "));
        let word = if argv.first().map(String::as_str) == Some("chroot") {
            argv.get(2)
        } else {
            argv.first()
        };
        match word {
            Some(w) if self.failing.contains(w) => Err(format!("{w}: failed (recorded)")),
            _ => Ok(()),
        }
    }

    fn hangup(&mut self, pid: i32) -> Result<(), String> {
        self.calls.push(format!("SIGHUP {pid}"));
        Ok(())
    }
}
