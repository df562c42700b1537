//! Opt-in timing of the create path, for `benches/runtime.sh`: with `GPUFENCE_PHASES=<file>` in
//! the wrapper's own environment (set by whoever runs `gpufence-runtime` — containerd, the
//! engine, a bench; never the container), `create`/`run` appends ONE line to `<file>` just
//! before it execs the real runtime:
//!
//! ```text
//! gpufence-phases id=<id> main_at=<µs since epoch> config=<µs> bundle=<µs> log=<µs> inventory=<µs> plan=<µs> logline=<µs> apply=<µs> ldcache=<µs> hostfiles=<µs> spec=<µs> cpu=<µs> exec_at=<µs since epoch>
//! ```
//!
//! `main_at` and `exec_at` are wall-clock stamps (the caller subtracts its own start stamp to get
//! the process start, and the real runtime's end to get the exec + runc part); `cpu` is this
//! process's user+system time at the exec. The file must be an absolute path inside the
//! configured `state-dir` without `..` (anything else is ignored with one line on stderr), is
//! opened with `O_NOFOLLOW|O_APPEND|O_CREAT` mode 0600 and written with one `write`. Without
//! the variable nothing is measured and nothing is written.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The environment variable naming the phase file.
pub const ENV: &str = "GPUFENCE_PHASES";

/// Phase durations of one create, in order.
#[derive(Debug)]
pub struct Phases {
    main_at: u128,
    last: Instant,
    marks: Vec<(&'static str, u128)>,
}

fn epoch_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

impl Phases {
    /// Start the clock (call first thing in `main`); `None` when the variable is unset.
    pub fn start() -> Option<Phases> {
        std::env::var_os(ENV)?;
        Some(Phases {
            main_at: epoch_us(),
            last: Instant::now(),
            marks: Vec::with_capacity(10),
        })
    }

    /// Close phase `name` (the time since the previous mark).
    pub fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.marks
            .push((name, now.duration_since(self.last).as_micros()));
        self.last = now;
    }

    /// Move `us` microseconds of the phase in progress into phase `name` (a phase measured
    /// inside another one, such as the inventory inside the intake).
    pub fn split(&mut self, name: &'static str, us: u128) {
        self.marks.push((name, us));
        self.last += std::time::Duration::from_micros(us as u64);
    }

    /// The line written to the file (without the exec stamp's phase).
    pub fn line(&self, id: &str, cpu_us: u128, exec_at: u128) -> String {
        let mut s = format!("gpufence-phases id={id} main_at={}", self.main_at);
        for (n, us) in &self.marks {
            s.push_str(&format!(" {n}={us}"));
        }
        s.push_str(&format!(" cpu={cpu_us} exec_at={exec_at}\n"));
        s
    }

    /// Append the line to the file named by the variable, when it lies inside `state_dir`.
    pub fn write(&self, id: &str, state_dir: &Path) {
        let Some(target) = std::env::var_os(ENV).map(PathBuf::from) else {
            return;
        };
        if !allowed(&target, state_dir) {
            eprintln!(
                "gpufence-runtime: {ENV}={}: not an absolute path inside state-dir {}; ignored",
                target.display(),
                state_dir.display()
            );
            return;
        }
        let line = self.line(id, cpu_us(), epoch_us());
        let f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&target);
        if let Err(e) = f.and_then(|mut f| f.write_all(line.as_bytes())) {
            eprintln!("gpufence-runtime: {ENV}={}: {e}", target.display());
        }
    }
}

/// Absolute, no `..`, strictly inside `state_dir`.
fn allowed(target: &Path, state_dir: &Path) -> bool {
    target.is_absolute()
        && state_dir.is_absolute()
        && !target.components().any(|c| c == Component::ParentDir)
        && target != state_dir
        && target.starts_with(state_dir)
}

/// User + system time of this process so far.
fn cpu_us() -> u128 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the zeroed buffer we own; checked for 0 below.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) } != 0 {
        return 0;
    }
    // SAFETY: getrusage succeeded, so the struct is initialised (it was zeroed anyway).
    let ru = unsafe { ru.assume_init() };
    let t = |tv: libc::timeval| (tv.tv_sec as u128) * 1_000_000 + tv.tv_usec as u128;
    t(ru.ru_utime) + t(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_absolute_paths_inside_the_state_dir() {
        let s = Path::new("/run/gpufence");
        assert!(allowed(Path::new("/run/gpufence/phases.txt"), s));
        assert!(allowed(Path::new("/run/gpufence/b/p"), s));
        assert!(!allowed(Path::new("run/gpufence/phases.txt"), s));
        assert!(!allowed(Path::new("/run/gpufence/../etc/passwd"), s));
        assert!(!allowed(Path::new("/run/gpufence"), s));
        assert!(!allowed(Path::new("/run/gpufence-other/p"), s));
        assert!(!allowed(Path::new("/etc/shadow"), s));
        assert!(!allowed(Path::new("/run/gpufence/p"), Path::new("rel")));
    }

    #[test]
    fn line_lists_the_marks_in_order() {
        let mut p = Phases {
            main_at: 7,
            last: Instant::now(),
            marks: Vec::new(),
        };
        p.mark("config");
        p.split("inventory", 5);
        p.mark("plan");
        let l = p.line("c1", 42, 9);
        let names: Vec<&str> = l
            .split_whitespace()
            .map(|w| w.split('=').next().unwrap())
            .collect();
        assert_eq!(
            names,
            vec![
                "gpufence-phases",
                "id",
                "main_at",
                "config",
                "inventory",
                "plan",
                "cpu",
                "exec_at"
            ]
        );
        assert!(l.contains(" inventory=5 ") && l.starts_with("gpufence-phases id=c1 main_at=7 "));
        assert!(l.ends_with(" cpu=42 exec_at=9\n"));
    }

    #[test]
    fn write_refuses_a_path_outside_and_appends_inside() {
        let d = std::env::temp_dir().join(format!("gpufence-phases-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = Phases {
            main_at: 1,
            last: Instant::now(),
            marks: vec![("config", 3)],
        };
        let f = d.join("phases.txt");
        // SAFETY: no other test of this binary reads or writes GPUFENCE_PHASES.
        unsafe { std::env::set_var(ENV, &f) };
        p.write("a", &d);
        p.write("b", &d);
        p.write("c", Path::new("/nonexistent-state"));
        // SAFETY: as above.
        unsafe { std::env::remove_var(ENV) };
        let text = std::fs::read_to_string(&f).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            text.starts_with("gpufence-phases id=a ") && text.contains("\ngpufence-phases id=b ")
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
