//! Every child process gpufence starts, with a deadline.
//!
//! Children touch what an image controls (the namespace worker resolves and mounts inside the
//! rootfs and refreshes its ld cache) or wait on the host (an inventory rescan, `runc
//! --version`). None may hold container creation hostage: each runs in a process group of its
//! own, and when `timeouts.worker` (or the caller's deadline) passes, the whole group is killed
//! with SIGKILL and the caller gets [`ChildError::TimedOut`], one line.
//!
//! A forked worker ([`fork_with_deadline`]) also
//! * dies with its parent (`PR_SET_PDEATHSIG`): when runc kills a hook at the hook's timeout, the
//!   worker does not outlive it;
//! * puts `/dev/null` on its stdin, stdout and stderr: in hook mode those are runc's hook pipes,
//!   and runc waits for EOF on them after the hook exits — a worker holding them would keep runc
//!   (and the engine above it) waiting forever;
//! * marks every other inherited descriptor close-on-exec, so nothing it execs inherits them.
//!
//! Its result travels on a pipe of its own: one line when it fails, nothing when it succeeds.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

/// Most bytes kept from a forked worker's result pipe (the rest is read and dropped).
pub const MAX_OUTPUT: usize = 64 * 1024;

/// Why a child did not deliver a result.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    #[error("{what}: {op}: {errno}")]
    Sys {
        what: String,
        op: &'static str,
        errno: Errno,
    },
    #[error("{what}: cannot start: {message}")]
    Spawn { what: String, message: String },
    #[error("{what}: no result within {}s (timeouts.worker): killed", secs(*after))]
    TimedOut { what: String, after: Duration },
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s:.3}")
    }
}

/// How a child ended and what it wrote.
#[derive(Debug)]
pub struct Finished {
    pub status: WaitStatus,
    /// The forked worker's result pipe, or a spawned command's stdout (both bounded).
    pub out: Vec<u8>,
    /// A spawned command's stderr (empty for a forked worker).
    pub err: Vec<u8>,
}

impl Finished {
    /// Exit code 0.
    pub fn success(&self) -> bool {
        matches!(self.status, WaitStatus::Exited(_, 0))
    }
    /// A forked worker's verdict ([`fork_with_deadline`]): `Ok` when it exited 0 and wrote
    /// nothing; else its exit code with the line it wrote, or 2 with how it ended when it wrote
    /// none (killed, or exited without saying why).
    pub fn verdict(&self, what: &str) -> Result<(), (i32, String)> {
        let msg = String::from_utf8_lossy(&self.out).into_owned();
        match self.status {
            WaitStatus::Exited(_, 0) if msg.is_empty() => Ok(()),
            WaitStatus::Exited(_, code) if !msg.is_empty() => Err((code, msg)),
            _ => Err((2, format!("{what} ended with {}", self.describe()))),
        }
    }
    /// "exit status 3" / "killed by SIGSEGV", for messages.
    pub fn describe(&self) -> String {
        match self.status {
            WaitStatus::Exited(_, c) => format!("exit status {c}"),
            WaitStatus::Signaled(_, s, _) => format!("killed by {s}"),
            other => format!("{other:?}"),
        }
    }
}

fn sys<'a>(what: &'a str, op: &'static str) -> impl Fn(Errno) -> ChildError + 'a {
    move |errno| ChildError::Sys {
        what: what.to_string(),
        op,
        errno,
    }
}

fn pipe_cloexec(what: &str) -> Result<(OwnedFd, OwnedFd), ChildError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys(what, "pipe"))
}

fn pidfd_open(pid: Pid, what: &str) -> Result<OwnedFd, ChildError> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(sys(what, "pidfd_open")(Errno::last()));
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Fork a worker that runs `body` and `_exit`s with the code it returns; `body` may write one
/// line describing a failure into the `File` it is given (the parent gets it in
/// [`Finished::out`]). The worker is set up as the module docs say. The parent waits at most
/// `deadline`, then kills the worker's process group.
///
/// The caller must be single-threaded (the child runs arbitrary code after `fork`).
pub fn fork_with_deadline<F>(
    what: &str,
    deadline: Duration,
    body: F,
) -> Result<Finished, ChildError>
where
    F: FnOnce(&mut std::fs::File) -> i32,
{
    let started = Instant::now();
    let (rd, wr) = pipe_cloexec(what)?;
    let parent = nix::unistd::getpid();
    // SAFETY: callers are single-threaded (documented); the child leaves with _exit.
    match unsafe { nix::unistd::fork() }.map_err(sys(what, "fork"))? {
        nix::unistd::ForkResult::Child => {
            drop(rd);
            let code = match worker_setup(parent) {
                Ok(()) => {
                    let mut f = std::fs::File::from(wr);
                    body(&mut f)
                }
                Err(_) => 2,
            };
            // SAFETY: leave the forked child without running the parent's exit handlers.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(wr);
            drop(body);
            // Also set here: the group must exist before any kill, whichever process runs first.
            let _ = nix::unistd::setpgid(child, child);
            let pidfd = match pidfd_open(child, what) {
                Ok(fd) => fd,
                Err(e) => {
                    kill_and_reap(child);
                    return Err(e);
                }
            };
            let mut outs = [(rd, Vec::new())];
            wait_for(
                child, &pidfd, &mut outs, MAX_OUTPUT, what, started, deadline,
            )
            .map(|status| {
                let [(_, out)] = outs;
                Finished {
                    status,
                    out,
                    err: Vec::new(),
                }
            })
        }
    }
}

/// The worker's own setup (module docs). Runs in the forked child: only async-signal-safe
/// calls that cannot allocate.
fn worker_setup(parent: Pid) -> Result<(), Errno> {
    nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } != 0 {
        return Err(Errno::last());
    }
    // The parent may have died before PDEATHSIG was armed.
    if nix::unistd::getppid() != parent {
        return Err(Errno::ESRCH);
    }
    // SAFETY: open(2) of a static NUL-terminated path (no allocation after fork).
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if null < 0 {
        return Err(Errno::last());
    }
    for fd in 0..=2 {
        // SAFETY: dup2 onto the standard descriptors.
        if unsafe { libc::dup2(null, fd) } < 0 {
            return Err(Errno::last());
        }
    }
    // SAFETY: `null` is ours and no longer needed (0..=2 hold their own references).
    unsafe { libc::close(null) };
    // Everything else inherited (the runtime's preserved fds, engine pipes) stays out of
    // whatever the worker execs (the result pipe is close-on-exec already).
    // SAFETY: close_range(2) with CLOSE_RANGE_CLOEXEC only sets flags on our own descriptors.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r != 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// Run `cmd` (stdin `/dev/null`, stdout and stderr captured up to `limit` bytes each, the rest
/// read and dropped) in a process group of its own; past `deadline` the group is killed.
pub fn output_with_deadline(
    what: &str,
    cmd: &mut Command,
    deadline: Duration,
    limit: usize,
) -> Result<Finished, ChildError> {
    let started = Instant::now();
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ChildError::Spawn {
            what: what.to_string(),
            message: e.to_string(),
        })?;
    let pid = Pid::from_raw(child.id() as i32);
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        kill_and_reap(pid);
        return Err(ChildError::Spawn {
            what: what.to_string(),
            message: "no output pipes".into(),
        });
    };
    let pidfd = match pidfd_open(pid, what) {
        Ok(fd) => fd,
        Err(e) => {
            kill_and_reap(pid);
            return Err(e);
        }
    };
    let mut outs = [
        (OwnedFd::from(out), Vec::new()),
        (OwnedFd::from(err), Vec::new()),
    ];
    let status = wait_for(pid, &pidfd, &mut outs, limit, what, started, deadline)?;
    let [(_, out), (_, err)] = outs;
    Ok(Finished { status, out, err })
}

fn kill_and_reap(pid: Pid) {
    let _ = nix::sys::signal::killpg(pid, Signal::SIGKILL);
    let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(pid, None);
}

/// Read `outs` until `pid` exits (its pidfd turns readable) or the deadline passes; then kill
/// whatever is left of its process group and reap it.
fn wait_for(
    pid: Pid,
    pidfd: &OwnedFd,
    outs: &mut [(OwnedFd, Vec<u8>)],
    limit: usize,
    what: &str,
    started: Instant,
    deadline: Duration,
) -> Result<WaitStatus, ChildError> {
    let mut open: Vec<bool> = vec![true; outs.len()];
    loop {
        let left = deadline.saturating_sub(started.elapsed());
        if left.is_zero() {
            kill_and_reap(pid);
            return Err(ChildError::TimedOut {
                what: what.to_string(),
                after: deadline,
            });
        }
        let mut fds: Vec<libc::pollfd> = vec![libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        for (i, (fd, _)) in outs.iter().enumerate() {
            if open[i] {
                fds.push(libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
        }
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid array of pollfd of the given length for the whole call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = Errno::last();
            if e == Errno::EINTR {
                continue;
            }
            kill_and_reap(pid);
            return Err(sys(what, "poll")(e));
        }
        let exited = fds[0].revents != 0;
        let mut k = 1;
        for (i, (fd, buf)) in outs.iter_mut().enumerate() {
            if !open[i] {
                continue;
            }
            if fds[k].revents != 0 && !read_some(fd, buf, limit) {
                open[i] = false;
            }
            k += 1;
        }
        if exited {
            // What the child wrote before it exited is in the pipes; a grandchild holding one
            // open must not keep us here.
            for (i, (fd, buf)) in outs.iter_mut().enumerate() {
                if open[i] {
                    drain_nonblocking(fd, buf, limit);
                }
            }
            // Kill leftovers of the group before the leader is reaped (its pid, and so the
            // group id, cannot be reused while it is a zombie).
            let _ = nix::sys::signal::killpg(pid, Signal::SIGKILL);
            return nix::sys::wait::waitpid(pid, None).map_err(sys(what, "waitpid"));
        }
        if open.iter().all(|o| !o) {
            // Every pipe is at EOF: only the exit is left to wait for.
            let mut fds = [libc::pollfd {
                fd: pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            let left = deadline.saturating_sub(started.elapsed());
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
        }
    }
}

/// One read into `buf` (kept up to `limit`); false at EOF or on error.
fn read_some(fd: &OwnedFd, buf: &mut Vec<u8>, limit: usize) -> bool {
    let mut chunk = [0u8; 8192];
    match nix::unistd::read(fd, &mut chunk) {
        Ok(0) => false,
        Ok(n) => {
            let room = limit.saturating_sub(buf.len());
            buf.extend_from_slice(&chunk[..n.min(room)]);
            true
        }
        Err(Errno::EINTR) | Err(Errno::EAGAIN) => true,
        Err(_) => false,
    }
}

fn drain_nonblocking(fd: &OwnedFd, buf: &mut Vec<u8>, limit: usize) {
    let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL).unwrap_or(0);
    let _ = nix::fcntl::fcntl(
        fd,
        nix::fcntl::FcntlArg::F_SETFL(
            nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK,
        ),
    );
    let Ok(dup) = fd.try_clone() else {
        return;
    };
    let mut f = std::fs::File::from(dup);
    let mut chunk = [0u8; 8192];
    loop {
        match f.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = limit.saturating_sub(buf.len());
                buf.extend_from_slice(&chunk[..n.min(room)]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_output_and_status() {
        let f = output_with_deadline(
            "sh",
            Command::new("/bin/sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
            MAX_OUTPUT,
        )
        .unwrap();
        assert_eq!(f.out, b"out\n");
        assert_eq!(f.err, b"err\n");
        assert!(!f.success());
        assert_eq!(f.describe(), "exit status 3");
    }

    #[test]
    fn command_past_its_deadline_is_killed_with_its_group() {
        let d = tempfile::tempdir().unwrap();
        let pidfile = d.path().join("grandchild");
        let script = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
        let t = Instant::now();
        let e = output_with_deadline(
            "stall",
            Command::new("/bin/sh").args(["-c", &script]),
            Duration::from_millis(300),
            MAX_OUTPUT,
        )
        .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(
            e.to_string().starts_with("stall: no result within 0.300s"),
            "{e}"
        );
        // The grandchild (same process group) is gone too.
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        gone_soon(pid);
    }

    fn gone_soon(pid: i32) {
        for _ in 0..100 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Gone, or a zombie waiting for init.
            if stat.is_empty() || stat.split_whitespace().nth(2) == Some("Z") {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("process {pid} still alive");
    }

    #[test]
    fn output_beyond_the_limit_is_dropped_not_blocking() {
        let f = output_with_deadline(
            "yes",
            Command::new("/bin/sh").args(["-c", "head -c 1000000 /dev/zero"]),
            Duration::from_secs(10),
            1000,
        )
        .unwrap();
        assert!(f.success());
        assert_eq!(f.out.len(), 1000);
    }

    #[test]
    fn forked_worker_reports_its_line_and_code() {
        let f = fork_with_deadline("worker", Duration::from_secs(10), |out| {
            let _ = std::io::Write::write_all(out, b"boom");
            1
        })
        .unwrap();
        assert_eq!(f.out, b"boom");
        assert!(matches!(f.status, WaitStatus::Exited(_, 1)), "{f:?}");
    }

    #[test]
    fn forked_worker_has_no_inherited_stdio_and_is_killed_at_the_deadline() {
        // Standard descriptors are /dev/null (1:3) in the worker, whatever the parent's are.
        let f = fork_with_deadline("worker", Duration::from_secs(10), |_| {
            let mut ok = true;
            for fd in 0..=2 {
                // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: fstat writes into the live, properly sized buffer `st`.
                ok &= unsafe { libc::fstat(fd, &mut st) } == 0
                    && st.st_mode & libc::S_IFMT == libc::S_IFCHR
                    && st.st_rdev == libc::makedev(1, 3);
            }
            if ok { 0 } else { 7 }
        })
        .unwrap();
        assert!(f.success(), "{f:?}");

        let t = Instant::now();
        let e = fork_with_deadline("stalled worker", Duration::from_millis(200), |_| {
            // SAFETY: plain sleep in the child.
            unsafe { libc::sleep(60) };
            0
        })
        .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(matches!(e, ChildError::TimedOut { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("stalled worker: no result within 0.200s"),
            "{e}"
        );
    }

    #[test]
    fn missing_binary_is_one_line() {
        let e = output_with_deadline(
            "nothing",
            &mut Command::new("/nonexistent/x"),
            Duration::from_secs(1),
            MAX_OUTPUT,
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("nothing: cannot start"), "{e}");
    }
}
