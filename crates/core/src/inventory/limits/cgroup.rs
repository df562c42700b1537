//! The container's cgroup v2 directory, for NVML's `nameSpace` ("full path to sysfs cgroup").
//!
//! The directory is where the kernel put the container's init (`/proc/<pid>/cgroup`, the `0::`
//! line, read from the host's cgroup namespace, under the host's cgroup2 mount): runc has created
//! and joined it by the time createRuntime hooks run. It is checked against what the spec's
//! `linux.cgroupsPath` names, in either of runc's forms — systemd `slice:prefix:name`
//! (`/a.slice/a-b.slice/prefix-name.scope`) or a cgroupfs path (absolute, or relative to the
//! runtime's own cgroup) — so a container is never limited through a cgroup it does not own.
//!
//! On a hybrid host (cgroup v1 controllers, cgroup2 at `/sys/fs/cgroup/unified`) runc also places
//! the container in the unified hierarchy; that directory is the one named.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// How cgroups are mounted on this host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    /// cgroup v2 only, at `/sys/fs/cgroup`.
    Unified,
    /// cgroup v1 controllers with cgroup2 at `/sys/fs/cgroup/unified`.
    Hybrid,
    /// cgroup v1 only.
    Legacy,
    #[default]
    Unknown,
}

impl CgroupMode {
    pub fn name(self) -> &'static str {
        match self {
            CgroupMode::Unified => "unified",
            CgroupMode::Hybrid => "hybrid",
            CgroupMode::Legacy => "legacy",
            CgroupMode::Unknown => "unknown",
        }
    }
}

fn is_cgroup2(p: &Path) -> bool {
    nix::sys::statfs::statfs(p)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

/// The host's cgroup layout and its cgroup2 mount point, if any.
pub fn mode() -> (CgroupMode, Option<PathBuf>) {
    let root = Path::new("/sys/fs/cgroup");
    if is_cgroup2(root) {
        return (CgroupMode::Unified, Some(root.to_path_buf()));
    }
    let unified = root.join("unified");
    if is_cgroup2(&unified) {
        return (CgroupMode::Hybrid, Some(unified));
    }
    if root.is_dir() {
        (CgroupMode::Legacy, None)
    } else {
        (CgroupMode::Unknown, None)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathFormError {
    #[error("cgroupsPath {0:?}: {1}")]
    Invalid(String, &'static str),
    #[error("the runtime's own cgroup {0:?}: {1}")]
    Own(String, &'static str),
}

/// The cgroup (path inside the v2 hierarchy) that `linux.cgroupsPath` names. `own` is the
/// runtime's own v2 cgroup (relative cgroupfs paths are below it), `id` the container id (runc's
/// default name when the path is empty).
pub fn expected_path(
    cgroups_path: Option<&str>,
    own: &str,
    id: &str,
    systemd: bool,
) -> Result<String, PathFormError> {
    let raw = cgroups_path.unwrap_or("");
    let bad = |why| PathFormError::Invalid(raw.to_string(), why);
    let climbs = |p: &str| p.contains('\0') || p.split('/').any(|c| c == "..");
    if climbs(raw) {
        return Err(bad("must not contain `..`"));
    }
    // `own` comes from the kernel (`0::` of /proc/self/cgroup), which never writes `..`; a
    // relative cgroupsPath is joined below it, so the result's guarantee rests on it too.
    if climbs(own) {
        return Err(PathFormError::Own(own.to_string(), "must not contain `..`"));
    }
    if systemd || (!raw.starts_with('/') && raw.matches(':').count() == 2) {
        let mut it = raw.splitn(3, ':');
        let (slice, prefix, name) = (
            it.next().unwrap_or(""),
            it.next().unwrap_or(""),
            it.next().unwrap_or(""),
        );
        if name.is_empty() {
            return Err(bad("systemd form is slice:prefix:name"));
        }
        if prefix.contains('/') || name.contains('/') {
            return Err(bad("a systemd unit name has no `/`"));
        }
        let slice = if slice.is_empty() {
            "system.slice"
        } else {
            slice
        };
        let mut path = expand_slice(slice).ok_or_else(|| bad("not a valid systemd slice"))?;
        if name.ends_with(".slice") {
            path.push('/');
            path.push_str(name);
        } else if prefix.is_empty() {
            path.push_str(&format!("/{name}.scope"));
        } else {
            path.push_str(&format!("/{prefix}-{name}.scope"));
        }
        return Ok(path);
    }
    let joined = if raw.is_empty() {
        format!("{}/{id}", own.trim_end_matches('/'))
    } else if raw.starts_with('/') {
        raw.to_string()
    } else {
        format!("{}/{raw}", own.trim_end_matches('/'))
    };
    let clean: Vec<&str> = joined
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if clean.is_empty() {
        return Err(bad("names the root cgroup"));
    }
    Ok(format!("/{}", clean.join("/")))
}

/// `a-b-c.slice` → `/a.slice/a-b.slice/a-b-c.slice` (systemd's slice nesting); `-.slice` is the
/// root.
fn expand_slice(slice: &str) -> Option<String> {
    let stem = slice.strip_suffix(".slice")?;
    if stem == "-" {
        return Some(String::new());
    }
    if stem.is_empty()
        || stem.contains('/')
        || stem.starts_with('-')
        || stem.ends_with('-')
        || stem.contains("--")
    {
        return None;
    }
    let mut out = String::new();
    let mut acc = String::new();
    for part in stem.split('-') {
        if !acc.is_empty() {
            acc.push('-');
        }
        acc.push_str(part);
        out.push_str(&format!("/{acc}.slice"));
    }
    Some(out)
}

/// The `0::` path of `/proc/<pid>/cgroup` text.
pub fn v2_member(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim_end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_form() {
        assert_eq!(
            expected_path(
                Some("kubepods-besteffort-pod12.slice:cri-containerd:abc"),
                "/",
                "x",
                false
            )
            .unwrap(),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12.slice/cri-containerd-abc.scope"
        );
        assert_eq!(
            expected_path(Some(":libpod:abc"), "/", "x", true).unwrap(),
            "/system.slice/libpod-abc.scope"
        );
        assert_eq!(
            expected_path(Some("-.slice:p:n"), "/", "x", true).unwrap(),
            "/p-n.scope"
        );
        assert!(expected_path(Some("a--b.slice:p:n"), "/", "x", true).is_err());
        assert!(expected_path(Some("nota:p:"), "/", "x", true).is_err());
        assert!(expected_path(Some("s.slice::../x"), "/", "x", true).is_err());
        assert!(expected_path(Some("s.slice:a/b:x"), "/", "x", true).is_err());
    }

    #[test]
    fn own_cgroup_with_dotdot_is_refused() {
        // Found by the driver_limits fuzz target: a relative cgroupsPath joined below an `own`
        // holding `..` came out with `..` in it.
        let e = expected_path(Some("a:b:c:d"), "/m/../x", "c1", false).unwrap_err();
        assert!(matches!(e, PathFormError::Own(..)), "{e}");
        assert!(expected_path(None, "/m/\0", "c1", false).is_err());
        assert_eq!(
            expected_path(Some("a:b:c:d"), "/m/x", "c1", false).unwrap(),
            "/m/x/a:b:c:d"
        );
    }

    #[test]
    fn cgroupfs_form() {
        assert_eq!(expected_path(None, "/", "c1", false).unwrap(), "/c1");
        assert_eq!(
            expected_path(None, "/user/1", "c1", false).unwrap(),
            "/user/1/c1"
        );
        assert_eq!(
            expected_path(Some("/kubepods/pod1/c1"), "/x", "c1", false).unwrap(),
            "/kubepods/pod1/c1"
        );
        assert_eq!(
            expected_path(Some("rel/c1"), "/own", "c1", false).unwrap(),
            "/own/rel/c1"
        );
        assert!(expected_path(Some("/a/../b"), "/", "c1", false).is_err());
        assert!(expected_path(Some("/"), "/", "c1", false).is_err());
    }

    #[test]
    fn member_line() {
        let t = "12:devices:/c1\n0::/c1\n";
        assert_eq!(v2_member(t), Some("/c1"));
        assert_eq!(v2_member("1:name=systemd:/\n"), None);
    }

    proptest::proptest! {
        #[test]
        fn forms_never_panic(p in ".{0,80}", own in "/[a-z/]{0,20}") {
            for systemd in [false, true] {
                if let Ok(x) = expected_path(Some(&p), &own, "id", systemd) {
                    proptest::prop_assert!(x.starts_with('/'));
                    proptest::prop_assert!(!x.split('/').any(|c| c == ".."));
                    proptest::prop_assert!(!x.contains("//"), "{}", x);
                }
            }
        }
    }
}
