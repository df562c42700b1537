//! `runtime.driver-layout = "folders"` (src/runtime/folders.rs): gpufence-runtime mounts the
//! driver's libraries, binaries and firmware as one read-only bind per folder, made of hard
//! links of exactly the granted files, instead of one bind per file.
//!
//! Proves with real runc on the simulated node, glibc rootfs, unprivileged container user: the
//! edited spec has the folder binds and none of the per-file driver binds, `PATH` gains
//! `/usr/local/nvidia/bin`; inside, `nvidia-smi` runs from `PATH`, libraries resolve by soname
//! through the ld cache (the mock CUDA finds its node beside itself), the shim holds the quota
//! exactly, only the granted GPU opens, and folders and files are read-only; the prepared
//! directory holds hard links of the driver's own inodes and nothing more, is reused by the next
//! container, and a driver on another filesystem falls back to per-file binds.

mod common;
#[path = "fixtures/cuda_harness.rs"]
mod harness;
mod runtime_support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use harness::{MIB, field, lines, num};
use runtime_support::{bundle, node, runc_list, runtime, unique_id};

const SCRIPT: &str = r#"
C=/usr/local/bin/cuda_client
probe() { out=$(dd if="$1" of=/dev/null bs=1 count=1 2>&1); case "$out" in
  *"No such device or address"*) echo ENXIO;; *"Operation not permitted"*) echo EPERM;;
  *"No such file"*) echo ABSENT;; *) echo "OTHER:$out";; esac; }
echo "gpu0 $(probe /dev/nvidia0)"
echo "gpu1 $(probe /dev/nvidia1)"
echo "path $PATH"
nvidia-smi > /tmp/smi 2>&1; echo "smi-rc $?"; sed 's/^/smi /' /tmp/smi
test -L /usr/bin/nvidia-smi && echo "usrbin $(readlink /usr/bin/nvidia-smi)" || echo "usrbin absent"
PATH=/usr/bin:/bin nvidia-smi >/dev/null 2>&1; echo "exec-path-rc $?"
$C dlsym where info fill 1048576 free
(echo x >> /usr/local/nvidia/lib64/libcuda.so.1) 2>/dev/null && echo "lib-write allowed" || echo "lib-write denied"
(echo x > /usr/local/nvidia/lib64/planted) 2>/dev/null && echo "folder-write allowed" || echo "folder-write denied"
echo "libs $(ls /usr/local/nvidia/lib64 | tr '\n' ' ')"
echo "firmware $(ls /lib/firmware/nvidia/*/ | tr '\n' ' ')"
echo "driver-mounts $(grep -c -e ' /usr/local/nvidia/' -e ' /lib/firmware/' -e ' /usr/lib/x86_64-linux-gnu/' -e ' /usr/bin/' /proc/mounts)"
echo done
"#;

fn prepare_rootfs(b: &Path) {
    let rootfs = common::glibc_rootfs(b);
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let bin = rootfs.join("usr/local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(&harness::clients().0, bin.join("cuda_client")).unwrap();
    let p = b.join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    spec["process"]["user"] = serde_json::json!({"uid": 1000, "gid": 1000});
    std::fs::write(&p, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
}

fn folders_node(s: &Path, folders: &Path) -> runtime_support::Node {
    node(
        s,
        2,
        &[
            ("runtime.driver-layout", toml_edit::value("folders")),
            (
                "runtime.driver-folders",
                toml_edit::value(folders.display().to_string()),
            ),
        ],
    )
}

/// Run one container with `runtime … run`; returns (output, the edited spec).
fn run_one(n: &runtime_support::Node, s: &Path, name: &str) -> (String, serde_json::Value) {
    let b = bundle(
        s,
        name,
        SCRIPT,
        &[
            ("gpufence.dev/devices", "1"),
            ("gpufence.dev/memory", "100Mi"),
        ],
        &[],
    );
    prepare_rootfs(&b);
    let root = s.join("runc-root");
    let log = s.join("runc.log");
    let id = unique_id(name);
    let (code, out, err) = runtime(
        n,
        &root,
        &log,
        &["run", "--bundle", b.to_str().unwrap(), &id],
    );
    let (dcode, _, derr) = runtime(n, &root, &log, &["delete", "--force", &id]);
    assert_eq!(code, 0, "gpufence-runtime run: {out}\n{err}");
    assert_eq!(dcode, 0, "{derr}");
    assert!(!runc_list(&root).contains(&id));
    let spec = serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
    (out, spec)
}

fn destinations(spec: &serde_json::Value) -> Vec<String> {
    spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["destination"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn driver_folders_serve_a_working_container() {
    if common::skip_unless(&["runc", "gcc"]) {
        return;
    }
    let s = common::scratch("rt-folders");
    let folders = s.join("driver-folders");
    let n = folders_node(&s, &folders);
    // `gpufence plan` shows the folding the runtime will do, and changes nothing.
    let pb = bundle(&s, "p", "true", &[("gpufence.dev/devices", "1")], &[]);
    let (code, planned, err) = common::run(
        std::process::Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&n.config)
            .args(["plan", "--json", "--bundle"])
            .arg(&pb),
    );
    assert_eq!(code, 0, "{err}");
    let planned: serde_json::Value = serde_json::from_str(&planned).unwrap();
    let lib = planned["driverFolders"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["containerPath"] == "/usr/local/nvidia/lib64")
        .unwrap_or_else(|| panic!("folder bind planned: {planned}"));
    let host = lib["hostPath"].as_str().unwrap();
    assert!(
        host.starts_with(folders.to_str().unwrap()) && host.ends_with("/lib"),
        "{host}"
    );
    assert_eq!(planned["driverFolders"]["prepared"], false, "{planned}");
    // The plan's own edits keep the per-file binds (hook mode and CDI render those).
    assert!(
        planned["edits"]["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["containerPath"] != "/usr/local/nvidia/lib64"),
        "{planned}"
    );
    assert!(!folders.exists(), "plan changed nothing");

    let (out, spec) = run_one(&n, &s, "f1");
    let ctx = format!("container output:\n{out}\nspec:\n{spec}");
    // The directory the plan named is the one the runtime made.
    assert!(Path::new(host).is_dir(), "{host}");
    assert!(out.lines().any(|l| l == "done"), "{ctx}");

    // The spec: three folder binds, no per-file driver bind left, PATH extended.
    let dest = destinations(&spec);
    for d in [
        "/usr/local/nvidia/lib64",
        "/usr/local/nvidia/bin",
        "/lib/firmware/nvidia/580.65.06",
    ] {
        assert!(dest.iter().any(|x| x == d), "{d} mounted: {ctx}");
    }
    assert!(
        !dest
            .iter()
            .any(|d| d.starts_with("/usr/lib/x86_64-linux-gnu/")
                || d.starts_with("/usr/bin/")
                || d.starts_with("/lib/firmware/nvidia/580.65.06/")),
        "no per-file driver bind: {ctx}"
    );
    let env = spec["process"]["env"].to_string();
    assert!(
        env.contains("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/nvidia/bin"),
        "{ctx}"
    );
    assert!(
        spec.get("hooks")
            .is_none_or(|h| !h.to_string().contains("update-ldcache")),
        "{ctx}"
    );

    // Inside: only the granted GPU; nvidia-smi found on PATH and showing the slice; the shim
    // (through the ld cache's libcuda.so.1 in the folder) holds the quota exactly.
    assert_eq!(field(&out, "gpu1"), ["ENXIO"], "{ctx}");
    assert_eq!(field(&out, "gpu0"), ["ABSENT"], "{ctx}");
    assert_eq!(field(&out, "smi-rc"), ["0"], "{ctx}");
    let smi: Vec<&str> = lines(&out, "smi")
        .into_iter()
        .filter(|l| l.starts_with("smi GPU "))
        .collect();
    assert_eq!(smi.len(), 1, "{ctx}");
    assert!(
        smi[0].contains(&gpufence::sim::gpu_uuid(1)) && smi[0].contains("memory.total=100MiB"),
        "{ctx}"
    );
    // At its host path too (a symlink into the folder): for `kubectl exec`, whose process gets
    // the engine's env rather than the edited PATH, and for scripts naming /usr/bin/nvidia-smi.
    assert_eq!(
        field(&out, "usrbin"),
        ["/usr/local/nvidia/bin/nvidia-smi"],
        "{ctx}"
    );
    assert_eq!(field(&out, "exec-path-rc"), ["0"], "{ctx}");
    assert!(out.contains("where cuMemAlloc_v2 libgpufence.so"), "{ctx}");
    let quota = 100 * MIB;
    assert_eq!(num(&out, "fill"), quota, "{ctx}");
    assert_eq!(field(&out, "lib-write"), ["denied"], "{ctx}");
    assert_eq!(field(&out, "folder-write"), ["denied"], "{ctx}");
    let libs = field(&out, "libs");
    for l in [
        "libcuda.so.1",
        "libcuda.so.580.65.06",
        "libnvidia-ml.so.1",
        "gpufence-mock-node.json",
    ] {
        assert!(libs.iter().any(|x| x == l), "{l} in the folder: {ctx}");
    }
    // Granted files only: no graphics or video library of the driver root.
    assert!(
        !libs
            .iter()
            .any(|x| x.starts_with("libnvcuvid") || x.starts_with("libGLX")),
        "{ctx}"
    );
    assert_eq!(
        field(&out, "firmware"),
        ["gsp_ga10x.bin", "gsp_tu10x.bin"],
        "{ctx}"
    );
    // Three folders plus the simulated device timeline inside the library folder.
    assert_eq!(num(&out, "driver-mounts"), 4, "{ctx}");

    // On the host: one prepared directory of hard links (the driver's own inodes).
    let prepared: Vec<_> = std::fs::read_dir(&folders).unwrap().flatten().collect();
    assert_eq!(prepared.len(), 1, "{prepared:?}");
    let dir = prepared[0].path();
    let md = std::fs::metadata(&folders).unwrap();
    assert_eq!(md.permissions().mode() & 0o022, 0);
    let driver = n
        .dir
        .join("driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06");
    let linked = dir.join("lib/libcuda.so.580.65.06");
    assert_eq!(
        std::fs::metadata(&driver).unwrap().ino(),
        std::fs::metadata(&linked).unwrap().ino()
    );
    assert_eq!(
        std::fs::read_link(dir.join("lib/libcuda.so.1")).unwrap(),
        Path::new("libcuda.so.580.65.06")
    );

    // A second container reuses it as it is.
    let (out2, _) = run_one(&n, &s, "f2");
    assert_eq!(num(&out2, "fill"), quota, "{out2}");
    let again: Vec<_> = std::fs::read_dir(&folders).unwrap().flatten().collect();
    assert_eq!(again.len(), 1);
    let logged = std::fs::read_to_string(&n.log).unwrap();
    assert!(
        logged.contains("driver files mounted as folders"),
        "{logged}"
    );
}

#[test]
fn driver_on_another_filesystem_falls_back_to_file_binds() {
    if common::skip_unless(&["runc", "gcc"]) {
        return;
    }
    let s = common::scratch("rt-folders-xdev");
    // A tmpfs for the folders: no hard link from the driver root can reach it.
    let folders = s.join("tmpfs");
    std::fs::create_dir_all(&folders).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&folders)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mount tmpfs");
    let n = folders_node(&s, &folders.join("driver-folders"));
    let result = std::panic::catch_unwind(|| run_one(&n, &s, "x1"));
    let leftover: Vec<_> = std::fs::read_dir(folders.join("driver-folders"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let _ = std::process::Command::new("umount").arg(&folders).status();
    let (out, spec) = result.unwrap();
    let ctx = format!("container output:\n{out}\nspec:\n{spec}");
    let dest = destinations(&spec);
    assert!(
        dest.iter()
            .any(|d| d == "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06"),
        "per-file binds: {ctx}"
    );
    assert!(
        !dest.iter().any(|d| d.starts_with("/usr/local/nvidia")),
        "{ctx}"
    );
    assert_eq!(field(&out, "smi-rc"), ["0"], "{ctx}");
    assert_eq!(num(&out, "fill"), 100 * MIB, "{ctx}");
    assert!(
        leftover.is_empty(),
        "no half-built folder left: {leftover:?}"
    );
    let logged = std::fs::read_to_string(&n.log).unwrap();
    assert!(
        logged.contains("driver folders unavailable: driver files mounted one by one"),
        "{logged}"
    );
}
