//! In-process timing of the create path's ld cache merge on a real-sized cache: parse this
//! machine's `/etc/ld.so.cache` (≈ 550 entries on Debian 12; a CUDA base image's is of that
//! order), add five driver libraries where `ldconfig -r` would, serialise it in glibc's new
//! format. The baseline in the same run is reading the file's bytes; each stage is also given as
//! a ratio to it. `cargo bench --bench ldcache` (no root needed).

use std::time::Duration;

use gpufence::ldso::cache::{self, Entry, FLAG_ELF_LIBC6, FLAG_X8664_LIB64};

#[path = "support/mod.rs"]
mod support;
use support::time;

fn driver_entries() -> Vec<Entry> {
    [
        "libcuda.so.1",
        "libnvidia-ml.so.1",
        "libnvidia-ptxjitcompiler.so.1",
        "libnvidia-nvvm.so.4",
        "libnvidia-cfg.so.1",
    ]
    .iter()
    .map(|s| Entry {
        flags: FLAG_ELF_LIBC6 | FLAG_X8664_LIB64,
        key: s.as_bytes().to_vec(),
        value: format!("/usr/lib/x86_64-linux-gnu/{s}").into_bytes(),
        osversion: 0,
        hwcap: 0,
        hwcaps: None,
    })
    .collect()
}

fn main() {
    let path = std::env::var("LDCACHE").unwrap_or_else(|_| "/etc/ld.so.cache".into());
    let Ok(bytes) = std::fs::read(&path) else {
        eprintln!("ldcache bench: {path} not readable; skipped");
        return;
    };
    let n = 200;
    let read = time(n, || std::fs::read(&path).unwrap());
    let parsed = cache::parse(&bytes).expect("the host's cache parses");
    let parse = time(n, || cache::parse(&bytes).unwrap());
    let merge = time(n, || {
        let mut c = parsed.clone();
        for e in driver_entries() {
            c.add(e);
        }
        c
    });
    let mut merged = parsed.clone();
    for e in driver_entries() {
        merged.add(e);
    }
    let write = time(n, || cache::write(&merged).unwrap());
    let out = cache::write(&merged).unwrap();
    assert_eq!(
        cache::parse(&out).unwrap().entries.len(),
        parsed.entries.len() + 5
    );
    let ratio = |d: Duration| d.as_secs_f64() / read.as_secs_f64();
    println!(
        "ldcache bench: {} ({} entries, {} bytes), mean of {n} runs",
        path,
        parsed.entries.len(),
        bytes.len()
    );
    println!(
        "  read the file (baseline)   {:>9.1} µs",
        read.as_secs_f64() * 1e6
    );
    for (what, d) in [
        ("parse", parse),
        ("add 5 driver entries", merge),
        ("write (new format)", write),
    ] {
        println!(
            "  {what:26} {:>9.1} µs  ({:.1}× the read)",
            d.as_secs_f64() * 1e6,
            ratio(d)
        );
    }
}
