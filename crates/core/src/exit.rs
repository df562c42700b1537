//! How a command ends: one clear line on stderr and an exit code.

/// A failed command: `message` is printed as one line (`gpufence: <message>`), then the process
/// exits with `code` (1: invalid input/allocation, 2: driver/NVML/environment failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub code: i32,
    pub message: String,
    /// Why a container creation was refused, where the failing step knows better than the exit
    /// code (counted by reason for `gpufence exporter`).
    pub reason: Option<Reason>,
}

impl Exit {
    pub fn new(code: i32, message: impl std::fmt::Display) -> Self {
        // Keep it to one line whatever the source error printed.
        let message = message.to_string().replace('\n', " ");
        Exit {
            code,
            message,
            reason: None,
        }
    }
    /// The same failure, counted under `reason` when it refuses a container.
    pub fn because(mut self, reason: Reason) -> Self {
        self.reason = Some(reason);
        self
    }
    /// Invalid input (allocation, arguments, files): exit 1.
    pub fn invalid(message: impl std::fmt::Display) -> Self {
        Exit::new(1, message)
    }
    /// The driver or environment failed: exit 2.
    pub fn env(message: impl std::fmt::Display) -> Self {
        Exit::new(2, message)
    }
}

/// Why a container was refused (the `reason` label; a fixed set, so the label stays bounded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The allocation is invalid (annotations, env, CDI names, quotas).
    Allocation,
    /// A GPU was asked for but the inventory is unavailable.
    Inventory,
    /// gpufence's own configuration does not load.
    Config,
    /// The bundle (config.json, container id) is unusable.
    Spec,
    /// The host failed gpufence (state directory, ld cache, mounts, cgroup, runtime).
    Host,
    /// Not a creation refused: a running container found holding a GPU without gpufence's
    /// fence (NRI's after-the-fact check) and fenced or stopped.
    Unfenced,
}

pub const REASONS: [Reason; 6] = [
    Reason::Allocation,
    Reason::Inventory,
    Reason::Config,
    Reason::Spec,
    Reason::Host,
    Reason::Unfenced,
];

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Allocation => "allocation",
            Reason::Inventory => "inventory",
            Reason::Config => "config",
            Reason::Spec => "spec",
            Reason::Host => "host",
            Reason::Unfenced => "unfenced",
        }
    }
}

impl From<crate::config::ConfigError> for Exit {
    fn from(e: crate::config::ConfigError) -> Self {
        Exit::invalid(e)
    }
}

/// Print the failure and exit; used by every binary's `main`.
pub fn finish(prog: &str, r: Result<(), Exit>) -> ! {
    match r {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("{prog}: {}", e.message);
            std::process::exit(e.code)
        }
    }
}

/// What std's start-up does that a `#![no_main]` binary (`gpufence-runtime`) still needs: fds
/// 0–2 opened on `/dev/null` where the caller left them closed (so no file opened later becomes
/// stdout or stderr), and SIGPIPE ignored (a closed stderr pipe or log pipe returns EPIPE rather
/// than killing the wrapper half-way; `Command::exec` restores the default for the real runtime).
pub fn start_like_std() {
    std_fds_on_dev_null();
    // SAFETY: installing SIG_IGN for SIGPIPE before any thread exists has no other effect.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// Fds 0–2 the caller left closed opened on `/dev/null` (inherited across exec).
pub fn std_fds_on_dev_null() {
    for fd in 0..=2 {
        // SAFETY: F_GETFD on a raw descriptor number only reads its flags; a closed one fails
        // with EBADF and nothing is borrowed beyond the call.
        let closed = unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF);
        if closed {
            // Opened without O_CLOEXEC on purpose: the real runtime inherits the placeholder.
            // SAFETY: a NUL-terminated path literal and plain flags; the lowest free descriptor
            // is `fd` itself since every lower one is open (checked in order).
            let got = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
            if got != fd {
                // Cannot happen unless /dev/null is missing; exit as std's start-up would abort.
                std::process::exit(2);
            }
        }
    }
}
