//! In-process timings on a simulated 8-GPU node with MIG on every GPU (7 instances each):
//! `inventory::load` from a warm cache (aim < 2 ms), a fresh `inventory::scan` through the mock
//! NVML, and each stage of `gpufence cdi generate` (aim < 50 ms in all). The baseline, measured
//! in the same run, is reading the cache file's bytes (the I/O floor of a warm load); each result
//! is also given as a ratio to it. The whole-process view is `benches/cdi_inventory.sh`.
//! Needs root (mknod); `make test` builds the workspace first so the mocks exist.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use gpufence::cdigen::generate;
use gpufence::config::Config;
use gpufence::inventory;

#[path = "support/mod.rs"]
mod support;
use support::time;

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("cdi_inventory bench: needs root (mknod); skipped");
        return;
    }
    let sim = PathBuf::from(env!("CARGO_BIN_EXE_gpufence-sim"));
    let dir = tempfile::Builder::new()
        .prefix("gpufence-bench")
        .tempdir()
        .unwrap();
    let out = Command::new(&sim)
        .args(["node", "--dir"])
        .arg(dir.path().join("node"))
        .args(["--gpus", "8", "--mig-gpu", "all"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cfg_path = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let cfg = Config::load(Some(&cfg_path)).unwrap();
    let cache = cfg.state_dir.join(inventory::CACHE_FILE);

    let inv = inventory::load(&cfg).unwrap(); // scans and writes the cache
    assert_eq!(
        inv.gpus.iter().map(|g| g.mig_devices.len()).sum::<usize>(),
        56
    );
    let n = 500;
    let base = time(n, || std::fs::read(&cache).unwrap());
    let rows: Vec<(&str, Duration)> = vec![
        (
            "inventory::load, warm cache (aim < 2 ms)",
            time(n, || inventory::load(&cfg).unwrap()),
        ),
        (
            "inventory::cache_key (no NVML)",
            time(n, || inventory::cache_key(&cfg).unwrap()),
        ),
        (
            "inventory::refresh_device_numbers",
            time(n, || {
                let mut i = inv.clone();
                inventory::refresh_device_numbers(&mut i, &cfg).unwrap();
                i
            }),
        ),
        (
            "inventory::scan (mock NVML + files)",
            time(50, || inventory::scan(&cfg).unwrap()),
        ),
        (
            "cdi generate: build spec",
            time(n, || generate::generate(&inv, &cfg)),
        ),
    ];
    let spec = generate::generate(&inv, &cfg);
    let yaml = generate::render(&spec, generate::Format::Yaml).unwrap();
    let out_path = dir.path().join("spec.yaml");
    let mut rows = rows;
    rows.push((
        "cdi generate: render YAML",
        time(n, || {
            generate::render(&spec, generate::Format::Yaml).unwrap()
        }),
    ));
    rows.push((
        "cdi generate: render JSON",
        time(n, || {
            generate::render(&spec, generate::Format::Json).unwrap()
        }),
    ));
    rows.push((
        "cdi generate: atomic write (fsync+rename)",
        time(100, || {
            generate::write_atomic(&out_path, yaml.as_bytes()).unwrap()
        }),
    ));
    rows.push((
        "cdi generate end to end, warm cache (aim < 50 ms)",
        time(100, || {
            let mut i = inventory::load(&cfg).unwrap();
            inventory::refresh_device_numbers(&mut i, &cfg).unwrap();
            let s = generate::generate(&i, &cfg);
            generate::write_atomic(
                &out_path,
                generate::render(&s, generate::Format::Yaml)
                    .unwrap()
                    .as_bytes(),
            )
            .unwrap();
        }),
    ));

    println!(
        "cdi/inventory in-process bench: 8 GPUs x 7 MIG, {} CDI devices, cache {} bytes, spec {} bytes",
        spec.devices.len(),
        std::fs::metadata(&cache).unwrap().len(),
        yaml.len()
    );
    println!("{:<52} {:>10} {:>9}", "stage", "mean", "ratio");
    println!(
        "{:<52} {:>10.3?} {:>9}",
        "baseline: read the cache file's bytes", base, "1.0x"
    );
    for (name, d) in rows {
        println!(
            "{:<52} {:>10.3?} {:>8.1}x",
            name,
            d,
            d.as_secs_f64() / base.as_secs_f64()
        );
    }
}
