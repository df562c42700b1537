//! gpufence-runtime under real runc, issue 15: a blocking image cannot hang `create` (the ld cache
//! worker has a deadline), and `delete` of a container that no longer exists cleans its state.

mod common;
mod runtime_support;

use std::time::{Duration, Instant};

use runtime_support::{bundle, node, runc_list, runtime, unique_id};

/// An image whose `/etc/ld.so.conf` is a FIFO blocked the ld cache refresh the wrapper ran
/// before runc (`ldconfig` in a forked worker), and the wrapper waited for it without limit. The
/// refresh is now written in-process and never opens anything of the image but regular files:
/// the container runs at once, with its GPU, and the FIFO is left as it was.
#[test]
fn blocking_image_does_not_hang_create() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-sec-fifo");
    let n = node(&s, 2, &[("timeouts.worker", toml_edit::value(2))]);
    let b = bundle(
        &s,
        "b",
        "echo RAN; ls /dev/nvidia1",
        &[("gpufence.dev/devices", "1")],
        &[],
    );
    let fifo = b.join("rootfs/etc/ld.so.conf");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let root = s.join("runc-root");
    let id = unique_id("fifo");
    let started = Instant::now();
    // `run` (foreground): the container's process ends, so its stdio closes.
    let (code, out, err) = runtime(
        &n,
        &root,
        &s.join("runc.log"),
        &["run", "--bundle", b.to_str().unwrap(), &id],
    );
    let took = started.elapsed();
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("RAN") && out.contains("/dev/nvidia1"),
        "{out}{err}"
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let ft = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&ft));
    // runc destroyed the container when its process ended; delete (which runc answers with
    // "does not exist") still removes gpufence's state.
    runtime(&n, &root, &s.join("runc.log"), &["delete", &id]);
    assert!(!n.state_dir.join(&id).exists());
}

/// A foreground `runc run` destroys its container when the process exits; containerd-style
/// callers then still run `delete`, which runc answers with "container does not exist". The
/// state directory must go then too: the container no longer exists.
#[test]
fn delete_after_foreground_run_cleans_state() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-sec-stale");
    let n = node(&s, 2, &[]);
    for (i, script) in ["true", "exit 3", "kill -9 $$"].iter().enumerate() {
        stale_case(&s, &n, &format!("b{i}"), script);
    }
}

fn stale_case(s: &std::path::Path, n: &runtime_support::Node, name: &str, script: &str) {
    let b = bundle(s, name, script, &[("gpufence.dev/devices", "0")], &[]);
    let root = s.join("runc-root");
    let id = unique_id("stale");
    let (code, out, err) = runtime(
        n,
        &root,
        &s.join("runc.log"),
        &["run", "-b", b.to_str().unwrap(), &id],
    );
    assert!(
        code == 0 || code == 3,
        "{script}: run exit {code}: {out}{err}"
    );
    let state = n.state_dir.join(&id);
    assert!(state.join("quota").exists(), "state written by create");
    assert!(
        !runc_list(&root).contains(&id),
        "runc run removed its container"
    );
    let (code, _, err) = runtime(n, &root, &s.join("runc.log"), &["delete", &id]);
    assert!(
        !state.exists(),
        "{script}: state left behind (delete exit {code}: {err})"
    );
    // Deleting again: nothing left, runc's answer passed through.
    let (code2, _, err2) = runtime(n, &root, &s.join("runc.log"), &["delete", &id]);
    assert_eq!(code, code2, "{err} / {err2}");
}

/// An image symlink turns a driver mount's target into gpufence's own: runc follows symlinks
/// inside the rootfs, so `usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06 -> /etc/ld.so.preload`
/// bound libcuda over the preload file (the shim was never loaded: no quota), and with
/// `runtime.driver-layout = "folders"`, `usr/local/nvidia/lib64 -> /etc` covers all of `/etc`.
/// gpufence's enforcement mounts now come after every other mount: the preload is on top and
/// names the shim, or runc cannot make its mount point and the container does not start.
#[test]
fn image_symlinks_cannot_cover_the_enforcement_mounts() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-sec-cover");
    let script =
        "echo \"preload=$(grep -c '^/usr/lib/gpufence/libgpufence.so$' /etc/ld.so.preload)\"";
    // Per-file layout: the preload still names the shim.
    let n = node(&s, 2, &[]);
    let b = bundle(&s, "files", script, &[("gpufence.dev/devices", "1")], &[]);
    let lib = b.join("rootfs/usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    std::os::unix::fs::symlink("/etc/ld.so.preload", lib.join("libcuda.so.580.65.06")).unwrap();
    let root = s.join("runc-root");
    let log = s.join("runc.log");
    let id = unique_id("cover");
    let (code, out, err) = runtime(&n, &root, &log, &["run", "-b", b.to_str().unwrap(), &id]);
    let _ = runtime(&n, &root, &log, &["delete", "-f", &id]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("preload=1"),
        "the shim is preloaded: {out}\n{err}"
    );

    // Folder layout: `/usr/local/nvidia/lib64 -> /etc` — the container never runs without the
    // preload: either it is on top, or runc refuses to create the container.
    let s2 = common::scratch("rt-sec-cover-folders");
    let n2 = node(
        &s2,
        2,
        &[
            ("runtime.driver-layout", toml_edit::value("folders")),
            (
                "runtime.driver-folders",
                toml_edit::value(s2.join("folders").display().to_string()),
            ),
        ],
    );
    let b2 = bundle(
        &s2,
        "folders",
        script,
        &[("gpufence.dev/devices", "1")],
        &[],
    );
    std::fs::create_dir_all(b2.join("rootfs/usr/local/nvidia")).unwrap();
    std::os::unix::fs::symlink("/etc", b2.join("rootfs/usr/local/nvidia/lib64")).unwrap();
    let root2 = s2.join("runc-root");
    let id2 = unique_id("cover2");
    let (code, out, err) = runtime(
        &n2,
        &root2,
        &log,
        &["run", "-b", b2.to_str().unwrap(), &id2],
    );
    let _ = runtime(&n2, &root2, &log, &["delete", "-f", &id2]);
    assert!(
        !out.contains("preload=") || out.contains("preload=1"),
        "never without the shim: {out}\n{err}"
    );
    assert!(
        code != 0 || out.contains("preload=1"),
        "{code} {out}\n{err}"
    );
    assert!(runc_list(&root2).is_empty());
}
