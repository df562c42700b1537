//! The privileged calls `install` makes besides writing files: running a command in the host
//! (restart the engine, warm the inventory cache) and signalling the engine. Behind a trait so
//! the plan's effects can be recorded in tests.

use std::path::Path;

/// What the installer asks of the host.
pub trait Host {
    /// Run `argv` with `root` as its root directory (chroot unless it is `/`); `Err` carries
    /// one line: the exit status and the last line of stderr.
    fn run(&mut self, root: &Path, argv: &[&str]) -> Result<(), String>;
    /// Send SIGHUP to `pid`.
    fn hangup(&mut self, pid: i32) -> Result<(), String>;
}

/// The real host.
pub struct RealHost;

impl Host for RealHost {
    fn run(&mut self, root: &Path, argv: &[&str]) -> Result<(), String> {
        let (prog, args) = argv.split_first().ok_or("empty command")?;
        let mut cmd = std::process::Command::new(prog);
        cmd.args(args).stdin(std::process::Stdio::null());
        if root != Path::new("/") {
            crate::chroot_into(&mut cmd, root).map_err(|e| e.message)?;
        }
        let out = cmd.output().map_err(|e| format!("{prog}: {e}"))?;
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

/// `argv` as it runs inside `root`, for messages and the recording host.
pub fn shown(root: &Path, argv: &[&str]) -> String {
    if root == Path::new("/") {
        argv.join(" ")
    } else {
        format!("chroot {} {}", root.display(), argv.join(" "))
    }
}

/// A host that records what it was asked (and fails the commands whose program is in
/// `failing`).
#[derive(Debug, Default)]
pub struct RecordingHost {
    pub calls: Vec<String>,
    pub failing: Vec<String>,
}

impl Host for RecordingHost {
    fn run(&mut self, root: &Path, argv: &[&str]) -> Result<(), String> {
        self.calls.push(shown(root, argv));
        match argv.first() {
            Some(w) if self.failing.iter().any(|f| f == w) => {
                Err(format!("{w}: failed (recorded)"))
            }
            _ => Ok(()),
        }
    }

    fn hangup(&mut self, pid: i32) -> Result<(), String> {
        self.calls.push(format!("SIGHUP {pid}"));
        Ok(())
    }
}
