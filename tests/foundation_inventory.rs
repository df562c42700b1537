//! Inventory against simulated nodes of 1, 8 and 8-with-MIG GPUs (real device nodes, the mock
//! NVML loaded through nvml-wrapper), the cache and its invalidation, live device numbers, and
//! the one-line errors of `gpufence inventory` / `gpufence cdi generate`.
//! Needs root (mknod); skips otherwise (fails under CI).

mod common;

use std::path::PathBuf;
use std::process::Command;

use gpufence::config::Config;
use gpufence::inventory::{self, Capability, FileKind};

const GIB: u64 = 1 << 30;

fn sim(name: &str, gpus: u32, mig: Option<&str>) -> (PathBuf, Config) {
    let dir = common::scratch(name);
    let mut cmd = Command::new(common::bin("gpufence-sim"));
    cmd.args(["node", "--dir"])
        .arg(&dir)
        .args(["--gpus", &gpus.to_string()]);
    if let Some(m) = mig {
        cmd.args(["--mig-gpu", m]);
    }
    let (rc, out, err) = common::run(&mut cmd);
    assert_eq!(rc, 0, "gpufence-sim: {err}");
    let cfg_path = PathBuf::from(out.trim());
    assert_eq!(
        cfg_path,
        dir.canonicalize().unwrap().join("config.toml"),
        "stdout is only the config path"
    );
    let cfg = Config::load(Some(&cfg_path)).unwrap();
    (dir, cfg)
}

fn gpufence(cfg: &Config, args: &[&str]) -> (i32, String, String) {
    common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(cfg.source.as_ref().unwrap())
            .args(args),
    )
}

#[test]
fn one_gpu() {
    if common::skip_unless(&[]) {
        return;
    }
    let (dir, cfg) = sim("inv1", 1, None);
    let inv = inventory::scan(&cfg).unwrap();
    assert_eq!(inv.driver_version, "580.65.06");
    // what a real 580 driver reports
    assert_eq!(inv.cuda_driver_version, 13000);
    assert_eq!(inv.gpus.len(), 1);
    let g = &inv.gpus[0];
    assert_eq!((g.index, g.minor), (0, 0));
    assert_eq!(g.name, "NVIDIA H100 80GB HBM3");
    assert_eq!(g.memory_bytes, 81559 << 20);
    assert_eq!(g.compute_capability, (9, 0));
    assert_eq!(g.pci_bus_id, "00000000:18:00.0");
    assert!(g.uuid.starts_with("GPU-"));
    assert!(g.mig_capable && !g.mig_enabled && g.mig_devices.is_empty());
    assert_eq!(g.node.path, "/dev/nvidia0");
    assert_eq!(
        g.node.host_path,
        dir.canonicalize().unwrap().join("dev/nvidia0")
    );
    assert_eq!((g.node.kind, g.node.major, g.node.minor), ('c', 195, 0));

    let ctl: Vec<_> = inv
        .control_nodes
        .iter()
        .map(|n| (n.path.as_str(), n.major, n.minor))
        .collect();
    assert_eq!(
        ctl,
        [
            ("/dev/nvidiactl", 195, 255),
            ("/dev/nvidia-uvm", 509, 0),
            ("/dev/nvidia-uvm-tools", 509, 1),
            ("/dev/nvidia-modeset", 195, 254)
        ]
    );

    let f = |p: &str| {
        inv.driver_files
            .iter()
            .find(|f| f.container_path == p)
            .unwrap_or_else(|| panic!("{p} missing from {:#?}", inv.driver_files))
    };
    let nvml = f("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.65.06");
    assert_eq!(
        (nvml.kind, nvml.capability),
        (FileKind::Library, Capability::Utility)
    );
    assert_eq!(nvml.soname.as_deref(), Some("libnvidia-ml.so.1"));
    assert_eq!(
        nvml.host_path,
        cfg.driver_root
            .join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.65.06")
    );
    let cuda = f("/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06");
    assert_eq!(
        (cuda.capability, cuda.soname.as_deref()),
        (Capability::Compute, Some("libcuda.so.1"))
    );
    assert_eq!(
        f("/usr/lib/x86_64-linux-gnu/libnvidia-encode.so.580.65.06").capability,
        Capability::Video
    );
    assert_eq!(
        f("/usr/lib/x86_64-linux-gnu/libnvcuvid.so.580.65.06")
            .soname
            .as_deref(),
        Some("libnvcuvid.so.1")
    );
    assert_eq!(
        f("/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.580.65.06").capability,
        Capability::Graphics
    );
    assert_eq!(
        f("/usr/lib/x86_64-linux-gnu/libnvidia-glcore.so.580.65.06")
            .soname
            .as_deref(),
        Some("libnvidia-glcore.so.580.65.06")
    );
    assert_eq!(
        (
            f("/usr/bin/nvidia-smi").kind,
            f("/usr/bin/nvidia-smi").capability
        ),
        (FileKind::Binary, Capability::Utility)
    );
    assert_eq!(
        f("/lib/firmware/nvidia/580.65.06/gsp_ga10x.bin").kind,
        FileKind::Firmware
    );
    assert_eq!(
        f("/lib/firmware/nvidia/580.65.06/gsp_tu10x.bin").kind,
        FileKind::Firmware
    );
    // Soname links are not driver files (the ldcache hook recreates them).
    assert!(
        inv.driver_files
            .iter()
            .all(|f| !f.container_path.ends_with(".so.1"))
    );

    // The table and the JSON of the CLI.
    let (rc, out, err) = gpufence(&cfg, &["inventory"]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("GPU 0  GPU-") && out.contains("81559 MiB") && out.contains("compute:"),
        "{out}"
    );
    let (rc, out, _) = gpufence(&cfg, &["inventory", "--json"]);
    assert_eq!(rc, 0);
    let parsed: inventory::Inventory = serde_json::from_str(&out).unwrap();
    assert_eq!(parsed, inv);
}

#[test]
fn eight_gpus() {
    if common::skip_unless(&[]) {
        return;
    }
    let (_dir, cfg) = sim("inv8", 8, None);
    let inv = inventory::scan(&cfg).unwrap();
    assert_eq!(inv.gpus.len(), 8);
    let mut uuids = std::collections::HashSet::new();
    for (i, g) in inv.gpus.iter().enumerate() {
        assert_eq!(g.index as usize, i);
        assert_eq!(g.minor as usize, i);
        assert_eq!(g.node.minor as usize, i);
        assert!(uuids.insert(g.uuid.clone()));
        assert!(g.mig_devices.is_empty());
    }
    let ids: Vec<_> = inv.gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "NVML order is PCI order");
    assert_eq!(
        inv.gpu_by_uuid(&inv.gpus[5].uuid.to_lowercase())
            .unwrap()
            .index,
        5
    );
}

#[test]
fn eight_gpus_all_mig() {
    if common::skip_unless(&[]) {
        return;
    }
    let (dir, cfg) = sim("inv8mig", 8, Some("all"));
    let inv = inventory::scan(&cfg).unwrap();
    assert_eq!(inv.gpus.len(), 8);
    let mut caps = std::collections::HashSet::new();
    for g in &inv.gpus {
        assert!(g.mig_enabled && g.mig_capable);
        assert_eq!(g.mig_devices.len(), 7);
        for (j, m) in g.mig_devices.iter().enumerate() {
            assert_eq!(m.index as usize, j);
            assert_eq!((m.gi, m.ci), (7 + j as u32, 0));
            assert_eq!(m.profile, "1g.10gb");
            assert_eq!(m.memory_bytes, 9984 << 20);
            assert!(m.memory_bytes < 10 * GIB);
            assert!(m.uuid.starts_with("MIG-"));
            assert_eq!(m.caps.len(), 2);
            for c in &m.caps {
                assert!(
                    c.path.starts_with("/dev/nvidia-caps/nvidia-cap"),
                    "{}",
                    c.path
                );
                assert_eq!(
                    c.host_path,
                    dir.canonicalize()
                        .unwrap()
                        .join(c.path.trim_start_matches('/'))
                );
                assert_eq!((c.kind, c.major), ('c', 510));
                assert_eq!(c.path, format!("/dev/nvidia-caps/nvidia-cap{}", c.minor));
                assert!(caps.insert(c.minor), "capability minors are unique");
            }
        }
    }
    assert_eq!(caps.len(), 8 * 7 * 2);
    let (g, m) = inv.mig_by_uuid(&inv.gpus[3].mig_devices[4].uuid).unwrap();
    assert_eq!((g.index, m.index), (3, 4));
}

#[test]
fn cache_is_used_and_invalidated() {
    if common::skip_unless(&[]) {
        return;
    }
    let (dir, cfg) = sim("invcache", 2, Some("1"));
    let first = inventory::load(&cfg).unwrap();
    assert!(cfg.state_dir.join(inventory::CACHE_FILE).is_file());

    // Break NVML: a warm cache must not need it.
    let node_file = cfg
        .driver_root
        .join("usr/lib/x86_64-linux-gnu/gpufence-mock-node.json");
    let good = std::fs::read(&node_file).unwrap();
    std::fs::write(&node_file, b"{ not json").unwrap();
    assert_eq!(
        inventory::load(&cfg).unwrap(),
        first,
        "served from the cache"
    );
    let (rc, _, err) = gpufence(&cfg, &["inventory"]);
    assert_eq!(rc, 0, "CLI uses the cache too: {err}");

    // A new device node changes the key → rescan → NVML's failure surfaces, as one line, exit 2.
    nix::sys::stat::mknod(
        &dir.join("dev/nvidia7"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(195, 7),
    )
    .unwrap();
    let e = inventory::load(&cfg).unwrap_err();
    assert!(e.to_string().contains(&cfg.nvml_library), "{e}");
    let (rc, _, err) = gpufence(&cfg, &["inventory"]);
    assert_eq!(rc, 2, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("libnvidia-ml.so.1") && err.contains("NVML"),
        "{err}"
    );
    std::fs::remove_file(dir.join("dev/nvidia7")).unwrap();
    std::fs::write(&node_file, &good).unwrap();
    assert_eq!(inventory::load(&cfg).unwrap(), first);

    // A driver upgrade (version line) invalidates too.
    let ver = dir.join("proc/driver/nvidia/version");
    let text = std::fs::read_to_string(&ver).unwrap();
    let key_before = inventory::cache_key(&cfg).unwrap();
    std::fs::write(&ver, text.replace("580.65.06", "580.82.07")).unwrap();
    assert_ne!(inventory::cache_key(&cfg).unwrap(), key_before);
}

#[test]
fn device_numbers_are_live() {
    if common::skip_unless(&[]) {
        return;
    }
    let (dir, cfg) = sim("invlive", 1, None);
    let mut inv = inventory::load(&cfg).unwrap();
    // The uvm module was reloaded with a new dynamic major.
    for (name, minor) in [("nvidia-uvm", 0), ("nvidia-uvm-tools", 1)] {
        let p = dir.join("dev").join(name);
        std::fs::remove_file(&p).unwrap();
        nix::sys::stat::mknod(
            &p,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(497, minor),
        )
        .unwrap();
    }
    inventory::refresh_device_numbers(&mut inv, &cfg).unwrap();
    let uvm = inv
        .control_nodes
        .iter()
        .find(|n| n.path == "/dev/nvidia-uvm")
        .unwrap();
    assert_eq!((uvm.major, uvm.minor), (497, 0));
    // And the cache notices (the key carries device numbers).
    assert_eq!(
        inventory::load(&cfg)
            .unwrap()
            .control_nodes
            .iter()
            .find(|n| n.path == "/dev/nvidia-uvm")
            .unwrap()
            .major,
        497
    );
    // A node that disappeared is an error naming it.
    std::fs::remove_file(dir.join("dev/nvidia0")).unwrap();
    let e = inventory::refresh_device_numbers(&mut inv, &cfg).unwrap_err();
    assert!(e.to_string().contains("dev/nvidia0"), "{e}");
}

#[test]
fn nvml_missing_or_broken_is_one_line_exit_2() {
    if common::skip_unless(&[]) {
        return;
    }
    let (dir, cfg) = sim("invnvml", 1, None);
    let cfg_path = dir.join("config-missing.toml");
    let text = std::fs::read_to_string(cfg.source.as_ref().unwrap()).unwrap();
    std::fs::write(
        &cfg_path,
        text.replace(&cfg.nvml_library, "/nonexistent/libnvidia-ml.so.1"),
    )
    .unwrap();
    let (rc, _, err) = common::run(
        Command::new(common::bin("gpufence"))
            .arg("--config")
            .arg(&cfg_path)
            .arg("inventory"),
    );
    assert_eq!(rc, 2);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/libnvidia-ml.so.1"), "{err}");

    // A node file that does not parse: the mock's init fails and gpufence says so.
    std::fs::write(
        cfg.driver_root
            .join("usr/lib/x86_64-linux-gnu/gpufence-mock-node.json"),
        b"[]",
    )
    .unwrap();
    let (rc, _, err) = gpufence(&cfg, &["cdi", "generate"]);
    assert_eq!(rc, 2, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(&cfg.nvml_library) && err.contains("init"),
        "{err}"
    );
}

#[test]
fn cdi_output_errors_leave_no_file() {
    if common::skip_unless(&[]) {
        return;
    }
    let (dir, cfg) = sim("invcdiout", 1, None);
    let (rc, _, err) = gpufence(
        &cfg,
        &["cdi", "generate", "--output", "/nonexistent-dir/x.yaml"],
    );
    assert_eq!(rc, 1);
    assert!(
        err.contains("/nonexistent-dir") && err.contains("does not exist"),
        "{err}"
    );

    // A read-only directory (root ignores mode bits, so use a read-only mount).
    let ro = dir.join("ro");
    std::fs::create_dir(&ro).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &ro,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .unwrap();
    let (rc, _, err) = gpufence(
        &cfg,
        &[
            "cdi",
            "generate",
            "--output",
            ro.join("spec.json").to_str().unwrap(),
        ],
    );
    let listing: Vec<_> = std::fs::read_dir(&ro).unwrap().collect();
    nix::mount::umount(&ro).unwrap();
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("Read-only"), "{err}");
    assert!(listing.is_empty(), "no partial file");

    // Success: atomic, parseable, mode 0644.
    let out = dir.join("spec.yaml");
    let (rc, _, err) = gpufence(
        &cfg,
        &["cdi", "generate", "--output", out.to_str().unwrap()],
    );
    assert_eq!(rc, 0, "{err}");
    let spec: gpufence::cdi::Spec =
        yaml_serde::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(spec.cdi_version, "0.5.0");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o644
    );
}
