//! Is the real OCI runtime one with a known container escape?
//!
//! gpufence-runtime hands every container to the real runtime; gpufence's confinement of an image
//! is worth nothing if that runtime lets the image out. `gpufence runtime configure` asks the
//! runtime for its version (`runc --version` / `crun --version`, with an empty environment and
//! a deadline) and refuses to register gpufence in front of a release below the fixed versions
//! of the advisories in [`ADVISORIES`] (or warns, with `--allow-vulnerable-runtime`). A runtime
//! it cannot identify, or whose version it cannot read, is a warning: nothing is known either
//! way.

use std::cmp::Ordering;
use std::fmt;

/// The runtimes gpufence knows advisories for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Runc,
    Crun,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Runc => "runc",
            Kind::Crun => "crun",
        }
    }
}

/// `major.minor.patch[-pre]`; build metadata (`+ds1`) is dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    /// `rc.3` of `1.2.0-rc.3`: orders before the release.
    pub pre: Option<String>,
}

impl Version {
    const fn release(major: u64, minor: u64, patch: u64) -> Version {
        Version {
            major,
            minor,
            patch,
            pre: None,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        if let Some(p) = &self.pre {
            write!(f, "-{p}")?;
        }
        Ok(())
    }
}

/// Pre-release identifiers compare numerically where both are numbers (`rc.10` > `rc.9`).
fn cmp_pre(a: &str, b: &str) -> Ordering {
    let mut x = a.split('.');
    let mut y = b.split('.');
    loop {
        match (x.next(), y.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(p), Some(q)) => {
                let o = match (p.parse::<u64>(), q.parse::<u64>()) {
                    (Ok(m), Ok(n)) => m.cmp(&n),
                    _ => p.cmp(q),
                };
                if o != Ordering::Equal {
                    return o;
                }
            }
        }
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (&self.pre, &other.pre) {
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Greater,
                (Some(_), None) => Ordering::Less,
                (Some(a), Some(b)) => cmp_pre(a, b),
            })
    }
}

/// `1.1.5`, `1.1.5+ds1`, `v1.2.0-rc.1`, `1.8.1`, `1.15` (patch 0).
pub fn parse_version(s: &str) -> Option<Version> {
    let s = s.trim().strip_prefix('v').unwrap_or(s.trim());
    let s = s.split('+').next()?;
    let (core, pre) = match s.split_once('-') {
        Some((c, p)) if !p.is_empty() => (c, Some(p.to_string())),
        Some(_) => return None,
        None => (s, None),
    };
    let mut nums = core.split('.');
    let num = |p: Option<&str>| -> Option<u64> {
        let p = p?;
        (!p.is_empty() && p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
    };
    let major = num(nums.next())?;
    let minor = num(nums.next())?;
    let patch = match nums.next() {
        None => 0,
        p => num(p)?,
    };
    if nums.next().is_some() {
        return None;
    }
    Some(Version {
        major,
        minor,
        patch,
        pre,
    })
}

/// The runtime and its version from the first line of `--version` output (`runc version
/// 1.1.5+ds1`, `crun version 1.8.1`).
pub fn parse_version_output(text: &str) -> Option<(Kind, Version)> {
    let first = text.lines().next()?.trim();
    let mut words = first.split_whitespace();
    let kind = match words.next()? {
        "runc" => Kind::Runc,
        "crun" => Kind::Crun,
        _ => return None,
    };
    if words.next()? != "version" {
        return None;
    }
    let v = parse_version(words.next()?)?;
    Some((kind, v))
}

/// One advisory: the first fixed release of each maintained line.
#[derive(Debug)]
pub struct Advisory {
    pub kind: Kind,
    pub ids: &'static str,
    pub what: &'static str,
    /// Sorted; a version is fixed when a fix of its own `major.minor` line is ≤ it, or when it
    /// is ≥ the last fix listed (later lines carry the fix).
    pub fixed: &'static [Version],
}

const fn v(major: u64, minor: u64, patch: u64) -> Version {
    Version::release(major, minor, patch)
}

/// What gpufence checks. Pre-releases with the fix (`1.2.0-rc.3`, `1.4.0-rc.3`) are not listed:
/// they order below the release of their line, so only released versions count as fixed.
pub static ADVISORIES: &[Advisory] = &[
    Advisory {
        kind: Kind::Runc,
        ids: "CVE-2024-21626",
        what: "leaked host fd: a container process starts with the host filesystem as its cwd",
        fixed: &[v(1, 1, 12)],
    },
    Advisory {
        kind: Kind::Runc,
        ids: "CVE-2024-45310",
        what: "a rootfs race makes runc create files and directories on the host",
        fixed: &[v(1, 1, 14), v(1, 2, 0)],
    },
    Advisory {
        kind: Kind::Runc,
        ids: "CVE-2025-31133, CVE-2025-52565, CVE-2025-52881",
        what: "masked paths, /dev/console and procfs writes redirected to host files",
        fixed: &[v(1, 2, 8), v(1, 3, 3), v(1, 4, 0)],
    },
    Advisory {
        kind: Kind::Crun,
        ids: "CVE-2022-27650",
        what: "non-empty inheritable capabilities given to container processes",
        fixed: &[v(1, 4, 4)],
    },
];

impl Advisory {
    pub fn affects(&self, kind: Kind, ver: &Version) -> bool {
        if kind != self.kind {
            return false;
        }
        let own_line = self
            .fixed
            .iter()
            .any(|f| f.major == ver.major && f.minor == ver.minor && ver >= f);
        let later = self.fixed.last().is_some_and(|last| ver >= last);
        !(own_line || later)
    }

    /// The fixed release to name for `ver`: its own line's, else the first one above it.
    pub fn fixed_for(&self, ver: &Version) -> &Version {
        self.fixed
            .iter()
            .find(|f| f.major == ver.major && f.minor == ver.minor)
            .or_else(|| self.fixed.iter().find(|f| *f > ver))
            .unwrap_or(&self.fixed[0])
    }
}

/// The verdict on a runtime's `--version` output.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No advisory applies.
    Fixed { kind: Kind, version: Version },
    /// One line naming every advisory that applies and its fixed release.
    Vulnerable(String),
    /// Not a runtime gpufence knows, or no version it can read.
    Unknown(String),
}

pub fn judge(version_output: &str) -> Verdict {
    let Some((kind, ver)) = parse_version_output(version_output) else {
        let first: String = version_output
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(80)
            .collect();
        return Verdict::Unknown(format!(
            "unrecognised version output {first:?}: no known advisory could be checked"
        ));
    };
    let hits: Vec<String> = ADVISORIES
        .iter()
        .filter(|a| a.affects(kind, &ver))
        .map(|a| format!("{} (fixed in {}: {})", a.ids, a.fixed_for(&ver), a.what))
        .collect();
    if hits.is_empty() {
        Verdict::Fixed { kind, version: ver }
    } else {
        Verdict::Vulnerable(format!(
            "{} {ver} has known container escapes: {}",
            kind.name(),
            hits.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ver(s: &str) -> Version {
        parse_version(s).unwrap_or_else(|| panic!("{s}"))
    }

    #[test]
    fn parses_versions() {
        assert_eq!(ver("1.1.5+ds1"), v(1, 1, 5));
        assert_eq!(ver("v1.1.12"), v(1, 1, 12));
        assert_eq!(ver("1.15"), v(1, 15, 0));
        let rc = ver("1.2.0-rc.3");
        assert_eq!(rc.pre.as_deref(), Some("rc.3"));
        assert_eq!(rc.to_string(), "1.2.0-rc.3");
        for bad in [
            "",
            "1",
            "1.x.3",
            "1.2.3.4",
            "1.2.3-",
            "-1.2.3",
            "1..2",
            "99999999999.1.1",
        ] {
            assert_eq!(parse_version(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn orders_pre_releases_below_their_release() {
        assert!(ver("1.2.0-rc.3") < ver("1.2.0"));
        assert!(ver("1.2.0-rc.3") > ver("1.2.0-rc.2"));
        assert!(ver("1.2.0-rc.10") > ver("1.2.0-rc.9"));
        assert!(ver("1.2.0-rc.1") > ver("1.1.14"));
        assert!(ver("1.1.14") > ver("1.1.5"));
    }

    #[test]
    fn reads_version_output() {
        let runc = "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\ngo: go1.19.8\nlibseccomp: 2.5.4\n";
        assert_eq!(parse_version_output(runc), Some((Kind::Runc, v(1, 1, 5))));
        let crun = "crun version 1.8.1\ncommit: f8a096be060b22ccd3d5f3ebe44108517fbf6c30\nrundir: /run/crun\nspec: 1.0.0\n+SYSTEMD +SELINUX\n";
        assert_eq!(parse_version_output(crun), Some((Kind::Crun, v(1, 8, 1))));
        assert_eq!(parse_version_output("youki version 0.3.0\n"), None);
        assert_eq!(parse_version_output("runc 1.1.5\n"), None);
        assert_eq!(parse_version_output(""), None);
    }

    #[test]
    fn this_distributions_runc_is_refused_with_every_cve() {
        let Verdict::Vulnerable(line) = judge("runc version 1.1.5+ds1\n") else {
            panic!()
        };
        assert!(
            line.starts_with("runc 1.1.5 has known container escapes"),
            "{line}"
        );
        assert!(line.contains("CVE-2024-21626 (fixed in 1.1.12"), "{line}");
        assert!(line.contains("CVE-2024-45310 (fixed in 1.1.14"), "{line}");
        assert!(line.contains("CVE-2025-31133"), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn fixed_lines() {
        let vulnerable =
            |s: &str| matches!(judge(&format!("runc version {s}")), Verdict::Vulnerable(_));
        // Each advisory's boundary.
        assert!(vulnerable("1.1.11"));
        assert!(vulnerable("1.1.13"));
        assert!(vulnerable("1.1.14")); // the 2025 advisories: no 1.1 fix
        assert!(vulnerable("1.2.0-rc.2"));
        assert!(vulnerable("1.2.7"));
        assert!(!vulnerable("1.2.8"));
        assert!(vulnerable("1.3.0"));
        assert!(vulnerable("1.3.2"));
        assert!(!vulnerable("1.3.3"));
        assert!(vulnerable("1.4.0-rc.3"));
        assert!(!vulnerable("1.4.0"));
        assert!(!vulnerable("1.5.1"));
        assert!(!vulnerable("2.0.0"));
        let Verdict::Vulnerable(line) = judge("runc version 1.3.1") else {
            panic!()
        };
        assert!(line.contains("fixed in 1.3.3"), "{line}");
        assert!(!line.contains("CVE-2024"), "{line}");

        assert!(matches!(
            judge("crun version 1.4.3"),
            Verdict::Vulnerable(l) if l.contains("CVE-2022-27650")
        ));
        assert_eq!(
            judge("crun version 1.8.1"),
            Verdict::Fixed {
                kind: Kind::Crun,
                version: v(1, 8, 1)
            }
        );
        assert!(matches!(judge("youki version 0.3.0"), Verdict::Unknown(_)));
        assert!(matches!(judge("runc version banana"), Verdict::Unknown(_)));
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    proptest! {
        /// Any text: no panic; a parsed version prints back to a string that parses to it.
        #[test]
        fn parse_never_panics_and_round_trips(s in "\\PC{0,40}") {
            if let Some(v) = super::parse_version(&s) {
                prop_assert_eq!(super::parse_version(&v.to_string()), Some(v));
            }
            let _ = super::judge(&s);
        }

        #[test]
        fn ordering_follows_the_numbers(a in 0u64..50, b in 0u64..50, c in 0u64..50, d in 0u64..50) {
            let x = super::v(1, a, b);
            let y = super::v(1, c, d);
            prop_assert_eq!(x.cmp(&y), (a, b).cmp(&(c, d)));
        }
    }
}
