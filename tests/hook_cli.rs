//! `gpufence hook …` invoked directly with hostile or broken input: bounded input, one-line
//! errors, non-zero exit, nothing left on the host.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn hook(config: &Path, args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(common::bin("gpufence"))
        .arg("--config")
        .arg(config)
        .arg("hook")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The hook may refuse before reading everything: a broken pipe is fine.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn bundle(dir: &Path, annotations: serde_json::Value) -> PathBuf {
    let b = dir.join("bundle");
    std::fs::create_dir_all(b.join("rootfs")).unwrap();
    let cfg = serde_json::json!({
        "ociVersion": "1.0.2",
        "root": {"path": "rootfs"},
        "process": {"args": ["/bin/true"], "cwd": "/", "env": ["PATH=/bin", "LD_PRELOAD=/evil.so"]},
        "annotations": annotations,
        "linux": {}
    });
    std::fs::write(b.join("config.json"), cfg.to_string()).unwrap();
    b
}

fn state(id: &str, pid: i64, bundle: &Path) -> Vec<u8> {
    serde_json::json!({"ociVersion": "1.0.2", "id": id, "status": "creating", "pid": pid,
        "bundle": bundle, "annotations": {}})
    .to_string()
    .into_bytes()
}

fn setup(name: &str) -> Option<(PathBuf, PathBuf)> {
    if common::skip_unless(&[]) {
        return None;
    }
    let dir = common::scratch(name);
    let config = common::sim_node(&dir.join("node"), 2, None);
    Some((dir, config))
}

fn state_dir_entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir.join("node/state"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("ctr"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn one_mib_annotation_is_refused_without_side_effects() {
    let Some((dir, config)) = setup("hook-cli-big") else {
        return;
    };
    let big = "0,".repeat(512 * 1024);
    let b = bundle(&dir, serde_json::json!({"gpufence.dev/devices": big}));
    let st = serde_json::json!({"ociVersion": "1.0.2", "id": "ctr-big", "status": "creating",
        "pid": std::process::id(), "bundle": b, "annotations": {"gpufence.dev/devices": big}});
    let (code, out, err) = hook(&config, &["prestart"], st.to_string().as_bytes());
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("larger than"), "{err}");
    assert!(state_dir_entries(&dir).is_empty());
    // Only in config.json (the state carries no annotations): the allocation parser refuses.
    let small_state = state("ctr-big2", i64::from(std::process::id()), &b);
    let (code, _, err) = hook(&config, &["prestart"], &small_state);
    assert_ne!(code, 0, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.len() < 1024,
        "error line stays short: {} bytes",
        err.len()
    );
    assert!(state_dir_entries(&dir).is_empty());
}

#[test]
fn broken_state_is_refused_with_one_line() {
    let Some((dir, config)) = setup("hook-cli-state") else {
        return;
    };
    let b = bundle(&dir, serde_json::json!({"gpufence.dev/devices": "0"}));
    for (input, want) in [
        (b"not json".to_vec(), "invalid JSON"),
        (state("../../etc", 42, &b), "container id"),
        (state("ctr-x", 0, &b), "pid"),
        (state("ctr-x", 42, Path::new("relative")), "absolute"),
    ] {
        let (code, out, err) = hook(&config, &["prestart"], &input);
        assert_eq!(code, 1, "{out}{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "{want}: {err}");
    }
    assert!(state_dir_entries(&dir).is_empty());
}

#[test]
fn failure_after_host_files_leaves_nothing_behind() {
    let Some((dir, config)) = setup("hook-cli-cleanup") else {
        return;
    };
    let b = bundle(
        &dir,
        serde_json::json!({"gpufence.dev/devices": "0", "gpufence.dev/memory": "1Gi"}),
    );
    // A pid that is not a process: the hook fails when it opens the container's namespace.
    let (code, out, err) = hook(&config, &["prestart"], &state("ctr-gone", 999_999_999, &b));
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("ctr-gone"), "{err}");
    assert!(
        state_dir_entries(&dir).is_empty(),
        "{:?}",
        state_dir_entries(&dir)
    );
    // The hook's own pid shares the host mount namespace: refused, nothing mounted.
    let me = i64::from(std::process::id());
    let (code, _, err) = hook(&config, &["create-runtime"], &state("ctr-host", me, &b));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("host's mount namespace"), "{err}");
    assert!(state_dir_entries(&dir).is_empty());
}

#[test]
fn dotdot_device_in_annotation_is_refused() {
    let Some((dir, config)) = setup("hook-cli-dotdot") else {
        return;
    };
    for v in ["../0", "0/../1", "/dev/../etc/shadow"] {
        let b = bundle(&dir, serde_json::json!({"gpufence.dev/devices": v}));
        let (code, _, err) = hook(&config, &["prestart"], &state("ctr-dd", 42, &b));
        assert_eq!(code, 1, "{v}: {err}");
        assert!(err.contains("gpufence.dev/devices"), "{err}");
    }
    assert!(state_dir_entries(&dir).is_empty());
}

#[test]
fn no_allocation_means_nothing_done() {
    let Some((dir, config)) = setup("hook-cli-none") else {
        return;
    };
    let b = bundle(&dir, serde_json::json!({"other.io/x": "1"}));
    let (code, out, err) = hook(&config, &["prestart"], &state("ctr-none", 42, &b));
    assert_eq!(code, 0, "{out}{err}");
    assert!(state_dir_entries(&dir).is_empty());
    let log = std::fs::read_to_string(dir.join("node/gpufence.log")).unwrap();
    assert!(
        log.contains("ctr-none") && log.contains("no allocation"),
        "{log}"
    );
}

#[test]
fn poststop_removes_only_the_containers_state_dir() {
    let Some((dir, config)) = setup("hook-cli-poststop") else {
        return;
    };
    let sd = dir.join("node/state");
    std::fs::create_dir_all(sd.join("ctr-a")).unwrap();
    std::fs::write(sd.join("ctr-a/quota"), "version=1\n").unwrap();
    std::fs::create_dir_all(sd.join("ctr-b")).unwrap();
    let b = bundle(&dir, serde_json::json!({}));
    let (code, _, err) = hook(&config, &["poststop"], &state("ctr-a", 42, &b));
    assert_eq!(code, 0, "{err}");
    assert!(!sd.join("ctr-a").exists());
    assert!(sd.join("ctr-b").exists());
    let (code, _, err) = hook(&config, &["poststop"], &state("..", 42, &b));
    assert_eq!(code, 1, "{err}");
    assert!(sd.exists());
}

#[test]
fn install_names_the_binary_and_config() {
    let Some((dir, config)) = setup("hook-cli-install") else {
        return;
    };
    let hooks = dir.join("hooks.d");
    let (code, out, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&config)
            .args(["hook", "install", "--dir"])
            .arg(&hooks),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(hooks.join("gpufence.json")).unwrap())
            .unwrap();
    assert_eq!(
        v["hook"]["path"],
        common::bin("gpufence")
            .canonicalize()
            .unwrap()
            .display()
            .to_string()
    );
    assert_eq!(v["hook"]["args"][2], config.display().to_string());
    assert_eq!(v["stages"], serde_json::json!(["prestart"]));
}

#[test]
fn cri_o_pod_sandbox_never_gets_a_gpu() {
    let Some((dir, config)) = setup("hook-cli-sandbox") else {
        return;
    };
    // Pod annotations reach the pause container too (CRI-O matches hooks on them).
    let b = bundle(
        &dir,
        serde_json::json!({"gpufence.dev/devices": "0", "io.kubernetes.cri-o.ContainerType": "sandbox"}),
    );
    let (code, out, err) = hook(&config, &["prestart"], &state("ctr-pause", 42, &b));
    assert_eq!(code, 0, "{out}{err}");
    assert!(state_dir_entries(&dir).is_empty());
    let log = std::fs::read_to_string(dir.join("node/gpufence.log")).unwrap();
    assert!(log.contains("pod sandbox"), "{log}");
}

#[test]
fn plan_already_applied_by_the_runtime_is_not_applied_twice() {
    let Some((dir, config)) = setup("hook-cli-twice") else {
        return;
    };
    let b = bundle(&dir, serde_json::json!({"gpufence.dev/devices": "0"}));
    let p = b.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v["mounts"] = serde_json::json!([{"destination": "/run/gpufence/quota", "type": "bind",
        "source": dir.join("node/state/ctr-twice/quota"), "options": ["bind", "ro"]}]);
    std::fs::write(&p, v.to_string()).unwrap();
    let (code, out, err) = hook(&config, &["prestart"], &state("ctr-twice", 42, &b));
    assert_eq!(code, 0, "{out}{err}");
    let log = std::fs::read_to_string(dir.join("node/gpufence.log")).unwrap();
    assert!(log.contains("already carries gpufence's edits"), "{log}");
}

/// In runtime mode `update-ldcache` runs as a createContainer hook inside the container, before
/// pivot_root, as a child of runc init (full capabilities). The image's `/etc/ld.so.conf` may
/// name `/proc/<pid>/root/<host dir>`: the host's ldconfig, chrooted into the rootfs where the
/// container's procfs is mounted, must not reach the host through that magic link (reading host
/// libraries into the cache, creating soname links in host directories).
#[test]
fn update_ldcache_never_reaches_the_host_through_proc() {
    let Some((dir, config)) = setup("ldcache-proc") else {
        return;
    };
    if common::skip_unless(&["unshare", "sleep"]) {
        return;
    }
    let hostlib = dir.join("hostlib");
    std::fs::create_dir_all(&hostlib).unwrap();
    let lib = std::fs::read_dir("/lib/x86_64-linux-gnu")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libz.so.1."))
        })
        .expect("a versioned libz on the host");
    std::fs::copy(&lib, hostlib.join(lib.file_name().unwrap())).unwrap();

    let b = bundle(&dir, serde_json::json!({}));
    let rootfs = b.join("rootfs");
    std::fs::create_dir_all(rootfs.join("usr/lib/gpufence")).unwrap();
    std::fs::create_dir_all(rootfs.join("proc")).unwrap();
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    // A root process with full capabilities stands in for runc init.
    let mut init = Command::new("sleep").arg("60").spawn().unwrap();
    std::fs::write(
        rootfs.join("etc/ld.so.conf"),
        format!("/proc/{}/root{}\n", init.id(), hostlib.display()),
    )
    .unwrap();
    let script = format!(
        // The hook process itself (its root is the host's until pivot_root) is named too.
        "mount --make-rprivate / && mount -t proc proc '{}' && echo \"/proc/$$/root{}\" >> '{}' && exec '{}' --config '{}' hook update-ldcache --folder /usr/lib/gpufence",
        rootfs.join("proc").display(),
        hostlib.display(),
        rootfs.join("etc/ld.so.conf").display(),
        common::bin("gpufence").display(),
        config.display()
    );
    let mut child = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child
        .stdin
        .take()
        .unwrap()
        .write_all(&state("ctr-ldproc", 42, &b));
    let out = child.wait_with_output().unwrap();
    let _ = init.kill();
    let _ = init.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        std::fs::symlink_metadata(hostlib.join("libz.so.1")).is_err(),
        "ldconfig created a soname link in a host directory (status {:?}, stderr {stderr})",
        out.status
    );
    assert!(out.status.success(), "update-ldcache failed: {stderr}");
    let cache = std::fs::read(rootfs.join("etc/ld.so.cache")).expect("ldconfig built the cache");
    let host_dir = hostlib.display().to_string();
    assert!(
        !cache
            .windows(host_dir.len())
            .any(|w| w == host_dir.as_bytes()),
        "the container's ld cache lists a host directory"
    );
}

/// An image `VOLUME /run/gpufence` is a mount at the same destination, from elsewhere: it must
/// not make the hook believe gpufence-runtime applied the plan (that would skip the device gate
/// and the quota mounts).
#[test]
fn image_volume_at_state_dir_does_not_skip_enforcement() {
    let Some((dir, config)) = setup("hook-cli-volume") else {
        return;
    };
    let b = bundle(&dir, serde_json::json!({"gpufence.dev/devices": "0"}));
    let p = b.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let vol = dir.join("volumes/anon/_data");
    std::fs::create_dir_all(&vol).unwrap();
    v["mounts"] = serde_json::json!([{"destination": "/run/gpufence", "type": "bind",
        "source": vol, "options": ["rbind", "rw"]},
        {"destination": "/run/gpufence/quota", "type": "bind",
        "source": vol.join("quota"), "options": ["rbind", "rw"]}]);
    std::fs::write(&p, v.to_string()).unwrap();
    // pid 42 is no container: enforcement is attempted and fails; it must not be skipped.
    let (code, out, err) = hook(&config, &["prestart"], &state("ctr-volume", 42, &b));
    let log = std::fs::read_to_string(dir.join("node/gpufence.log")).unwrap_or_default();
    assert!(!log.contains("already carries gpufence's edits"), "{log}");
    assert_ne!(code, 0, "{out}{err}");
}
