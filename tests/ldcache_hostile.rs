//! Issue 15 items 1, 2 (the ld cache part) and 3, through real runc containers created by
//! gpufence-runtime and through `gpufence hook update-ldcache` (the createContainer hook of CDI
//! specs): an image's `/etc/ld.so.cache~` as a block device of a host disk, `/etc/ld.so.conf`
//! as `c 1:5` or as a FIFO, `<libdir>/glibc-hwcaps` as a symlink to a host directory. Each
//! container must work (the driver tool finds its libraries through the cache) within
//! seconds, and the host must be untouched: the disk's bytes, the host files, no host name
//! in the container's cache. With the `ldconfig`-based refresh these overwrote the disk, grew
//! ldconfig to gigabytes, hung the create forever, and listed the host directory.

mod common;
mod runtime_support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use runtime_support::{bundle, node, unique_id};

const DEADLINE: Duration = Duration::from_secs(30);

/// Run `cmd` (stdin `input`) with a deadline; killed (and reported as code -9) past it.
fn run_with_deadline(cmd: &mut Command, input: &[u8]) -> (i32, String, String, Duration) {
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(input);
    loop {
        if let Some(_st) = child.try_wait().unwrap() {
            break;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-9),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        start.elapsed(),
    )
}

fn set_runtime(n: &runtime_support::Node, path: &str) {
    let mut doc: toml_edit::DocumentMut =
        std::fs::read_to_string(&n.config).unwrap().parse().unwrap();
    doc["runtime"]["path"] = toml_edit::value(path);
    std::fs::write(&n.config, doc.to_string()).unwrap();
}

/// (container path, host path) of the driver library mounts gpufence plans for the bundle.
fn library_mounts(spec: &serde_json::Value) -> Vec<(String, String)> {
    spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| Some((m["destination"].as_str()?, m["source"].as_str()?)))
        .filter(|(d, _)| {
            d.contains(".so") && !d.starts_with("/etc/") && !d.starts_with("/usr/lib/gpufence/")
        })
        .map(|(d, s)| (d.to_string(), s.to_string()))
        .collect()
}

struct Case {
    scratch: PathBuf,
    node: runtime_support::Node,
    bundle: PathBuf,
    rootfs: PathBuf,
    /// The driver libraries' (container path, host path).
    libs: Vec<(String, String)>,
}

/// A node, a glibc bundle running `nvidia-smi`, and where its driver libraries go. The `files`
/// layout: each library bound at its own path, the layout whose ld cache the createContainer
/// hook refreshes (the folders layout's cache is written by the same code, in-process).
fn case(tag: &str) -> Case {
    let s = common::scratch(tag);
    let n = node(
        &s,
        2,
        &[("runtime.driver-layout", toml_edit::value("files"))],
    );
    let b = bundle(
        &s,
        "b",
        "nvidia-smi >/dev/null 2>&1; echo rc=$?",
        &[("gpufence.dev/devices", "1")],
        &[],
    );
    let rootfs = common::glibc_rootfs(&b);
    // The plan alone (runtime /bin/true), to learn the library paths; then a pristine rootfs.
    let pristine = std::fs::read(b.join("config.json")).unwrap();
    set_runtime(&n, "/bin/true");
    let (code, _, err) = runtime_support::runtime(
        &n,
        &s.join("runc-root"),
        &s.join("runc.log"),
        &["create", "-b", b.to_str().unwrap(), &unique_id("ldh0")],
    );
    assert_eq!(code, 0, "{err}");
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
    let libs = library_mounts(&spec);
    assert!(!libs.is_empty());
    std::fs::write(b.join("config.json"), &pristine).unwrap();
    let _ = std::fs::remove_dir_all(&rootfs);
    common::glibc_rootfs(&b);
    set_runtime(&n, common::runc().to_str().unwrap());
    Case {
        scratch: s,
        node: n,
        bundle: b,
        rootfs,
        libs,
    }
}

impl Case {
    fn folders(&self) -> Vec<String> {
        let mut d: Vec<String> = self
            .libs
            .iter()
            .map(|(c, _)| Path::new(c).parent().unwrap().display().to_string())
            .collect();
        d.sort();
        d.dedup();
        d
    }

    /// gpufence-runtime `run` under real runc, with the deadline.
    fn run_container(&self) -> (i32, String, String, Duration) {
        let id = unique_id("ldh");
        let root = self.scratch.join("runc-root");
        let r = run_with_deadline(
            Command::new(common::bin("gpufence-runtime"))
                .env("GPUFENCE_CONFIG", &self.node.config)
                .arg("--root")
                .arg(&root)
                .arg("--log")
                .arg(self.scratch.join("runc.log"))
                .args(["--log-format", "json", "run", "-b"])
                .arg(&self.bundle)
                .arg(&id),
            b"",
        );
        let _ = runtime_support::runtime(
            &self.node,
            &root,
            &self.scratch.join("runc.log"),
            &["delete", "-f", &id],
        );
        r
    }

    /// `gpufence hook update-ldcache` as a CDI createContainer hook runs it, the libraries
    /// copied where the runtime would have mounted them.
    fn run_hook(&self) -> (i32, String, String, Duration) {
        for (c, h) in &self.libs {
            let dst = self.rootfs.join(c.trim_start_matches('/'));
            let _ = std::fs::remove_file(&dst);
            std::fs::copy(h, &dst).unwrap();
        }
        let mut cmd = Command::new(common::bin("gpufence"));
        cmd.arg("--config")
            .arg(&self.node.config)
            .args(["hook", "update-ldcache"]);
        for f in self.folders() {
            cmd.args(["--folder", &f]);
        }
        let state = serde_json::json!({"ociVersion": "1.0.2", "id": unique_id("ldhk"), "status": "creating", "bundle": self.bundle});
        run_with_deadline(&mut cmd, state.to_string().as_bytes())
    }

    fn cache(&self) -> Vec<u8> {
        std::fs::read(self.rootfs.join("etc/ld.so.cache")).expect("cache written")
    }
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// A loop device over a scratch file standing in for a host disk: (device, backing file).
struct Disk {
    dev: String,
    file: PathBuf,
}

impl Disk {
    fn new(dir: &Path) -> Disk {
        let file = dir.join("disk.img");
        let pattern: Vec<u8> = (0..(1 << 20)).map(|i: u32| (i % 251) as u8).collect();
        std::fs::write(&file, &pattern).unwrap();
        let (code, out, err) =
            common::run(Command::new("losetup").args(["-f", "--show"]).arg(&file));
        assert_eq!(code, 0, "losetup: {err}");
        Disk {
            dev: out.trim().to_string(),
            file,
        }
    }
    fn untouched(&self) -> bool {
        let b = std::fs::read(&self.file).unwrap();
        b.iter().enumerate().all(|(i, &c)| c == (i % 251) as u8)
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

fn mknod(path: &Path, kind: libc::mode_t, major: u32, minor: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    nix::sys::stat::mknod(
        path,
        nix::sys::stat::SFlag::from_bits_truncate(kind),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(major.into(), minor.into()),
    )
    .unwrap();
}

/// Both paths must leave the container working, quickly, and the host as it was.
fn assert_held(c: &Case, what: &str, check: impl Fn(&Case)) {
    let before = common::host_digest();
    let (code, out, err, took) = c.run_container();
    assert!(
        took < DEADLINE,
        "{what}: runtime hung ({took:?}): {out} {err}"
    );
    assert_eq!(code, 0, "{what}: runtime refused: {out} {err}");
    assert!(out.contains("rc=0"), "{what}: dlopen via the cache: {out}");
    check(c);
    let (code, out, err, took) = c.run_hook();
    assert!(took < DEADLINE, "{what}: hook hung ({took:?}): {out} {err}");
    assert_eq!(code, 0, "{what}: hook refused: {out} {err}");
    for (ctr, _) in &c.libs {
        let dir = Path::new(ctr).parent().unwrap().display().to_string();
        assert!(contains(&c.cache(), &dir), "{what}: {dir} in the cache");
    }
    check(c);
    assert_eq!(before, common::host_digest(), "{what}: host changed");
}

#[test]
fn block_device_cache_temporaries_and_hwcaps_symlink_to_the_host() {
    if common::skip_unless(&["runc", "losetup"]) {
        return;
    }
    let c = case("ldh-blk");
    let disk = Disk::new(&c.scratch);
    let st = nix::sys::stat::stat(disk.dev.as_str()).unwrap();
    let (ma, mi) = (
        nix::sys::stat::major(st.st_rdev) as u32,
        nix::sys::stat::minor(st.st_rdev) as u32,
    );
    // Item 1: ldconfig's temporaries as the "host disk".
    mknod(&c.rootfs.join("etc/ld.so.cache~"), libc::S_IFBLK, ma, mi);
    mknod(
        &c.rootfs.join("var/cache/ldconfig/aux-cache~"),
        libc::S_IFBLK,
        ma,
        mi,
    );
    // Item 3: <libdir>/glibc-hwcaps → a host directory holding a library only the host has.
    let hostdir = c.scratch.join("host-hwcaps");
    std::fs::create_dir_all(hostdir.join("x86-64-v2")).unwrap();
    let secret = format!("libhostonly{}.so.1", std::process::id());
    std::fs::write(
        hostdir.join("x86-64-v2").join(&secret),
        gpufence::ldso::soname::minimal_shared_object(&secret),
    )
    .unwrap();
    for f in c.folders() {
        let d = c.rootfs.join(f.trim_start_matches('/'));
        std::fs::create_dir_all(&d).unwrap();
        std::os::unix::fs::symlink(&hostdir, d.join("glibc-hwcaps")).unwrap();
    }
    assert_held(&c, "block device / hwcaps symlink", |c| {
        assert!(
            disk.untouched(),
            "the disk behind the block device was written"
        );
        let cache = c.cache();
        assert!(!contains(&cache, &secret), "host library name in the cache");
        assert!(!contains(&cache, "glibc-hwcaps"), "hwcaps dir followed");
        assert!(!contains(&cache, hostdir.to_str().unwrap()));
    });
    // The planted nodes are still what they were (never replaced, never opened).
    let m = std::fs::symlink_metadata(c.rootfs.join("etc/ld.so.cache~")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_block_device(
        &m.file_type()
    ));
}

#[test]
fn ld_so_conf_as_dev_zero() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let c = case("ldh-zero");
    let conf = c.rootfs.join("etc/ld.so.conf");
    let _ = std::fs::remove_file(&conf);
    mknod(&conf, libc::S_IFCHR, 1, 5);
    assert_held(&c, "ld.so.conf = c 1:5", |_| {});
}

#[test]
fn ld_so_conf_as_fifo() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let c = case("ldh-fifo");
    let conf = c.rootfs.join("etc/ld.so.conf");
    let _ = std::fs::remove_file(&conf);
    std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
    nix::unistd::mkfifo(&conf, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    // The image's own ld.so.cache as a FIFO too: not read, replaced.
    nix::unistd::mkfifo(
        &c.rootfs.join("etc/ld.so.cache"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    assert_held(&c, "ld.so.conf = FIFO", |c| {
        let m = std::fs::symlink_metadata(c.rootfs.join("etc/ld.so.conf")).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()));
    });
}

#[test]
fn ld_so_cache_as_a_directory_is_refused_in_one_line() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let c = case("ldh-dir");
    std::fs::create_dir_all(c.rootfs.join("etc/ld.so.cache")).unwrap();
    let pristine = std::fs::read(c.bundle.join("config.json")).unwrap();
    let (code, out, err, took) = c.run_container();
    assert!(took < DEADLINE);
    assert_ne!(code, 0, "{out}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(lines[0].contains("ld.so.cache"), "{err}");
    assert_eq!(
        std::fs::read(c.bundle.join("config.json")).unwrap(),
        pristine
    );
}
