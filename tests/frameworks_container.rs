//! Issue 33: NVIDIA's real CUDA runtime (13.2, from the `torch==2.15.0` wheel) and two unmodified
//! frameworks over the simulated node, inside a container started by `gpufence-runtime` and runc,
//! held to a 4 GiB slice of an 80 GiB simulated H100 in every allocator mode:
//!
//! - PyTorch: the default caching allocator, `expandable_segments:True` (VMM) and
//!   `backend:cudaMallocAsync` (stream-ordered pools); `mem_get_info()` and
//!   `get_device_properties(0).total_memory` show the slice; `OutOfMemoryError` at the slice;
//!   two processes of the container share it;
//! - CuPy: `memGetInfo()` shows the slice; its default pool and `MemoryAsyncPool` stop at it.
//!
//! The programs are `tests/frameworks/*.py`, run unchanged (the sizes are arguments) by this test
//! and on a machine with a real GPU (docs/frameworks.md). The control runs the same programs on
//! the same simulated node without gpufence: they see 80 GiB and allocate past 4 GiB.
//!
//! The wheels (about 5.5 GiB installed) come from `scripts/frameworks.sh`, cached outside the
//! clone (`/var/cache/gpufence/frameworks`): the first run downloads them, later runs nothing.
//! The venv is bound read-only into the container, with the host's Python 3.11 and libraries.
//! The NRI path runs PyTorch too: a pod through containerd 2.3's CRI, fenced by `gpufence nri`
//! from kubelet's record of the GPU, in every PyTorch allocator mode.
//! Ignored by default (the download); `make test-frameworks` runs them. Needs root, runc, and
//! for the NRI test the shared engines and the CRI client's Python (as tests/nri_e2e.rs).

mod common;
mod cri_support;
mod runtime_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use runtime_support::node;
use serde_json::json;

const GIB: u64 = 1 << 30;
const SLICE: u64 = 4 * GIB;
/// What the simulated H100 80GB reports (`gpufence-sim`'s default memory).
const WHOLE_GPU: u64 = 81_559 * (1 << 20);

/// The venv with the pinned wheels (installs what is missing; prints its path): PyTorch + CuPy
/// (`set` empty) or JAX (`set` "jax").
fn frameworks_venv(set: &[&str]) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/frameworks.sh");
    let (code, out, err) = common::run(Command::new("bash").arg(script).args(set));
    assert_eq!(code, 0, "scripts/frameworks.sh failed: {err}");
    PathBuf::from(out.trim())
}

fn programs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/frameworks")
}

/// One check: its name, the program, its arguments.
type Check = (String, &'static str, Vec<String>);

/// A check of `prog` that must stop at `slice`, in `mode` (None: the program has none), with
/// `--flag bytes` arguments after (`--held`: a neighbour process of the container holds that
/// much first; `--graph`: a CUDA graph holds that much).
fn slice_check(
    name: &str,
    prog: &'static str,
    mode: Option<&str>,
    slice: u64,
    extra: &[(&str, u64)],
) -> Check {
    let s = slice.to_string();
    let mut args: Vec<String> = Vec::new();
    if let Some(m) = mode {
        args.extend(["--mode".to_string(), m.to_string()]);
    }
    args.extend(["--total", &s, "--stop-at", &s].map(String::from));
    for (flag, bytes) in extra {
        args.extend([flag.to_string(), bytes.to_string()]);
    }
    (name.to_string(), prog, args)
}

/// Every check the container runs.
fn checks(slice: u64) -> Vec<Check> {
    let torch = |name: &str, mode, extra: &[(&str, u64)]| {
        slice_check(name, "torch_slice.py", Some(mode), slice, extra)
    };
    let mut v: Vec<Check> = ["default", "expandable", "async"]
        .into_iter()
        .map(|m| torch(&format!("torch-{m}"), m, &[]))
        .collect();
    // a CUDA graph's memory nodes (cudaMallocAsync captured) hold 1 GiB while it lives
    v.push(torch("torch-graph", "async", &[("--graph", GIB)]));
    // two processes of one container share the slice: a neighbour holds 1 GiB first
    v.push(torch("torch-shared", "default", &[("--held", GIB)]));
    v.extend(
        ["default", "async"]
            .into_iter()
            .map(|m| slice_check(&format!("cupy-{m}"), "cupy_slice.py", Some(m), slice, &[])),
    );
    // what PyTorch's cudaMallocAsync pool keeps after a free (1 GiB) is not CuPy's to take
    v.push(slice_check("pool-kept", "pool_kept.py", None, slice, &[]));
    v
}

/// (host path, container path) of what the programs need, all read-only: the venv, the host's
/// Python 3.11 and its libraries at the same places, the programs at /opt/frameworks. Their
/// mount points are made in `rootfs`.
fn host_binds(venv: &Path, rootfs: &Path) -> Vec<(PathBuf, PathBuf)> {
    let host_python = std::fs::canonicalize(venv.join("bin/python")).unwrap();
    let mut binds: Vec<(PathBuf, PathBuf)> = [
        venv.to_path_buf(),
        PathBuf::from("/usr/lib/x86_64-linux-gnu"),
        PathBuf::from("/usr/lib/python3.11"),
        host_python,
    ]
    .into_iter()
    .map(|p| (p.clone(), p))
    .collect();
    binds.push((programs(), PathBuf::from("/opt/frameworks")));
    for (host, inside) in &binds {
        let at = rootfs.join(inside.strip_prefix("/").unwrap());
        if host.is_dir() {
            std::fs::create_dir_all(&at).unwrap();
        } else {
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            std::fs::write(&at, b"").unwrap();
        }
    }
    binds
}

/// The shell script a container runs: each check after its `== name` line, then `== end`.
fn container_script(python: &Path, checks: &[Check]) -> String {
    let mut script = String::from("cd /tmp; export HOME=/tmp\n");
    for (name, prog, args) in checks {
        script.push_str(&format!(
            "echo '== {name}'; {} /opt/frameworks/{prog} {} 2>&1 | grep -v '^gpufence: '\n",
            python.display(),
            args.join(" ")
        ));
    }
    script.push_str("echo '== end'\n");
    script
}

/// The `== name` separated output of each check, with its verdict line.
fn sections(out: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = Vec::new();
    for l in out.lines() {
        if let Some(name) = l.strip_prefix("== ") {
            v.push((name.to_string(), String::new()));
        } else if let Some(last) = v.last_mut() {
            last.1.push_str(l);
            last.1.push('\n');
        }
    }
    v
}

fn value(section: &str, key: &str) -> Option<u64> {
    section
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key} ")))
        .and_then(|r| r.split_whitespace().last())
        .and_then(|x| x.parse().ok())
}

#[test]
#[ignore = "downloads the PyTorch and CuPy wheels (about 5.5 GiB) once: make test-frameworks"]
fn torch_and_cupy_are_held_to_their_slice_inside_a_gpufence_container() {
    if common::skip_unless(&["runc"]) {
        return;
    }
    let venv = frameworks_venv(&[]);
    let python = venv.join("bin/python");
    let s = common::scratch("frameworks-ctr");
    let n = node(&s, 1, &[]);
    run_in_gpufence_container(&s, &n, &venv, &checks(SLICE));
    control_without_gpufence(&n.dir, &python);
}

/// Run `checks` in one container that `gpufence-runtime` starts with GPU 0 and a 4 GiB slice,
/// the venv bound read-only; asserts each check said `verdict ok` and stopped within the slice,
/// and returns the output.
fn run_in_gpufence_container(
    s: &Path,
    n: &runtime_support::Node,
    venv: &Path,
    checks: &[Check],
) -> String {
    let script = container_script(&venv.join("bin/python"), checks);
    let b = runtime_support::bundle(
        s,
        "bundle",
        &script,
        &[
            ("gpufence.dev/devices", "0"),
            ("gpufence.dev/memory", "4Gi"),
        ],
        &[],
    );
    let rootfs = common::glibc_rootfs(&b);
    let binds = host_binds(venv, &rootfs);
    let cfg_path = b.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    let mounts = cfg["mounts"].as_array_mut().unwrap();
    for (host, inside) in &binds {
        mounts.push(
            json!({"destination": inside, "source": host, "type": "bind",
                           "options": ["rbind", "ro", "nosuid", "nodev"]}),
        );
    }
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();

    let (code, out, err) = runtime_support::run_and_delete(n, s, &b, "frameworks");
    let ctx = format!("container output:\n{out}\nstderr:\n{err}");
    assert_eq!(code, 0, "gpufence-runtime run failed: {ctx}");
    println!("{out}");
    assert_held(&out, checks, &ctx);
    out
}

/// Every check ran, in order, said `verdict ok`, saw the slice and stopped within it.
fn assert_held(out: &str, checks: &[Check], ctx: &str) {
    let got = sections(out);
    let names: Vec<&str> = got.iter().map(|g| g.0.as_str()).collect();
    let mut want: Vec<String> = checks.iter().map(|c| c.0.clone()).collect();
    want.push("end".into());
    assert_eq!(names, want, "{ctx}");
    for (name, section) in got.iter().filter(|g| g.0 != "end") {
        assert!(
            section.contains("verdict ok"),
            "{name} inside the container:\n{section}\n{ctx}"
        );
        // what the program saw: the slice, and where it stopped
        assert_eq!(
            value(section, "mem_get_info")
                .or(value(section, "memGetInfo"))
                .or(value(section, "kept_by_pool")),
            Some(SLICE),
            "{name}: {section}"
        );
        let allocated = value(section, "allocated").unwrap();
        let room =
            if name.ends_with("-shared") || ["torch-graph", "pool-kept"].contains(&name.as_str()) {
                SLICE - GIB
            } else {
                SLICE
            };
        assert!(allocated <= room, "{name}: {section}");
    }
}

/// The same programs on the same simulated node, without gpufence: the whole GPU, and past 4 GiB.
fn control_without_gpufence(node_dir: &Path, python: &Path) {
    for (prog, modes) in [
        ("torch_slice.py", &["default", "expandable", "async"][..]),
        ("cupy_slice.py", &["default", "async"][..]),
        ("pool_kept.py", &["default"][..]),
    ] {
        for mode in modes {
            control_check(node_dir, Command::new(python), prog, mode);
        }
    }
}

/// `prog --mode mode --total <whole GPU> --pass <6 GiB>` on the simulated node without gpufence,
/// started by `launcher` (the venv's Python, or a wrapper around it); asserts `verdict ok` and
/// returns the output.
fn control_check(node_dir: &Path, mut launcher: Command, prog: &str, mode: &str) -> String {
    let driver = node_dir.join("driver/usr/lib/x86_64-linux-gnu");
    let (total, past) = (WHOLE_GPU.to_string(), (6 * GIB).to_string());
    let (code, out, err) = common::run(
        launcher
            .arg(programs().join(prog))
            .args(["--mode", mode, "--total", &total, "--pass", &past])
            .env("LD_LIBRARY_PATH", &driver)
            .env_remove("LD_PRELOAD")
            .current_dir(std::env::temp_dir()),
    );
    assert!(
        code == 0 && out.contains("verdict ok"),
        "control {prog} {mode}: {out}\n{err}"
    );
    out
}

/// PyTorch in every allocator mode, the pod created through containerd 2.3's CRI and fenced by
/// `gpufence nri` from kubelet's record (GPU 1 of two, 4 GiB).
#[test]
#[ignore = "downloads the PyTorch and CuPy wheels (about 5.5 GiB) once: make test-frameworks"]
fn torch_is_held_to_its_slice_in_a_pod_fenced_through_nri() {
    let Some((bin, py)) = cri_support::prerequisites() else {
        return;
    };
    let venv = frameworks_venv(&[]);
    let python = venv.join("bin/python");
    let (s, node, cdir, _, c) =
        cri_support::gpu1::gpu1_node(&bin, "frameworks-nri", &["torch-pod"]);
    let rootfs = common::glibc_rootfs(&s.join("image-src-python"));
    let binds = host_binds(&venv, &rootfs);
    cri_support::import_rootfs(&s, &c, "python", &rootfs, &["PATH=/bin:/usr/bin"]);
    let _plugin =
        cri_support::spawn_nri(&node.config, &cdir.join("nri.sock"), &s.join("nri.stderr"));
    cri_support::wait_registered(&node.log, 1);

    let torch: Vec<Check> = checks(SLICE)
        .into_iter()
        .filter(|c| c.1 == "torch_slice.py")
        .collect();
    let mut req = cri_support::gpu1::gpu1_request("4Gi", "localhost/python:test");
    req["timeout"] = json!(300);
    req["mounts"] = binds
        .iter()
        .map(|(h, i)| json!({"host_path": h, "container_path": i, "readonly": true}))
        .collect();
    let r = cri_support::request(
        &py,
        &c.sock,
        &s,
        "torch-pod",
        &container_script(&python, &torch),
        req,
    );
    assert_eq!(r["stage"], "done", "{r}");
    let out = r["log"].as_str().unwrap();
    println!("{out}");
    assert_held(out, &torch, out);
}

/// XLA's allocator modes (tests/frameworks/jax_slice.py): the BFC allocator preallocating 75 %
/// (default) or half (`fraction`) of what it sees, growing on demand (`grow`), no pool
/// (`platform`), the stream-ordered pool (`async`).
const JAX_MODES: [&str; 5] = ["default", "fraction", "grow", "platform", "async"];

fn jax_checks(slice: u64) -> Vec<Check> {
    let jax = |name: &str, mode, extra: &[(&str, u64)]| {
        slice_check(name, "jax_slice.py", Some(mode), slice, extra)
    };
    let mut v: Vec<Check> = JAX_MODES
        .into_iter()
        .map(|m| jax(&format!("jax-{m}"), m, &[]))
        .collect();
    // two processes of one container share the slice: a neighbour holds 1 GiB first
    v.push(jax("jax-shared", "default", &[("--held", GIB)]));
    v
}

/// JAX (`jax[cuda13]==0.10.2`, its own venv: the CUDA 13.5 wheels) inside a gpufence-runtime
/// container: `cudaMemGetInfo` shows the slice, XLA's preallocation is 75 % of the slice
/// (`memory_stats()["bytes_limit"]`), `XLA_PYTHON_CLIENT_MEM_FRACTION` a fraction of it, every
/// allocator mode stops at it, and a second process shares it; the control sees 80 GiB.
#[test]
#[ignore = "downloads the JAX wheels (about 4.4 GiB) once: make test-frameworks"]
fn jax_is_held_to_its_slice_inside_a_gpufence_container() {
    if common::skip_unless(&["runc", "unshare"]) {
        return;
    }
    let venv = frameworks_venv(&["jax"]);
    let python = venv.join("bin/python");
    let s = common::scratch("frameworks-jax");
    let n = node(&s, 1, &[]);
    let checks = jax_checks(SLICE);
    let out = run_in_gpufence_container(&s, &n, &venv, &checks);
    for (name, section) in sections(&out).iter().filter(|g| g.0 != "end") {
        // XLA's limit is its fraction of the slice, not of the GPU
        let want = match name.as_str() {
            "jax-fraction" => SLICE / 2,
            "jax-platform" => SLICE,
            _ => SLICE / 4 * 3,
        };
        assert_eq!(
            value(section, "bytes_limit"),
            Some(want),
            "{name}: {section}"
        );
    }
    jax_control_without_gpufence(&n.dir, &python);
}

/// jax_slice.py on the simulated node without gpufence, in a mount namespace of its own whose
/// `/dev` also shows the node's device nodes (JAX looks for `/dev/nvidia0` before it loads its
/// CUDA plugin; the host has none): the whole GPU, and past 4 GiB.
fn jax_control_without_gpufence(node_dir: &Path, python: &Path) {
    let with_devices = "mount --make-rprivate / && \
        mount -t overlay overlay -o \"lowerdir=$0/dev:/dev\" /dev && exec \"$@\"";
    for mode in JAX_MODES {
        let mut unshare = Command::new("unshare");
        unshare
            .args(["-m", "sh", "-c", with_devices])
            .arg(node_dir)
            .arg(python);
        let out = control_check(node_dir, unshare, "jax_slice.py", mode);
        assert_eq!(value(&out, "memGetInfo"), Some(WHOLE_GPU), "{out}");
    }
}
