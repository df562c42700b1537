//! The container's device cgroup: v1 `devices.allow`, v2 device BPF program.
//!
//! Cgroup paths come from `/proc/<pid>/cgroup` of the container's init (read from the host's
//! cgroup namespace) and mount points from the host's `/proc/self/mountinfo`. Both trees are
//! handled when both exist (hybrid hosts: runc enforces devices on v1 and also places the
//! container in the unified hierarchy).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

pub mod bpf;
pub mod program;
pub mod sys;

use crate::plan::CgroupRule;
use program::Grant;
use sys::{CgroupSys, LinuxSys};

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

fn open_dir(sys: &dyn CgroupSys, p: &Path) -> Result<OwnedFd, CgroupError> {
    sys.open_cgroup(p).map_err(|errno| CgroupError::Open {
        path: p.display().to_string(),
        errno,
    })
}

/// Write allow rules to a v1 devices cgroup.
pub fn allow_v1(dir: &Path, rules: &[CgroupRule]) -> Result<(), CgroupError> {
    allow_v1_with(&LinuxSys, dir, rules)
}

/// [`allow_v1`] through `sys`: one rule per `write(2)` (the kernel parses one rule per write).
pub fn allow_v1_with(
    sys: &dyn CgroupSys,
    dir: &Path,
    rules: &[CgroupRule],
) -> Result<(), CgroupError> {
    let dfd = open_dir(sys, dir)?;
    let path = dir.join("devices.allow");
    for r in rules {
        let line = r.to_string();
        sys.write_cgroup(&dfd, "devices.allow", &line)
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
    gate_v2_with(&LinuxSys, dir, rules, gated_majors)
}

/// [`gate_v2`] through `sys`.
pub fn gate_v2_with(
    sys: &dyn CgroupSys,
    dir: &Path,
    rules: &[CgroupRule],
    gated_majors: &[u32],
) -> Result<usize, CgroupError> {
    let dfd = open_dir(sys, dir)?;
    let shown = dir.display().to_string();
    let grants: Vec<Grant> = rules.iter().filter_map(Grant::from_rule).collect();
    let before = sys.bpf_query(&dfd).map_err(|source| bpf::BpfError::Query {
        cgroup: shown.clone(),
        source,
    })?;
    let widened = widen_attached(sys, &dfd, &shown, &before, &grants)?;
    let prog = program::build_program(&grants, gated_majors);
    let pfd = sys.bpf_load(&prog)?;
    sys.bpf_attach(&pfd, &dfd, None)
        .map_err(|source| bpf::BpfError::Attach {
            cgroup: shown,
            source,
        })?;
    Ok(widened)
}

/// Replace every device program already attached to the cgroup (the runtime's, which on a
/// pure cgroup v2 host denies whatever `config.json` did not list) by the same program
/// preceded by an allow for the granted nodes. Returns how many were replaced. Fails closed:
/// a program that cannot be read back or re-loaded is an error.
fn widen_attached(
    sys: &dyn CgroupSys,
    cgroup_fd: &OwnedFd,
    cgroup: &str,
    ids: &[u32],
    grants: &[Grant],
) -> Result<usize, bpf::BpfError> {
    let attach_err = |source| bpf::BpfError::Attach {
        cgroup: cgroup.to_string(),
        source,
    };
    let mut n = 0;
    for id in ids {
        let (old, insns) = sys.bpf_program(*id).map_err(attach_err)?;
        if !program::reloadable(&insns) {
            return Err(attach_err(std::io::Error::other(format!(
                "device program {id} uses instructions that cannot be re-loaded"
            ))));
        }
        let new = sys.bpf_load(&program::widen(&insns, grants))?;
        sys.bpf_attach(&new, cgroup_fd, Some(&old))
            .map_err(attach_err)?;
        n += 1;
    }
    Ok(n)
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

    fn rule(minor: u32) -> CgroupRule {
        CgroupRule {
            kind: 'c',
            major: 195,
            minor,
            access: "rw".into(),
        }
    }

    #[test]
    fn v1_writes_one_rule_per_write_in_plan_order() {
        use sys::{Call, RecordingSys};
        let sys = RecordingSys::new();
        let dir = Path::new("/sys/fs/cgroup/devices/c1");
        allow_v1_with(&sys, dir, &[rule(1), rule(255)]).unwrap();
        assert_eq!(
            sys.calls(),
            vec![
                Call::OpenCgroup(dir.to_path_buf()),
                Call::WriteCgroup {
                    file: "devices.allow".into(),
                    line: "c 195:1 rw".into()
                },
                Call::WriteCgroup {
                    file: "devices.allow".into(),
                    line: "c 195:255 rw".into()
                },
            ]
        );
    }

    #[test]
    fn v1_stops_at_the_first_refused_rule() {
        use sys::{Call, RecordingSys};
        let refused = Call::WriteCgroup {
            file: "devices.allow".into(),
            line: "c 195:1 rw".into(),
        };
        let sys = RecordingSys::new().failing(refused.clone());
        let e = allow_v1_with(&sys, Path::new("/cg"), &[rule(1), rule(2)]).unwrap_err();
        assert!(e.to_string().contains("c 195:1 rw"), "{e}");
        assert_eq!(sys.calls().last(), Some(&refused));
    }

    #[test]
    fn v2_widens_every_runtime_program_before_attaching_the_gate() {
        use sys::{Call, RecordingSys};
        let runtime = program::build_program(&[], &[195]);
        let sys =
            RecordingSys::new().with_programs(vec![(7, runtime.clone()), (9, runtime.clone())]);
        let n = gate_v2_with(&sys, Path::new("/cg"), &[rule(0)], &[195]).unwrap();
        assert_eq!(n, 2);
        let widened = program::widen(&runtime, &[Grant::from_rule(&rule(0)).unwrap()]).len();
        let gate = program::build_program(&[Grant::from_rule(&rule(0)).unwrap()], &[195]).len();
        assert_eq!(
            sys.calls(),
            vec![
                Call::OpenCgroup("/cg".into()),
                Call::BpfQuery,
                Call::BpfProgram(7),
                Call::BpfLoad { insns: widened },
                Call::BpfAttach { replace: true },
                Call::BpfProgram(9),
                Call::BpfLoad { insns: widened },
                Call::BpfAttach { replace: true },
                Call::BpfLoad { insns: gate },
                Call::BpfAttach { replace: false },
            ]
        );
    }

    #[test]
    fn v2_fails_closed_when_a_runtime_program_cannot_be_widened() {
        use sys::{Call, RecordingSys};
        // A helper call (0x85) cannot be re-loaded from its translated form.
        let odd = vec![
            program::insn(0x85, 0, 0, 0, 1),
            program::insn(0x95, 0, 0, 0, 0),
        ];
        let sys = RecordingSys::new().with_programs(vec![(3, odd)]);
        let e = gate_v2_with(&sys, Path::new("/cg"), &[rule(0)], &[195]).unwrap_err();
        assert!(e.to_string().contains("cannot be re-loaded"), "{e}");
        // Nothing was loaded or attached: the gate is not put in front of an unwidened program.
        assert!(
            !sys.calls()
                .iter()
                .any(|c| matches!(c, Call::BpfLoad { .. } | Call::BpfAttach { .. }))
        );
    }

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
