//! Issue 15 items 4 and 6, end to end with real runc through `gpufence-runtime`, container root:
//! spec mounts at gpufence's destinations (as an engine writes image volumes) never hide or
//! replace its mounts, and the container gets no write access to the host's state directory —
//! only its own size- and inode-bounded tmpfs at `/run/gpufence`.

mod common;
mod runtime_support;

use runtime_support::{bundle, node, runc_list, runtime, unique_id};

const SCRIPT: &str = r#"
echo "quota-lines $(grep -c '^device.0.memory=67108864$' /run/gpufence/quota)"
(echo device.0.memory=99999999999 > /run/gpufence/quota) 2>/dev/null && echo quota-written
(echo 1 > /run/gpufence/accounting) 2>/dev/null && echo accounting-created
touch /run/gpufence/planted 2>/dev/null && echo planted-file
ln -s / /run/gpufence/link 2>/dev/null && echo planted-link
mkdir /run/gpufence/d 2>/dev/null && echo planted-dir
dd if=/dev/zero of=/run/gpufence/accounting bs=1048576 count=64 2>/dev/null
echo "accounting-size $(stat -c %s /run/gpufence/accounting)"
echo "preload $(cat /etc/ld.so.preload)"
test -s /usr/lib/gpufence/libgpufence.so && echo shim-present
echo "state-fs $(grep ' /run/gpufence ' /proc/mounts | tail -1 | cut -d' ' -f3)"
echo done
"#;

#[test]
fn spec_mounts_cannot_hide_gpufence_and_root_cannot_write_host_state() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let s = common::scratch("rt-state-iso");
    let n = node(&s, 2, &[]);
    let b = bundle(
        &s,
        "b",
        SCRIPT,
        &[
            ("gpufence.dev/devices", "1"),
            ("gpufence.dev/memory", "64Mi"),
        ],
        &[],
    );
    // Volumes the engine would mount for `VOLUME /run/gpufence/quota /run/gpufence/sub
    // /usr/lib/gpufence /etc/ld.so.preload`: writable host directories and files.
    let vols = s.join("volumes");
    let vol_dir = |n: &str| {
        let p = vols.join(n);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    let quota_vol = vols.join("quota-file");
    std::fs::create_dir_all(&vols).unwrap();
    std::fs::write(&quota_vol, "device.0.memory=99999999999\n").unwrap();
    let preload_vol = vols.join("preload-file");
    std::fs::write(&preload_vol, "/tmp/evil.so\n").unwrap();
    let bind = |src: &std::path::Path, dst: &str| {
        serde_json::json!({"destination": dst, "type": "bind", "source": src,
            "options": ["rbind", "rw"]})
    };
    let cfg_path = b.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    let mounts = cfg["mounts"].as_array_mut().unwrap();
    mounts.push(bind(&quota_vol, "/run/gpufence/quota"));
    mounts.push(bind(&vol_dir("sub"), "/run/gpufence/sub"));
    mounts.push(bind(&vol_dir("shim"), "/usr/lib/gpufence"));
    mounts.push(bind(&preload_vol, "/etc/ld.so.preload"));
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();

    let root = s.join("runc-root");
    let runc_log = s.join("runc.log");
    let id = unique_id("stateiso");
    let (code, out, err) = runtime(
        &n,
        &root,
        &runc_log,
        &["run", "--bundle", b.to_str().unwrap(), &id],
    );
    let state = n.state_dir.join(&id);
    let mut host_entries: Vec<String> = std::fs::read_dir(&state)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    host_entries.sort();
    let host_quota = std::fs::read_to_string(state.join("quota")).unwrap_or_default();
    let (dcode, _, derr) = runtime(&n, &root, &runc_log, &["delete", "--force", &id]);
    let ctx = format!("container output:\n{out}\nstderr:\n{err}");
    assert_eq!(code, 0, "{ctx}");
    assert!(out.lines().any(|l| l == "done"), "{ctx}");

    // Item 4: gpufence's mounts win over every spec mount at their destinations.
    assert!(out.contains("quota-lines 1"), "{ctx}");
    assert!(!out.contains("quota-written"), "{ctx}");
    assert!(
        out.contains("preload /usr/lib/gpufence/libgpufence.so"),
        "{ctx}"
    );
    assert!(out.contains("shim-present"), "{ctx}");
    // The volumes were dropped, never written.
    assert_eq!(
        std::fs::read_to_string(&quota_vol).unwrap(),
        "device.0.memory=99999999999\n"
    );
    assert_eq!(std::fs::read_dir(vols.join("sub")).unwrap().count(), 0);

    // Item 6: /run/gpufence is the container's own tmpfs: one file (the accounting region) fits,
    // nothing else, and no more than its size.
    assert!(out.contains("state-fs tmpfs"), "{ctx}");
    assert!(out.contains("accounting-created"), "{ctx}");
    for planted in ["planted-file", "planted-link", "planted-dir"] {
        assert!(!out.contains(planted), "{planted}: {ctx}");
    }
    let size: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("accounting-size "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(u64::MAX);
    assert!(
        size <= 1 << 20,
        "the container grew its region to {size}: {ctx}"
    );
    // The host's state directory holds only what the host wrote: the quota and the status
    // record for `gpufence ps` (never mounted into the container).
    assert_eq!(host_entries, ["quota", "status.json"], "{ctx}");
    assert!(
        host_quota.contains("device.0.memory=67108864"),
        "{host_quota}"
    );
    assert_eq!(dcode, 0, "{derr}");
    assert!(!state.exists(), "state dir removed on delete");
    assert!(!runc_list(&root).contains(&id));
}
