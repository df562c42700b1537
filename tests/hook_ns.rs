//! Root tests of the hook's kernel-facing parts without a container runtime: the v2 device
//! gate on a scratch cgroup, and device nodes + bind mounts applied into another mount
//! namespace (made with `unshare`), including the hostile-rootfs cases. Each attack case also
//! checks that no host file changed.

mod common;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use gpufence::cdi::{DeviceNodeEdit, MountEdit};
use gpufence::hook::apply;
use gpufence::plan::{CgroupRule, Plan};

use common::{digest, host_digest};

struct Ns {
    child: Child,
}

impl Ns {
    /// A process in a new, private mount namespace.
    fn new(propagation: &str) -> Ns {
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", propagation, "sleep", "120"])
            .spawn()
            .expect("unshare");
        let ns = Ns { child };
        let me = std::fs::read_link("/proc/self/ns/mnt").unwrap();
        for _ in 0..200 {
            if let Ok(l) = std::fs::read_link(format!("/proc/{}/ns/mnt", ns.child.id()))
                && l != me
            {
                return ns;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("unshare did not enter a new mount namespace");
    }
    fn fd(&self) -> OwnedFd {
        std::fs::File::open(format!("/proc/{}/ns/mnt", self.child.id()))
            .unwrap()
            .into()
    }
    /// Run a shell command inside the namespace.
    fn sh(&self, script: &str) -> (i32, String, String) {
        common::run(Command::new("nsenter").args([
            "-t",
            &self.child.id().to_string(),
            "-m",
            "/bin/sh",
            "-c",
            script,
        ]))
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Node {
    dir: PathBuf,
    rootfs: PathBuf,
    host_lib: PathBuf,
    host_preload: PathBuf,
    host_gpu0: PathBuf,
}

fn node(name: &str) -> Node {
    let dir = common::scratch(name);
    let rootfs = dir.join("rootfs");
    for d in ["dev", "etc", "usr/lib", "tmp"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    let drv = dir.join("driver/usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&drv).unwrap();
    let host_lib = drv.join("libcuda.so.580.65.06");
    std::fs::write(&host_lib, "LIBCUDA").unwrap();
    let host_preload = dir.join("state/ld.so.preload");
    std::fs::create_dir_all(host_preload.parent().unwrap()).unwrap();
    std::fs::write(&host_preload, "/usr/lib/gpufence/libgpufence.so\n").unwrap();
    let host_gpu0 = dir.join("devroot/nvidia0");
    std::fs::create_dir_all(host_gpu0.parent().unwrap()).unwrap();
    nix::sys::stat::mknod(
        &host_gpu0,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(195, 0),
    )
    .unwrap();
    Node {
        dir,
        rootfs,
        host_lib,
        host_preload,
        host_gpu0,
    }
}

fn plan_for(n: &Node, dev_path: &str) -> Plan {
    let ro = ["ro", "nosuid", "nodev", "bind"].map(String::from).to_vec();
    let mut p = Plan {
        container_id: "t".into(),
        ..Plan::default()
    };
    p.edits.device_nodes.push(DeviceNodeEdit {
        path: dev_path.into(),
        host_path: Some(n.host_gpu0.display().to_string()),
        kind: Some("c".into()),
        major: Some(195),
        minor: Some(0),
        file_mode: Some(0o666),
        ..Default::default()
    });
    p.edits.mounts.push(MountEdit {
        host_path: n.host_lib.display().to_string(),
        container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06".into(),
        kind: None,
        options: ro.clone(),
    });
    p.edits.mounts.push(MountEdit {
        host_path: n.host_preload.display().to_string(),
        container_path: "/etc/ld.so.preload".into(),
        kind: None,
        options: ro,
    });
    p.cgroup_rules.push(CgroupRule {
        kind: 'c',
        major: 195,
        minor: 0,
        access: "rw".into(),
    });
    p
}

fn apply_plan(ns: &Ns, n: &Node, plan: &Plan) -> Result<(), String> {
    let nodes = apply::node_specs(plan).map_err(|e| e.to_string())?;
    let mounts = apply::detach_mounts(plan).map_err(|e| e.to_string())?;
    let prepared = apply::Prepared {
        nodes,
        mounts,
        ldcache: None,
        userns_root: None,
    };
    apply::apply_in_namespace(
        apply::Namespace::Join(ns.fd()),
        &n.rootfs,
        prepared,
        "t",
        std::time::Duration::from_secs(10),
    )
    .map_err(|e| e.to_string())
}

fn host_mounts_under(p: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|m| Path::new(m).starts_with(p))
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn applies_nodes_and_readonly_mounts_inside_the_namespace_only() {
    if common::skip_unless(&["unshare", "nsenter"]) {
        return;
    }
    let n = node("hookns-ok");
    let ns = Ns::new("private");
    let before = digest(&n.dir.join("driver"));
    apply_plan(&ns, &n, &plan_for(&n, "/dev/nvidia0")).unwrap();
    let r = n.rootfs.display();
    let (code, out, err) = ns.sh(&format!(
        "cat {r}/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06; echo; cat {r}/etc/ld.so.preload; \
         stat -c '%F %t:%T %a' {r}/dev/nvidia0; \
         echo x > {r}/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06 && echo WRITABLE"
    ));
    assert_ne!(code, 0, "{out}{err}");
    assert!(out.contains("LIBCUDA"), "{out}");
    assert!(out.contains("/usr/lib/gpufence/libgpufence.so"), "{out}");
    assert!(out.contains("character special file c3:0 666"), "{out}");
    assert!(!out.contains("WRITABLE"), "{out}");
    assert!(err.contains("Read-only file system"), "{err}");
    // Host: no mount leaked, mount targets are empty placeholders, driver tree unchanged.
    assert!(host_mounts_under(&n.rootfs).is_empty());
    assert_eq!(
        std::fs::read(
            n.rootfs
                .join("usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06")
        )
        .unwrap(),
        b""
    );
    assert_eq!(before, digest(&n.dir.join("driver")));
}

#[test]
fn attack_lib_dir_symlink_to_root_is_confined() {
    if common::skip_unless(&["unshare", "nsenter"]) {
        return;
    }
    let n = node("hookns-libroot");
    std::os::unix::fs::symlink("/", n.rootfs.join("usr/lib/x86_64-linux-gnu")).unwrap();
    let ns = Ns::new("private");
    let host_etc = host_digest();
    let before = digest(&n.dir.join("driver"));
    apply_plan(&ns, &n, &plan_for(&n, "/dev/nvidia0")).unwrap();
    // The library landed at the rootfs's "/" (where the symlink points inside the container).
    let (_, out, _) = ns.sh(&format!("cat {}/libcuda.so.580.65.06", n.rootfs.display()));
    assert_eq!(out, "LIBCUDA");
    assert!(!Path::new("/libcuda.so.580.65.06").exists());
    assert_eq!(host_etc, host_digest());
    assert_eq!(before, digest(&n.dir.join("driver")));
    assert!(host_mounts_under(Path::new("/libcuda.so.580.65.06")).is_empty());
}

/// A driver file's target symlinked (inside the image) to `/etc/ld.so.preload` — the image
/// trick that made runc bind libcuda over the preload in runtime mode — must not cover the
/// preload in hook mode either, whatever order the mounts come in: hook mode replaces a
/// symlink at a mount target instead of following it, and attaches in the plan's order
/// (enforcement mounts last) as defence in depth.
#[test]
fn attack_driver_target_symlinked_onto_the_preload_does_not_cover_it() {
    if common::skip_unless(&["unshare", "nsenter"]) {
        return;
    }
    let n = node("hookns-cover");
    let libdir = n.rootfs.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&libdir).unwrap();
    std::os::unix::fs::symlink("/etc/ld.so.preload", libdir.join("libcuda.so.580.65.06")).unwrap();
    let ns = Ns::new("private");
    let host_etc = host_digest();
    // The plan as gpufence orders it (driver files first, the preload last).
    let mut plan = plan_for(&n, "/dev/nvidia0");
    plan.edits
        .mounts
        .sort_by_key(|m| gpufence::plan::mount_order(&m.container_path));
    assert_eq!(
        plan.edits.mounts.last().unwrap().container_path,
        "/etc/ld.so.preload"
    );
    // Applied with the preload listed first, too: hook mode orders the mounts itself.
    plan.edits.mounts.reverse();
    apply_plan(&ns, &n, &plan).unwrap();
    let (_, out, _) = ns.sh(&format!("cat {}/etc/ld.so.preload", n.rootfs.display()));
    assert_eq!(
        out, "/usr/lib/gpufence/libgpufence.so\n",
        "the shim is preloaded"
    );
    assert_eq!(host_etc, host_digest());
}

/// A directory mount (a foreign CDI device's, here) whose target is redirected by an image
/// symlink in a PARENT component (`/opt/vendor/conf -> /`, mount at `/opt/vendor/conf/etc`)
/// lands on `/etc`: attached after the preload it hid `/etc/ld.so.preload` (no shim, no quota).
/// In the plan's order (enforcement mounts last) the preload goes on top of it — here `/etc` is
/// then a read-only mount, so the hook fails closed instead.
#[test]
fn attack_parent_symlink_redirecting_a_directory_mount_onto_etc() {
    if common::skip_unless(&["unshare", "nsenter"]) {
        return;
    }
    let n = node("hookns-etc");
    let vendor = n.dir.join("vendor-etc");
    std::fs::create_dir_all(&vendor).unwrap();
    std::fs::write(vendor.join("vendor.conf"), "VENDOR").unwrap();
    std::fs::create_dir_all(n.rootfs.join("opt/vendor")).unwrap();
    std::os::unix::fs::symlink("/", n.rootfs.join("opt/vendor/conf")).unwrap();
    let ns = Ns::new("private");
    let host_etc = host_digest();
    let mut plan = plan_for(&n, "/dev/nvidia0");
    plan.edits.mounts.push(MountEdit {
        host_path: vendor.display().to_string(),
        container_path: "/opt/vendor/conf/etc".into(),
        kind: None,
        options: ["ro", "nosuid", "nodev", "bind"].map(String::from).to_vec(),
    });
    match apply_plan(&ns, &n, &plan) {
        Err(e) => assert!(
            e.contains("ld.so.preload"),
            "fails closed on the preload: {e}"
        ),
        Ok(()) => {
            let (_, out, err) = ns.sh(&format!("cat {}/etc/ld.so.preload", n.rootfs.display()));
            assert_eq!(
                out, "/usr/lib/gpufence/libgpufence.so\n",
                "preload hidden: {err}"
            );
        }
    }
    assert_eq!(host_etc, host_digest());
}

#[test]
fn attack_preload_symlink_to_host_file_is_replaced_in_rootfs() {
    if common::skip_unless(&["unshare", "nsenter"]) {
        return;
    }
    let n = node("hookns-preload");
    let victim = n.dir.join("victim");
    std::fs::write(&victim, "HOST SECRET").unwrap();
    std::os::unix::fs::symlink(&victim, n.rootfs.join("etc/ld.so.preload")).unwrap();
    let ns = Ns::new("private");
    let before = digest(&victim);
    apply_plan(&ns, &n, &plan_for(&n, "/dev/nvidia0")).unwrap();
    assert_eq!(before, digest(&victim));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "HOST SECRET");
    let (_, out, _) = ns.sh(&format!("cat {}/etc/ld.so.preload", n.rootfs.display()));
    assert!(out.contains("libgpufence.so"), "{out}");
}

#[test]
fn attack_dev_symlink_to_host_dir_never_writes_there() {
    if common::skip_unless(&["unshare", "nsenter"]) {
        return;
    }
    let n = node("hookns-dev");
    let hostdir = n.dir.join("hostdev");
    std::fs::create_dir_all(&hostdir).unwrap();
    std::fs::remove_dir(n.rootfs.join("dev")).unwrap();
    std::os::unix::fs::symlink(&hostdir, n.rootfs.join("dev")).unwrap();
    let ns = Ns::new("private");
    let before = digest(&hostdir);
    let r = apply_plan(&ns, &n, &plan_for(&n, "/dev/nvidia0"));
    // The symlink's target does not exist inside the rootfs: refused.
    assert!(r.is_err(), "{r:?}");
    assert_eq!(before, digest(&hostdir));
    // When it exists inside the rootfs (runc creates it when mounting /dev), the node lands
    // there, still not in the host directory.
    let inner = n.rootfs.join(hostdir.strip_prefix("/").unwrap());
    std::fs::create_dir_all(&inner).unwrap();
    apply_plan(&ns, &n, &plan_for(&n, "/dev/nvidia0")).unwrap();
    assert_eq!(before, digest(&hostdir));
    let (_, out, _) = ns.sh(&format!("stat -c '%t:%T' {}/nvidia0", inner.display()));
    assert_eq!(out.trim(), "c3:0");
}

#[test]
fn attack_dotdot_device_path_refused_before_anything() {
    if common::skip_unless(&["unshare", "nsenter"]) {
        return;
    }
    let n = node("hookns-dotdot");
    let ns = Ns::new("private");
    let before = digest(&n.dir);
    for p in [
        "/dev/../etc/nvidia0",
        "/dev/../../../../tmp/x",
        "dev/nvidia0",
        "/etc/nvidia0",
    ] {
        let e = apply_plan(&ns, &n, &plan_for(&n, p)).unwrap_err();
        assert!(
            e.contains("component") || e.contains("under /dev") || e.contains("absolute"),
            "{e}"
        );
    }
    assert_eq!(before, digest(&n.dir));
}

#[test]
fn shared_rootfs_propagation_is_refused() {
    if common::skip_unless(&["unshare", "nsenter"]) {
        return;
    }
    let n = node("hookns-shared");
    // Make the rootfs a shared mount in the host namespace, so the child's copy is its peer.
    let r = n.rootfs.display().to_string();
    assert!(
        Command::new("mount")
            .args(["--bind", &r, &r])
            .status()
            .unwrap()
            .success()
    );
    assert!(
        Command::new("mount")
            .args(["--make-shared", &r])
            .status()
            .unwrap()
            .success()
    );
    let ns = Ns::new("unchanged");
    let result = apply_plan(&ns, &n, &plan_for(&n, "/dev/nvidia0"));
    drop(ns);
    // Undo the host-side shared bind mount whatever happened (also any propagated mounts).
    let _ = Command::new("umount").args(["-R", "-l", &r]).status();
    let e = result.unwrap_err();
    assert!(e.contains("propagate"), "{e}");
    assert!(host_mounts_under(&n.rootfs).is_empty());
}

#[test]
fn v2_gate_alone_denies_ungranted_gpu_and_allows_granted() {
    if common::skip_unless(&["sh"]) {
        return;
    }
    let unified = Path::new("/sys/fs/cgroup/unified");
    let v2 = if unified.join("cgroup.procs").exists() {
        unified.to_path_buf()
    } else {
        PathBuf::from("/sys/fs/cgroup")
    };
    let n = node("hookns-bpf");
    let gpu1 = n.dir.join("devroot/nvidia1");
    nix::sys::stat::mknod(
        &gpu1,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(195, 1),
    )
    .unwrap();
    let cg = v2.join(format!("gpufence-test-{}", std::process::id()));
    std::fs::create_dir_all(&cg).unwrap();
    let rules = [CgroupRule {
        kind: 'c',
        major: 195,
        minor: 0,
        access: "rw".into(),
    }];
    gpufence::cgroup::gate_v2(&cg, &rules, &[195]).unwrap();
    let script = format!(
        "echo $$ > {}/cgroup.procs; cat {} ; cat {}; cat /dev/null && echo NULL-OK",
        cg.display(),
        n.host_gpu0.display(),
        gpu1.display()
    );
    let (_, out, err) = common::run(Command::new("sh").args(["-c", &script]));
    let _ = std::fs::remove_dir(&cg);
    // This process sits in the v1 root devices cgroup (allows everything): only the gate acts.
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].contains("No such device or address"), "{err}");
    assert!(lines[1].contains("Operation not permitted"), "{err}");
    assert!(out.contains("NULL-OK"), "{out}");
}

/// Pure cgroup v2 hosts: the runtime's own device program denies what `config.json` did not
/// list. The hook widens that program (re-loaded with an allow prefix for the granted nodes,
/// attached with BPF_F_REPLACE) before adding its gate.
#[test]
fn v2_runtime_program_is_widened_for_granted_nodes_only() {
    if common::skip_unless(&["sh"]) {
        return;
    }
    use gpufence::cgroup::bpf;
    let unified = Path::new("/sys/fs/cgroup/unified");
    let v2 = if unified.join("cgroup.procs").exists() {
        unified.to_path_buf()
    } else {
        PathBuf::from("/sys/fs/cgroup")
    };
    let n = node("hookns-widen");
    let gpu1 = n.dir.join("devroot/nvidia1");
    nix::sys::stat::mknod(
        &gpu1,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(195, 1),
    )
    .unwrap();
    let cg = v2.join(format!("gpufence-widen-{}", std::process::id()));
    std::fs::create_dir_all(&cg).unwrap();
    let cg_fd: OwnedFd = std::fs::File::open(&cg).unwrap().into();
    // The "runtime's" program: every GPU-class access denied.
    let runtime = bpf::load(&gpufence::cgroup::program::build_program(&[], &[195])).unwrap();
    bpf::attach(&runtime, &cg_fd, "test").unwrap();
    let probe = |cg: &Path| {
        let script = format!(
            "echo $$ > {}/cgroup.procs; cat {} ; cat {}",
            cg.display(),
            n.host_gpu0.display(),
            gpu1.display()
        );
        common::run(Command::new("sh").args(["-c", &script])).2
    };
    let err = probe(&cg);
    assert_eq!(err.matches("Operation not permitted").count(), 2, "{err}");
    let rules = [CgroupRule {
        kind: 'c',
        major: 195,
        minor: 0,
        access: "rw".into(),
    }];
    let widened = gpufence::cgroup::gate_v2(&cg, &rules, &[195]).unwrap();
    assert_eq!(widened, 1);
    let err = probe(&cg);
    let _ = std::fs::remove_dir(&cg);
    let lines: Vec<&str> = err.lines().collect();
    assert!(lines[0].contains("No such device or address"), "{err}");
    assert!(lines[1].contains("Operation not permitted"), "{err}");
}
