//! runc's command line, read without judging it: gpufence-runtime must accept exactly what runc
//! accepts (global flags before the subcommand, unknown flags, `--flag=value` and `-flag value`
//! forms) and hand the argv on unchanged. Only three facts are extracted: the subcommand, the
//! bundle directory and the container id, plus the `--log`/`--log-format` global flags so that
//! gpufence can report its own errors where the caller looks for runc's.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// runc's subcommands (1.1): a positional that is not one of these is taken as the value of an
/// unknown global flag, not as the subcommand.
const SUBCOMMANDS: [&str; 19] = [
    "checkpoint",
    "create",
    "delete",
    "events",
    "exec",
    "features",
    "help",
    "init",
    "kill",
    "list",
    "pause",
    "ps",
    "restore",
    "resume",
    "run",
    "spec",
    "start",
    "state",
    "update",
];

/// runc global flags that take a value (`--root X` as well as `--root=X`).
const GLOBAL_VALUE_FLAGS: [&str; 5] = ["root", "log", "log-format", "criu", "rootless"];

/// Flags of `create`/`run` that take a value.
const CREATE_VALUE_FLAGS: [&str; 5] = ["bundle", "b", "console-socket", "pid-file", "preserve-fds"];

/// Flags of `delete`/`kill`/`state`/… that take a value (none of `delete`'s do; `kill` has none
/// either; `exec` has many, but only the subcommand matters there).
const OTHER_VALUE_FLAGS: [&str; 0] = [];

/// What gpufence needs from a runc command line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuncArgs {
    /// The subcommand (`create`, `run`, `delete`, …), if one was found.
    pub subcommand: Option<String>,
    /// `--bundle`/`-b` of `create`/`run` (`None`: the current directory).
    pub bundle: Option<PathBuf>,
    /// The last positional argument after the subcommand (the container id of
    /// `create`/`run`/`delete`/`start`/…).
    pub container_id: Option<String>,
    /// Global `--log FILE`.
    pub log: Option<PathBuf>,
    /// Global `--log-format text|json`.
    pub log_format: Option<String>,
    /// Global `--root DIR`.
    pub root: Option<PathBuf>,
    /// `--pid-file FILE` of `create`/`run` (where `gpufence ps` finds the container's init).
    pub pid_file: Option<PathBuf>,
}

impl RuncArgs {
    /// True for the subcommands that create a container from a bundle.
    pub fn is_create(&self) -> bool {
        matches!(self.subcommand.as_deref(), Some("create" | "run"))
    }
    /// True for `delete`.
    pub fn is_delete(&self) -> bool {
        self.subcommand.as_deref() == Some("delete")
    }
    /// True when runc's log should be JSON (`--log-format json`).
    pub fn log_is_json(&self) -> bool {
        self.log_format.as_deref() == Some("json")
    }
}

/// A flag split into name (without dashes) and inline value (`--x=y`).
fn split_flag(b: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    if b.len() < 2 || b[0] != b'-' {
        return None;
    }
    let body = b.strip_prefix(b"--").unwrap_or(&b[1..]);
    Some(match body.iter().position(|&c| c == b'=') {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    })
}

/// One argument as bytes: an `OsString` of std's argv, or a C string straight from `main`'s.
pub trait Arg {
    fn bytes(&self) -> &[u8];
}
impl Arg for OsString {
    fn bytes(&self) -> &[u8] {
        self.as_bytes()
    }
}
impl Arg for &std::ffi::CStr {
    fn bytes(&self) -> &[u8] {
        self.to_bytes()
    }
}

/// runc's global flags, up to the subcommand: `on_flag(name, value)` for each flag (a value
/// flag's separate value consumed), and the index of the subcommand, if there is one. Reads the
/// arguments as bytes and allocates nothing: the pass-through path runs it before anything else.
pub fn globals<T: Arg>(args: &[T], mut on_flag: impl FnMut(&[u8], Option<&[u8]>)) -> Option<usize> {
    let mut i = 0;
    while i < args.len() {
        let a = args[i].bytes();
        if a == b"--" {
            return None;
        }
        match split_flag(a) {
            Some((name, inline)) => {
                let takes_value = GLOBAL_VALUE_FLAGS.iter().any(|f| f.as_bytes() == name);
                let value = if takes_value && inline.is_none() {
                    i += 1;
                    args.get(i).map(Arg::bytes)
                } else {
                    inline
                };
                on_flag(name, value);
            }
            // A positional that is not a subcommand is the value of an unknown global flag
            // (`--unknown value`): skipped.
            None if SUBCOMMANDS.iter().any(|s| s.as_bytes() == a) => return Some(i),
            None => {}
        }
        i += 1;
    }
    None
}

/// Whether gpufence has work to do for this command line (`create`, `run`, `delete`); every
/// other call is handed to the real runtime unread.
pub fn needs_wrapper<T: Arg>(args: &[T]) -> bool {
    globals(args, |_, _| {})
        .is_some_and(|i| matches!(args[i].bytes(), b"create" | b"run" | b"delete"))
}

/// Parse a runc argv (without argv[0]). Never fails: anything it does not understand is left
/// for the real runtime to judge.
pub fn parse(args: &[OsString]) -> RuncArgs {
    let mut out = RuncArgs::default();
    let os = |v: &[u8]| OsStr::from_bytes(v).to_os_string();
    let sub_at = globals(args, |name, value| match name {
        b"log" => out.log = value.map(|v| PathBuf::from(os(v))),
        b"log-format" => out.log_format = value.map(|v| String::from_utf8_lossy(v).into_owned()),
        b"root" => out.root = value.map(|v| PathBuf::from(os(v))),
        _ => {}
    });
    let Some(mut i) = sub_at else {
        return out;
    };
    out.subcommand = Some(args[i].to_string_lossy().into_owned());
    i += 1;
    let value_flags: &[&str] = if out.is_create() {
        &CREATE_VALUE_FLAGS
    } else {
        &OTHER_VALUE_FLAGS
    };
    let mut positional_only = false;
    while i < args.len() {
        let a = &args[i];
        if !positional_only && a == "--" {
            positional_only = true;
            i += 1;
            continue;
        }
        match (positional_only, split_flag(a.as_bytes())) {
            (false, Some((name, inline))) => {
                let takes_value = value_flags.iter().any(|f| f.as_bytes() == name);
                let value = if takes_value && inline.is_none() {
                    i += 1;
                    args.get(i).map(|v| v.as_bytes())
                } else {
                    inline
                };
                if (name == b"bundle" || name == b"b") && takes_value {
                    out.bundle = value.map(|v| PathBuf::from(os(v)));
                } else if name == b"pid-file" && takes_value {
                    out.pid_file = value.map(|v| PathBuf::from(os(v)));
                }
            }
            _ => out.container_id = Some(a.to_string_lossy().into_owned()),
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &[&str]) -> RuncArgs {
        parse(&v.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn containerd_create() {
        let a = p(&[
            "--root",
            "/run/containerd/runc/k8s.io",
            "--log",
            "/s/log.json",
            "--log-format",
            "json",
            "--systemd-cgroup",
            "create",
            "--bundle",
            "/s/b",
            "--pid-file",
            "/s/b/init.pid",
            "c1",
        ]);
        assert_eq!(a.subcommand.as_deref(), Some("create"));
        assert_eq!(a.bundle, Some(PathBuf::from("/s/b")));
        assert_eq!(a.container_id.as_deref(), Some("c1"));
        assert_eq!(a.log, Some(PathBuf::from("/s/log.json")));
        assert!(a.log_is_json());
        assert_eq!(a.root, Some(PathBuf::from("/run/containerd/runc/k8s.io")));
        assert!(a.is_create());
    }

    #[test]
    fn equals_forms_and_short_bundle() {
        let a = p(&[
            "--log=/l",
            "--log-format=text",
            "--debug",
            "run",
            "-b",
            "/b",
            "-d",
            "x",
        ]);
        assert_eq!(a.subcommand.as_deref(), Some("run"));
        assert_eq!(a.bundle, Some(PathBuf::from("/b")));
        assert_eq!(a.container_id.as_deref(), Some("x"));
        assert_eq!(a.log, Some(PathBuf::from("/l")));
        assert!(!a.log_is_json());
        let a = p(&["create", "--bundle=/b2", "--console-socket", "/sock", "y"]);
        assert_eq!(a.bundle, Some(PathBuf::from("/b2")));
        assert_eq!(a.container_id.as_deref(), Some("y"));
        let a = p(&["-root", "/r", "create", "-bundle", "/b3", "z"]);
        assert_eq!(a.root, Some(PathBuf::from("/r")));
        assert_eq!(a.bundle, Some(PathBuf::from("/b3")));
    }

    #[test]
    fn bundle_defaults_to_cwd_and_id_is_last() {
        let a = p(&["create", "--pid-file", "p", "--no-pivot", "id9"]);
        assert_eq!(a.bundle, None);
        assert_eq!(a.pid_file, Some(PathBuf::from("p")));
        assert_eq!(a.container_id.as_deref(), Some("id9"));
    }

    #[test]
    fn value_named_create_is_not_the_subcommand() {
        // `--root create` names a directory called "create"; the subcommand comes after.
        let a = p(&["--root", "create", "delete", "--force", "c"]);
        assert_eq!(a.subcommand.as_deref(), Some("delete"));
        assert_eq!(a.container_id.as_deref(), Some("c"));
        // `--bundle create` likewise.
        let a = p(&["run", "--bundle", "create", "c"]);
        assert_eq!(a.bundle, Some(PathBuf::from("create")));
        assert_eq!(a.container_id.as_deref(), Some("c"));
    }

    #[test]
    fn unknown_flags_pass() {
        let a = p(&["--future-flag", "--future=1", "state", "c"]);
        assert_eq!(a.subcommand.as_deref(), Some("state"));
        assert!(!a.is_create());
        let a = p(&["--future-value", "v", "create", "c"]);
        assert_eq!(a.subcommand.as_deref(), Some("create"));
        let a = p(&["--version"]);
        assert_eq!(a.subcommand, None);
        let a = p(&[]);
        assert_eq!(a, RuncArgs::default());
    }

    fn wrapped(v: &[&str]) -> bool {
        let c: Vec<std::ffi::CString> = v
            .iter()
            .map(|s| std::ffi::CString::new(*s).unwrap())
            .collect();
        needs_wrapper(&c.iter().map(|c| c.as_c_str()).collect::<Vec<_>>())
    }

    #[test]
    fn only_create_run_and_delete_need_the_wrapper() {
        assert!(wrapped(&["--root", "/r", "create", "--bundle", "/b", "c"]));
        assert!(wrapped(&["run", "c"]));
        assert!(wrapped(&["--log", "/l", "delete", "--force", "c"]));
        for v in [
            &["--root", "/r", "start", "c"][..],
            &["state", "c"],
            &["--root", "create", "kill", "c", "9"],
            &["--", "create"],
            &["--version"],
            &[],
        ] {
            assert!(!wrapped(v), "{v:?}");
        }
    }

    proptest::proptest! {
        /// The pass-through path's decision (C strings, nothing allocated) is the one `parse`
        /// makes for the create path.
        #[test]
        fn needs_wrapper_agrees_with_parse(v in proptest::collection::vec("[a-z=-]{0,8}|create|run|delete|state|--root|--log", 0..8)) {
            let strs: Vec<&str> = v.iter().map(String::as_str).collect();
            let a = p(&strs);
            proptest::prop_assert_eq!(wrapped(&strs), a.is_create() || a.is_delete());
        }

        #[test]
        fn never_panics(v in proptest::collection::vec(".{0,12}", 0..10)) {
            let a = p(&v.iter().map(String::as_str).collect::<Vec<_>>());
            if let Some(id) = a.container_id {
                proptest::prop_assert!(v.contains(&id));
            }
        }
    }
}
