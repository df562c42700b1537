//! How a command ends: one clear line on stderr and an exit code.

/// A failed command: `message` is printed as one line (`gpufence: <message>`), then the process
/// exits with `code` (1: invalid input/allocation, 2: driver/NVML/environment failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub code: i32,
    pub message: String,
    /// Why a container creation was refused, where the failing step knows better than the exit
    /// code (counted by reason for `gpufence exporter`).
    pub reason: Option<crate::status::refusals::Reason>,
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
    pub fn because(mut self, reason: crate::status::refusals::Reason) -> Self {
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
