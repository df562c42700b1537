//! gpufence-runtime refreshes the container's ld cache itself, before exec'ing runc, in a private
//! mount namespace (src/runtime/ldcache.rs), instead of leaving a createContainer hook to runc.
//!
//! Proves: config.json gets no ldcache hook; the rootfs carries the drop-in and a cache naming
//! the driver libraries before runc runs; nothing is left mounted on the host and nothing but
//! runc's own mount targets is left in the rootfs; dynamically linked driver tools work in the
//! container, also with a read-only rootfs; a user-namespaced container keeps the hook; and a
//! hostile rootfs (library dir symlinked to `/`, `ld.so.conf` naming `/proc/…`) changes nothing on
//! the host.

mod common;
mod runtime_support;

use std::path::{Path, PathBuf};

use runtime_support::{bundle, node, runc_list, runtime, unique_id};

fn spec(b: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap()
}

fn set_spec(b: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut s = spec(b);
    f(&mut s);
    std::fs::write(
        b.join("config.json"),
        serde_json::to_vec_pretty(&s).unwrap(),
    )
    .unwrap();
}

fn ldcache_hooks(s: &serde_json::Value) -> usize {
    s.pointer("/hooks/createContainer")
        .and_then(|h| h.as_array())
        .map_or(0, |h| {
            h.iter()
                .filter(|h| {
                    h["args"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|x| x == "update-ldcache"))
                })
                .count()
        })
}

/// Destinations of the driver library mounts in the edited spec.
fn library_mounts(s: &serde_json::Value) -> Vec<String> {
    s["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["destination"].as_str())
        .filter(|d| {
            d.contains(".so") && !d.starts_with("/etc/") && !d.starts_with("/usr/lib/gpufence/")
        })
        .map(str::to_string)
        .collect()
}

fn host_mounts_under(p: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(p.to_str().unwrap()))
        .map(str::to_string)
        .collect()
}

/// Every path under `root` (not following symlinks).
fn tree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap().flatten() {
            let path = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(path.clone());
            }
            out.push(path);
        }
    }
    out.sort();
    out
}

#[test]
fn ld_cache_refreshed_before_runc_without_a_hook() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-ldc");
    // Each library at its own path (the `files` layout), so the cache names the image's own
    // library folder; tests/runtime_folders.rs covers the folders layout's cache.
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
    let before = tree(&rootfs);
    let pristine = std::fs::read(b.join("config.json")).unwrap();
    // First the wrapper alone (its "runtime" is /bin/true): what it leaves before runc runs.
    set_runtime(&n, "/bin/true");
    let root = s.join("runc-root");
    let log = s.join("runc.log");
    let (code, out, err) = runtime(
        &n,
        &root,
        &log,
        &["create", "-b", b.to_str().unwrap(), &unique_id("ldc0")],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let edited = spec(&b);
    assert_eq!(ldcache_hooks(&edited), 0, "no hook left to runc: {edited}");
    let libs = library_mounts(&edited);
    assert!(!libs.is_empty(), "driver libraries planned: {edited}");
    // The cache was written before runc ran and names every mounted library's soname dir.
    let conf = std::fs::read_to_string(rootfs.join("etc/ld.so.conf.d/00-gpufence.conf")).unwrap();
    let cache = std::fs::read(rootfs.join("etc/ld.so.cache")).unwrap();
    for l in &libs {
        let dir = Path::new(l).parent().unwrap().to_str().unwrap();
        assert!(conf.lines().any(|c| c == dir), "{dir} in {conf}");
        let name = Path::new(l).file_name().unwrap().to_str().unwrap();
        let soname_prefix = &name[..name.find(".so").unwrap() + 3];
        assert!(
            cache
                .windows(soname_prefix.len())
                .any(|w| w == soname_prefix.as_bytes()),
            "{soname_prefix} in the ld cache"
        );
    }
    // Nothing of the worker's stays mounted on the host.
    assert_eq!(host_mounts_under(&rootfs), Vec::<String>::new());
    // Left in the rootfs: the mount targets (empty files, as runc creates them), the cache, the
    // drop-in, ldconfig's soname links; no temporary file.
    let created: Vec<PathBuf> = tree(&rootfs)
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    for p in &created {
        let rel = Path::new("/").join(p.strip_prefix(&rootfs).unwrap());
        let name = rel.file_name().unwrap().to_str().unwrap();
        assert!(!name.contains(".gpufence-"), "temporary file left: {rel:?}");
        let m = std::fs::symlink_metadata(p).unwrap();
        if libs.iter().any(|l| Path::new(l) == rel) {
            assert!(m.is_file() && m.len() == 0, "{rel:?}: empty mount target");
        }
    }
    // Then real runc on the pristine spec: its mounts cover those targets, and the tool
    // resolves its libraries by soname.
    std::fs::write(b.join("config.json"), &pristine).unwrap();
    set_runtime(&n, common::runc().to_str().unwrap());
    let id = unique_id("ldc");
    let (code, out, err) = runtime(&n, &root, &log, &["run", "-b", b.to_str().unwrap(), &id]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("rc=0"),
        "nvidia-smi found its libraries: {out}\n{err}"
    );
    let _ = runtime(&n, &root, &log, &["delete", "-f", &id]);
    assert!(runc_list(&root).is_empty());
    assert_eq!(host_mounts_under(&rootfs), Vec::<String>::new());

    // Read-only rootfs: the same, through `run` (the refresh writes before runc mounts it ro).
    let b2 = bundle(
        &s,
        "b2",
        "nvidia-smi >/dev/null 2>&1; echo rc=$?",
        &[("gpufence.dev/devices", "1")],
        &[],
    );
    common::glibc_rootfs(&b2);
    set_spec(&b2, |s| s["root"]["readonly"] = true.into());
    let id2 = unique_id("ldcro");
    let (code, out, err) = runtime(&n, &root, &log, &["run", "-b", b2.to_str().unwrap(), &id2]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("rc=0"),
        "nvidia-smi found its libraries: {out}\n{err}"
    );
    assert_eq!(ldcache_hooks(&spec(&b2)), 0);
    let _ = runtime(&n, &root, &log, &["delete", "-f", &id2]);
    let logged = std::fs::read_to_string(&n.log).unwrap();
    assert!(
        logged.contains("ld cache refreshed before runc"),
        "{logged}"
    );
}

fn set_runtime(n: &runtime_support::Node, path: &str) {
    let mut doc: toml_edit::DocumentMut =
        std::fs::read_to_string(&n.config).unwrap().parse().unwrap();
    doc["runtime"]["path"] = toml_edit::value(path);
    std::fs::write(&n.config, doc.to_string()).unwrap();
}

#[test]
fn user_namespaced_container_keeps_the_hook() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-ldcu");
    let n = node(&s, 2, &[]);
    let b = bundle(&s, "b", "true", &[("gpufence.dev/devices", "1")], &[]);
    set_spec(&b, |s| {
        s["linux"]["namespaces"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"type": "user"}));
    });
    // Plan and edit only (no runc): a bogus runtime path makes the exec fail after the edit.
    let before = std::fs::read(b.join("config.json")).unwrap();
    let cfg = n.config.clone();
    let mut doc: toml_edit::DocumentMut = std::fs::read_to_string(&cfg).unwrap().parse().unwrap();
    doc["runtime"]["path"] = toml_edit::value("/bin/true");
    std::fs::write(&cfg, doc.to_string()).unwrap();
    let root = s.join("runc-root");
    let id = unique_id("ldcu");
    let (code, out, err) = runtime(
        &n,
        &root,
        &s.join("runc.log"),
        &["create", "-b", b.to_str().unwrap(), &id],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let edited = spec(&b);
    assert_ne!(std::fs::read(b.join("config.json")).unwrap(), before);
    assert_eq!(
        ldcache_hooks(&edited),
        1,
        "user namespace: hook kept: {edited}"
    );
    assert!(!b.join("rootfs/etc/ld.so.conf.d/00-gpufence.conf").exists());
}

#[test]
fn hostile_rootfs_changes_nothing_on_the_host() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-ldch");
    let n = node(&s, 2, &[]);
    let b = bundle(&s, "b", "true", &[("gpufence.dev/devices", "1")], &[]);
    let rootfs = common::glibc_rootfs(&b);
    // Find where the driver libraries go, then point those directories at `/`.
    let cfg = n.config.clone();
    let mut doc: toml_edit::DocumentMut = std::fs::read_to_string(&cfg).unwrap().parse().unwrap();
    doc["runtime"]["path"] = toml_edit::value("/bin/true");
    std::fs::write(&cfg, doc.to_string()).unwrap();
    let pristine = std::fs::read(b.join("config.json")).unwrap();
    let root = s.join("runc-root");
    let (code, _, err) = runtime(
        &n,
        &root,
        &s.join("runc.log"),
        &["create", "-b", b.to_str().unwrap(), &unique_id("ldcp")],
    );
    assert_eq!(code, 0, "{err}");
    let libs = library_mounts(&spec(&b));
    let mut dirs: Vec<PathBuf> = libs
        .iter()
        .map(|l| Path::new(l).parent().unwrap().to_path_buf())
        .collect();
    dirs.sort();
    dirs.dedup();
    // Fresh rootfs state for the attack.
    std::fs::write(b.join("config.json"), &pristine).unwrap();
    let _ = std::fs::remove_dir_all(rootfs.join("etc/ld.so.conf.d"));
    let _ = std::fs::remove_file(rootfs.join("etc/ld.so.cache"));
    for d in &dirs {
        let inside = rootfs.join(d.strip_prefix("/").unwrap());
        let _ = std::fs::remove_dir_all(&inside);
        std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink("/", &inside).unwrap();
    }
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::fs::write(
        rootfs.join("etc/ld.so.conf"),
        "include /proc/self/root/etc/ld.so.conf.d/*.conf\n/proc/1/root/usr/lib/x86_64-linux-gnu\n/proc/self/cwd\ninclude /etc/ld.so.conf.d/*.conf\n",
    )
    .unwrap();
    // Real runc from here on.
    doc["runtime"]["path"] = toml_edit::value(common::runc().display().to_string());
    std::fs::write(&cfg, doc.to_string()).unwrap();

    let host_before = common::host_digest();
    let id = unique_id("ldch");
    let (code, out, err) = runtime(
        &n,
        &root,
        &s.join("runc.log"),
        &["run", "-b", b.to_str().unwrap(), &id],
    );
    let host_after = common::host_digest();
    let _ = runtime(&n, &root, &s.join("runc.log"), &["delete", "-f", &id]);
    assert_eq!(
        host_before, host_after,
        "host unchanged (rc {code}: {out} {err})"
    );
    assert_eq!(host_mounts_under(&rootfs), Vec::<String>::new());
    for l in &libs {
        let name = Path::new(l).file_name().unwrap();
        assert!(
            !Path::new("/").join(name).exists(),
            "{name:?} created on the host"
        );
    }
    // Confined, not refused: the lib dirs resolved to the rootfs itself (as they will once
    // the container has pivoted into it), where the mount targets and the cache landed.
    assert_eq!(code, 0, "{out}\n{err}");
    for l in &libs {
        assert!(
            rootfs.join(Path::new(l).file_name().unwrap()).exists(),
            "{l}"
        );
    }
    assert!(rootfs.join("etc/ld.so.cache").exists());
}
