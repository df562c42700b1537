//! The after-the-fact fence: a container that reached a GPU while gpufence was not consulted
//! (NRI dropped the plugin on a timeout, a crash, a runtime restart before it reconnected) is
//! found at the next Synchronize or container event and fenced, or stopped.
//!
//! What "unfenced" means here: the container can open a GPU-class character device (a device
//! node in its spec or a device-cgroup allow rule of a GPU major: the inventory's GPU, MIG and
//! control nodes, 195, and every `nvidia*` major of `/proc/devices`) and either gpufence holds
//! no state for it, or it reaches a node its record's devices do not account for.
//!
//! What is done about one ([`super::handler::PlanHandler`]):
//! 1. NRI's `UpdateContainers` with a device-cgroup update denying the GPU majors
//!    ([`deny_update`]);
//! 2. the container's v1 devices cgroup is read back ([`v1_allows`]): neither containerd 2.3.4
//!    (its NRI update goes through CRI's `LinuxContainerResources`, which has no devices) nor
//!    `runc update` 1.5.1 (it reads no device rules) applies that update, and cgroup v2 has no
//!    list to read back;
//! 3. so where the denial is not in force the container is evicted: NRI v0.12.0 relays no
//!    eviction from `UpdateContainers` (only from CreateContainer/UpdateContainer answers, which
//!    carry no other container's), so the plugin stops the container's processes itself with
//!    SIGKILL ([`kill_container`]), each checked through a pidfd to still be in the container's
//!    cgroup. The runtime sees the container exit; kubelet creates it again, through gpufence.
//!
//! Pure but for [`v1_allows_live`] and [`kill_container`].

use std::collections::BTreeSet;

use super::api::{
    Container, ContainerUpdate, LinuxContainerUpdate, LinuxDeviceCgroup, LinuxResources,
    OptionalInt64,
};

/// One way a container reaches a GPU-class device: `major`, and `minor` (`None`: any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reach {
    pub major: u32,
    pub minor: Option<u32>,
    /// What gives it: `device node /dev/nvidia1 (195:1)`, `cgroup rule c 195:* rw`.
    pub via: String,
}

/// Every way `ctr` reaches a device of one of `majors`: its spec's character device nodes,
/// then what its device-cgroup rules (in order, as runc applies them) leave allowed for reading
/// or writing.
pub fn gpu_reach(ctr: &Container, majors: &[u32]) -> Vec<Reach> {
    let Some(linux) = &ctr.linux else {
        return Vec::new();
    };
    let mut out: Vec<Reach> = linux
        .devices
        .iter()
        .filter(|d| d.r#type == "c")
        .filter_map(|d| {
            let (major, minor) = (u32::try_from(d.major).ok()?, u32::try_from(d.minor).ok()?);
            majors.contains(&major).then(|| Reach {
                major,
                minor: Some(minor),
                via: format!("device node {} ({major}:{minor})", d.path),
            })
        })
        .collect();
    let rules = linux
        .resources
        .as_ref()
        .map_or(&[][..], |r| r.devices.as_slice());
    for &m in majors {
        out.extend(rule_reach(rules, m));
    }
    out
}

/// What `rules` leave allowed of major `m`: a wildcard minor, or the minors allowed one by one.
fn rule_reach(rules: &[LinuxDeviceCgroup], m: u32) -> Vec<Reach> {
    let num = |o: &Option<OptionalInt64>| o.as_ref().map(|v| v.value).filter(|v| *v >= 0);
    // (access of the wildcard rule in force, minors allowed since)
    let mut wild: Option<String> = None;
    let mut minors: Vec<(u32, String)> = Vec::new();
    for r in rules {
        if !matches!(r.r#type.as_str(), "" | "a" | "c") {
            continue;
        }
        let major = num(&r.major);
        if major.is_some_and(|v| v != i64::from(m)) {
            continue;
        }
        let opens = r.access.is_empty() || r.access.contains(['r', 'w']);
        let denies_open = r.access.is_empty() || (r.access.contains('r') && r.access.contains('w'));
        let access = if r.access.is_empty() {
            "rwm".to_string()
        } else {
            r.access.clone()
        };
        match (num(&r.minor), r.allow) {
            (None, true) if opens && major.is_none() && r.r#type != "c" => {
                wild = Some(format!("a *:* {access}"));
                minors.clear();
            }
            (None, true) if opens => {
                wild = Some(format!("c {m}:* {access}"));
                minors.clear();
            }
            (None, false) if denies_open => {
                wild = None;
                minors.clear();
            }
            (Some(n), true) if opens => {
                if let Ok(n) = u32::try_from(n) {
                    minors.retain(|(x, _)| *x != n);
                    minors.push((n, access));
                }
            }
            (Some(n), false) if denies_open => minors.retain(|(x, _)| i64::from(*x) != n),
            _ => {}
        }
    }
    match wild {
        Some(rule) => vec![Reach {
            major: m,
            minor: None,
            via: format!("cgroup rule {rule}"),
        }],
        None => minors
            .into_iter()
            .map(|(n, a)| Reach {
                major: m,
                minor: Some(n),
                via: format!("cgroup rule c {m}:{n} {a}"),
            })
            .collect(),
    }
}

/// Why the container is unfenced, or `None` when its fence holds: `granted` is the set of
/// (major, minor) its gpufence record accounts for, or why there is none.
pub fn unfenced(reach: &[Reach], granted: Result<&BTreeSet<(u32, u32)>, &str>) -> Option<String> {
    let first = reach.first()?;
    match granted {
        Err(why) => Some(format!("{}: {why}", first.via)),
        Ok(set) => reach
            .iter()
            .find(|r| r.minor.is_none_or(|n| !set.contains(&(r.major, n))))
            .map(|r| format!("{}: beyond what its gpufence record grants", r.via)),
    }
}

/// NRI's update denying every access to `majors` for container `id`. A failure is ignored by
/// the runtime (NRI would otherwise fail the whole call; gpufence reads the cgroup back).
pub fn deny_update(id: &str, majors: &[u32]) -> ContainerUpdate {
    let devices = majors
        .iter()
        .map(|&m| LinuxDeviceCgroup {
            allow: false,
            r#type: "c".into(),
            major: Some(OptionalInt64 {
                value: i64::from(m),
            }),
            minor: None,
            access: "rwm".into(),
        })
        .collect();
    ContainerUpdate {
        container_id: id.to_string(),
        linux: Some(LinuxContainerUpdate {
            resources: Some(LinuxResources {
                devices,
                ..Default::default()
            }),
        }),
        ignore_failure: true,
    }
}

/// The first line of a v1 `devices.list` that still allows opening a device of `majors`
/// (`a *:* rwm`, `c 195:* rw`, `c 195:1 rw`), or `None`: they are denied.
pub fn v1_allows(devices_list: &str, majors: &[u32]) -> Option<String> {
    devices_list
        .lines()
        .find(|l| {
            let mut f = l.split_whitespace();
            let (Some(kind), Some(num), Some(access)) = (f.next(), f.next(), f.next()) else {
                return false;
            };
            let major = num.split(':').next().unwrap_or("");
            matches!(kind, "a" | "c")
                && access.contains(['r', 'w'])
                && (major == "*" || major.parse().is_ok_and(|m: u32| majors.contains(&m)))
        })
        .map(|l| l.trim().to_string())
}

/// The container's cgroup directories, from its init's `/proc/<pid>/cgroup`.
fn cgroups_of(pid: u32) -> Result<crate::cgroup::DeviceCgroups, String> {
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| format!("/proc/{pid}/cgroup: {e}"))?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    crate::cgroup::locate(&own, &mountinfo).map_err(|e| e.to_string())
}

/// Whether the live v1 devices cgroup of the container whose init is `pid` still allows a GPU
/// major: `Ok(Some(line))` it does, `Ok(None)` denied, `Err` unknown (cgroup v2, no pid).
pub fn v1_allows_live(pid: u32, majors: &[u32]) -> Result<Option<String>, String> {
    let dir = cgroups_of(pid)?
        .v1
        .ok_or("no v1 devices cgroup to read back (cgroup v2)")?;
    let list = std::fs::read_to_string(dir.join("devices.list"))
        .map_err(|e| format!("{}/devices.list: {e}", dir.display()))?;
    Ok(v1_allows(&list, majors))
}

/// Whether `/proc/<pid>/cgroup` names a cgroup of container `id` (containerd's `…/<id>`,
/// `cri-containerd-<id>.scope`, CRI-O's `crio-<id>`: the id is a path component's tail).
fn in_container(proc_cgroup: &str, id: &str) -> bool {
    proc_cgroup.lines().any(|l| {
        l.splitn(3, ':').nth(2).is_some_and(|p| {
            p.split('/')
                .any(|c| c.trim_end_matches(".scope").ends_with(id))
        })
    })
}

/// SIGKILL every process of container `id` whose init is `pid`: the init and whatever its
/// cgroup lists, each opened as a pidfd and checked to be in the container's cgroup before the
/// signal (a pid reused meanwhile is left alone). The number of processes signalled.
pub fn kill_container(pid: u32, id: &str) -> Result<usize, String> {
    if pid <= 1 || !crate::text::valid_container_id(id) {
        return Err(format!("no process to stop (pid {pid})"));
    }
    let mut pids = vec![pid];
    if let Ok(cg) = cgroups_of(pid)
        && let Some(dir) = cg.v1.or(cg.v2)
        && let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs"))
    {
        pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    pids.sort_unstable();
    pids.dedup();
    let mut killed = 0;
    let mut last_err = None;
    for p in pids {
        match kill_checked(p, id) {
            Ok(true) => killed += 1,
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
    }
    match (killed, last_err) {
        (0, Some(e)) => Err(e),
        (0, None) => Err(format!("pid {pid} is no longer in container {id}")),
        (n, _) => Ok(n),
    }
}

/// SIGKILL `pid` through a pidfd if it is (still) in container `id`'s cgroup.
fn kill_checked(pid: u32, id: &str) -> Result<bool, String> {
    let raw = libc::pid_t::try_from(pid).map_err(|_| format!("pid {pid} out of range"))?;
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ESRCH) {
            Ok(false)
        } else {
            Err(format!("pidfd_open({pid}): {e}"))
        };
    }
    let fd = i32::try_from(fd).map_err(|_| format!("pidfd_open({pid}): bad descriptor"))?;
    // SAFETY: fd is the new descriptor pidfd_open just returned; OwnedFd closes it once.
    let pidfd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // The pidfd pins this process: read after opening it, /proc/<pid> is the same process.
    let Ok(cg) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return Ok(false);
    };
    if !in_container(&cg, id) {
        return Ok(false);
    }
    let raw_fd = std::os::fd::AsRawFd::as_raw_fd(&pidfd);
    // SAFETY: pidfd_send_signal(2) on a live pidfd with no siginfo (null) and no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            raw_fd,
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r == 0 {
        Ok(true)
    } else {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ESRCH) {
            Ok(false)
        } else {
            Err(format!("pidfd_send_signal({pid}, SIGKILL): {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LinuxContainer, LinuxDevice};

    fn rule(
        allow: bool,
        kind: &str,
        major: Option<i64>,
        minor: Option<i64>,
        access: &str,
    ) -> LinuxDeviceCgroup {
        LinuxDeviceCgroup {
            allow,
            r#type: kind.into(),
            major: major.map(|value| OptionalInt64 { value }),
            minor: minor.map(|value| OptionalInt64 { value }),
            access: access.into(),
        }
    }

    fn ctr(devices: &[(&str, i64, i64)], rules: Vec<LinuxDeviceCgroup>) -> Container {
        Container {
            id: "c1".into(),
            linux: Some(LinuxContainer {
                devices: devices
                    .iter()
                    .map(|(p, ma, mi)| LinuxDevice {
                        path: p.to_string(),
                        r#type: "c".into(),
                        major: *ma,
                        minor: *mi,
                        ..Default::default()
                    })
                    .collect(),
                resources: Some(LinuxResources {
                    devices: rules,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// containerd's default rules: deny everything, then the standard character devices.
    fn defaults() -> Vec<LinuxDeviceCgroup> {
        vec![
            rule(false, "", None, None, "rwm"),
            rule(true, "c", Some(1), Some(3), "rwm"),
            rule(true, "c", Some(136), None, "rwm"),
        ]
    }

    #[test]
    fn a_plain_container_reaches_no_gpu() {
        assert_eq!(
            gpu_reach(&ctr(&[("/dev/null", 1, 3)], defaults()), &[195, 507]),
            []
        );
        assert_eq!(gpu_reach(&Container::default(), &[195]), []);
    }

    #[test]
    fn device_nodes_and_rules_that_reach_a_gpu_are_found() {
        // kubelet's device (CRI `devices`): a node and its allow rule.
        let mut rules = defaults();
        rules.push(rule(true, "c", Some(195), Some(1), "rw"));
        let r = gpu_reach(&ctr(&[("/dev/nvidia1", 195, 1)], rules), &[195, 507]);
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[0].via, "device node /dev/nvidia1 (195:1)");
        assert_eq!((r[1].major, r[1].minor), (195, Some(1)));
        // Privileged: allow everything.
        let r = gpu_reach(
            &ctr(&[], vec![rule(true, "a", None, None, "rwm")]),
            &[195, 507],
        );
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[0].via, "cgroup rule a *:* rwm");
        assert_eq!(r[1].minor, None);
        // A major wildcard of type c, then one minor denied: still the wildcard (other minors).
        let rules = vec![
            rule(true, "c", Some(195), None, "rw"),
            rule(false, "c", Some(195), Some(0), "rwm"),
        ];
        assert_eq!(
            gpu_reach(&ctr(&[], rules), &[195])[0].via,
            "cgroup rule c 195:* rw"
        );
        // Allowed, then denied: nothing; mknod alone opens nothing.
        let rules = vec![
            rule(true, "c", Some(195), Some(1), "rw"),
            rule(false, "c", Some(195), None, "rwm"),
            rule(true, "c", Some(195), Some(2), "m"),
        ];
        assert_eq!(gpu_reach(&ctr(&[], rules), &[195]), []);
    }

    #[test]
    fn unfenced_without_state_or_beyond_the_record() {
        let reach = gpu_reach(&ctr(&[("/dev/nvidia1", 195, 1)], defaults()), &[195]);
        let why = unfenced(&reach, Err("no gpufence state")).unwrap();
        assert_eq!(why, "device node /dev/nvidia1 (195:1): no gpufence state");
        let granted: BTreeSet<(u32, u32)> = [(195, 1), (195, 255)].into();
        assert_eq!(unfenced(&reach, Ok(&granted)), None);
        let other: BTreeSet<(u32, u32)> = [(195, 0), (195, 255)].into();
        assert!(unfenced(&reach, Ok(&other)).unwrap().contains("beyond"));
        let wild = gpu_reach(
            &ctr(&[], vec![rule(true, "c", Some(195), None, "rw")]),
            &[195],
        );
        assert!(unfenced(&wild, Ok(&granted)).is_some());
        assert_eq!(unfenced(&[], Err("no gpufence state")), None);
    }

    #[test]
    fn the_update_denies_each_major_and_tolerates_failure() {
        let u = deny_update("c1", &[195, 507]);
        assert!(u.ignore_failure);
        let d = &u.linux.unwrap().resources.unwrap().devices;
        assert_eq!(d.len(), 2);
        assert!(
            d.iter()
                .all(|r| !r.allow && r.access == "rwm" && r.minor.is_none())
        );
        assert_eq!(d[1].major.as_ref().unwrap().value, 507);
    }

    #[test]
    fn devices_list_read_back() {
        assert_eq!(
            v1_allows("a *:* rwm\n", &[195]).as_deref(),
            Some("a *:* rwm")
        );
        let list = "c 1:3 rwm\nc 136:* rwm\nc 195:1 rw\n";
        assert_eq!(v1_allows(list, &[195]).as_deref(), Some("c 195:1 rw"));
        assert_eq!(v1_allows(list, &[507]), None);
        assert_eq!(v1_allows("c 195:1 m\nc *:* m\n", &[195]), None);
        assert_eq!(v1_allows("", &[195]), None);
    }

    #[test]
    fn a_process_is_in_the_container_by_its_cgroup_path() {
        let id = "0123456789abcdef";
        assert!(in_container(&format!("4:devices:/k8s.io/{id}\n"), id));
        assert!(in_container(
            &format!("0::/kubepods.slice/cri-containerd-{id}.scope\n"),
            id
        ));
        assert!(in_container(&format!("0::/pod/crio-{id}\n"), id));
        assert!(!in_container(&format!("0::/k8s.io/{id}x\n"), id));
        assert!(!in_container("0::/user.slice\n", id));
        // Never a process outside a container, nor a bad id.
        assert!(kill_container(1, id).is_err());
        assert!(kill_container(std::process::id(), "../x").is_err());
        assert!(kill_container(std::process::id(), id).is_err());
    }
}
