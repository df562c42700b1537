//! The container's device cgroup: v1 `devices.allow`, v2 device BPF program.
//!
//! Cgroup paths come from `/proc/<pid>/cgroup` of the container's init (read from the host's
//! cgroup namespace) and mount points from the host's `/proc/self/mountinfo`. Both trees are
//! handled when both exist (hybrid hosts: runc enforces devices on v1 and also places the
//! container in the unified hierarchy).

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::bpf;
use crate::plan::CgroupRule;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cgroup path {path:?} of the container is not usable: {why}")]
    BadPath { path: String, why: &'static str },
    #[error("opening cgroup {path}: {errno}")]
    Open {
        path: String,
        errno: nix::errno::Errno,
    },
    #[error("writing {rule:?} to {path}: {source}")]
    Allow {
        path: String,
        rule: String,
        source: std::io::Error,
    },
    #[error(
        "the container has no device cgroup (neither a v1 devices controller nor cgroup v2): refusing to hand out devices"
    )]
    NoDeviceCgroup,
    #[error(transparent)]
    Bpf(#[from] bpf::BpfError),
}

/// One line of `/proc/<pid>/cgroup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub hierarchy: u32,
    pub controllers: Vec<String>,
    pub path: String,
}

pub fn parse_proc_cgroup(text: &str) -> Vec<Membership> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let h = it.next()?.parse().ok()?;
            let c = it.next()?;
            let p = it.next()?;
            Some(Membership {
                hierarchy: h,
                controllers: c
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
                path: p.to_string(),
            })
        })
        .collect()
}

/// A cgroup mount: (root inside the hierarchy, mount point, fs type, super options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub root: String,
    pub mount_point: PathBuf,
    pub v2: bool,
    pub super_opts: Vec<String>,
}

pub fn parse_cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(dash) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        if f.len() < dash + 4 || f.len() < 5 {
            continue;
        }
        let fstype = f[dash + 1];
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        out.push(CgroupMount {
            root: f[3].to_string(),
            mount_point: PathBuf::from(f[4]),
            v2: fstype == "cgroup2",
            super_opts: f[dash + 3].split(',').map(str::to_string).collect(),
        });
    }
    out
}

/// Host directory of a cgroup given its mount and the path from `/proc/<pid>/cgroup`.
fn cgroup_dir(m: &CgroupMount, path: &str) -> Result<PathBuf, CgroupError> {
    let bad = |why| CgroupError::BadPath {
        path: path.to_string(),
        why,
    };
    let rel = if m.root == "/" {
        path
    } else {
        path.strip_prefix(m.root.as_str())
            .ok_or_else(|| bad("outside the mounted hierarchy"))?
    };
    let comps = crate::enter::safepath::components(if rel.is_empty() { "/" } else { rel })
        .map_err(|_| bad("not a clean absolute path"))?;
    if comps.is_empty() {
        return Err(bad("is the root cgroup"));
    }
    Ok(comps.iter().fold(m.mount_point.clone(), |p, c| p.join(c)))
}

/// The device cgroups of the container's init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCgroups {
    /// v1 devices controller directory.
    pub v1: Option<PathBuf>,
    /// v2 (unified) directory.
    pub v2: Option<PathBuf>,
}

pub fn locate(proc_cgroup: &str, mountinfo: &str) -> Result<DeviceCgroups, CgroupError> {
    let members = parse_proc_cgroup(proc_cgroup);
    let mounts = parse_cgroup_mounts(mountinfo);
    let mut v1 = None;
    let mut v2 = None;
    for mem in &members {
        if mem.hierarchy == 0 && mem.controllers.is_empty() {
            if let Some(m) = mounts.iter().find(|m| m.v2) {
                v2 = Some(cgroup_dir(m, &mem.path)?);
            }
        } else if mem.controllers.iter().any(|c| c == "devices")
            && let Some(m) = mounts
                .iter()
                .find(|m| !m.v2 && m.super_opts.iter().any(|o| o == "devices"))
        {
            v1 = Some(cgroup_dir(m, &mem.path)?);
        }
    }
    if v1.is_none() && v2.is_none() {
        return Err(CgroupError::NoDeviceCgroup);
    }
    Ok(DeviceCgroups { v1, v2 })
}

fn open_dir(p: &Path) -> Result<OwnedFd, CgroupError> {
    nix::fcntl::open(
        p,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| CgroupError::Open {
        path: p.display().to_string(),
        errno,
    })
}

/// Write allow rules to a v1 devices cgroup.
pub fn allow_v1(dir: &Path, rules: &[CgroupRule]) -> Result<(), CgroupError> {
    let dfd = open_dir(dir)?;
    let path = dir.join("devices.allow");
    let fd = nix::fcntl::openat(
        &dfd,
        "devices.allow",
        OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| CgroupError::Open {
        path: path.display().to_string(),
        errno,
    })?;
    let mut f = std::fs::File::from(fd);
    for r in rules {
        let line = r.to_string();
        // One rule per write(2): the kernel parses one rule per write.
        f.write_all(line.as_bytes())
            .map_err(|source| CgroupError::Allow {
                path: path.display().to_string(),
                rule: line.clone(),
                source,
            })?;
    }
    Ok(())
}

/// On a v2 cgroup: widen the device programs already attached (the runtime's) to allow the
/// granted nodes, then attach the gate program that keeps GPU-class devices to the granted
/// ones. Returns how many runtime programs were widened.
pub fn gate_v2(
    dir: &Path,
    rules: &[CgroupRule],
    gated_majors: &[u32],
) -> Result<usize, CgroupError> {
    let dfd = open_dir(dir)?;
    let shown = dir.display().to_string();
    let grants: Vec<bpf::Grant> = rules.iter().filter_map(bpf::Grant::from_rule).collect();
    let before = bpf::query(&dfd, &shown)?;
    let widened = bpf::widen_attached(&dfd, &shown, &before, &grants)?;
    let prog = bpf::build_program(&grants, gated_majors);
    let pfd = bpf::load(&prog)?;
    bpf::attach(&pfd, &dfd, &shown)?;
    Ok(widened)
}

/// Character-device majors that belong to the NVIDIA driver: 195 plus every `nvidia*` entry
/// of `/proc/devices` (nvidia-uvm, nvidia-caps, nvidia-nvswitch, … have dynamic majors).
pub fn gated_majors(proc_devices: &str, extra: impl IntoIterator<Item = u32>) -> Vec<u32> {
    let mut v: Vec<u32> = vec![195];
    let mut in_char = false;
    for l in proc_devices.lines() {
        let l = l.trim();
        if l.starts_with("Character devices") {
            in_char = true;
            continue;
        }
        if l.starts_with("Block devices") {
            in_char = false;
            continue;
        }
        if !in_char {
            continue;
        }
        if let Some((num, name)) = l.split_once(' ')
            && name.trim().starts_with("nvidia")
            && let Ok(n) = num.parse()
        {
            v.push(n);
        }
    }
    v.extend(extra);
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: &str = "\
25 1 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
30 25 0:27 / /sys/fs/cgroup/devices rw,nosuid - cgroup cgroup rw,devices
31 25 0:28 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
";

    #[test]
    fn locates_hybrid() {
        let pc = "12:devices:/libpod_parent/libpod-abc\n4:memory:/libpod_parent/libpod-abc\n0::/libpod_parent/libpod-abc\n";
        let d = locate(pc, MI).unwrap();
        assert_eq!(
            d.v1.unwrap(),
            PathBuf::from("/sys/fs/cgroup/devices/libpod_parent/libpod-abc")
        );
        assert_eq!(
            d.v2.unwrap(),
            PathBuf::from("/sys/fs/cgroup/unified/libpod_parent/libpod-abc")
        );
    }

    #[test]
    fn refuses_root_and_traversal() {
        assert!(locate("0::/\n", MI).is_err());
        assert!(locate("0::/../../etc\n", MI).is_err());
        assert!(matches!(
            locate("0::/x\n", "").unwrap_err(),
            CgroupError::NoDeviceCgroup
        ));
    }

    #[test]
    fn majors() {
        let pd = "Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidia\n234 nvidia-uvm\n235 nvidia-caps\n\nBlock devices:\n  7 loop\n240 nvidia-fake-block\n";
        assert_eq!(gated_majors(pd, [195, 10]), vec![10, 195, 234, 235]);
    }

    proptest::proptest! {
        /// Whatever /proc/<pid>/cgroup says, a located cgroup stays under its mount point and
        /// never is the mount point itself.
        #[test]
        fn located_paths_stay_under_the_mount(path in "[a-z./]{0,30}", h in 0u32..13) {
            let pc = format!("{h}:devices:{path}\n0::{path}\n");
            if let Ok(d) = locate(&pc, MI) {
                for (p, root) in [(d.v1, "/sys/fs/cgroup/devices"), (d.v2, "/sys/fs/cgroup/unified")] {
                    if let Some(p) = p {
                        proptest::prop_assert!(p.starts_with(root) && p != Path::new(root));
                        proptest::prop_assert!(!p.components().any(|c| c == std::path::Component::ParentDir));
                    }
                }
            }
        }

        #[test]
        fn mountinfo_parsers_never_panic(text in "[ -~\n]{0,400}") {
            let _ = parse_cgroup_mounts(&text);
            let _ = crate::enter::mounts::shared_mounts_under(&text, Path::new("/r"));
            let _ = parse_proc_cgroup(&text);
        }
    }
}
