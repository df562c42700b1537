//! What libgpufence.so records for `gpufence ps` and the exporter, on the simulated node outside
//! containers: the peak, refusals (count and last size) in the region's stats block, and the
//! one-line explanation of a refusal on the process's stderr — once per process, silenced by
//! the quota file or the process's env. Needs root (fake device nodes) and gcc.

mod common;
#[path = "fixtures/cuda_harness.rs"]
mod harness;

use gpufence::status::region;
use harness::{MIB, Node};

fn said(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| l.starts_with("gpufence: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn refusals_are_counted_and_explained_once() {
    let Some(node) = Node::new("obs-shim", &[1024]) else {
        return;
    };
    let quota = node.quota(&[(0, 0, 10 * MIB)]);
    let args = [
        "alloc", "8388608", "alloc", "4194304", "alloc", "5242880", "free", "alloc", "1048576",
    ];
    let st = node.state("loud", Some(&quota));
    let o = node.client("dlsym", &st, &args).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("alloc 4194304 err 2") && out.contains("alloc 5242880 err 2"),
        "{out}"
    );
    assert_eq!(
        said(&o.stderr),
        [
            "gpufence: cuMemAlloc of 4.0 MiB refused on GPU 0: 8.0 MiB of this container's 10 MiB quota in use"
        ]
    );
    let bytes = std::fs::read(st.join(region::FILE_NAME)).unwrap();
    let d = region::decode(&bytes, 1).unwrap().devices[0];
    assert_eq!(d.peak, Some(8 * MIB));
    assert_eq!((d.refusals, d.last_refused), (Some(2), Some(5 * MIB)));
    assert_eq!(d.used, MIB, "what the process still held when it exited");

    // Silenced by the quota file (shim.refusal-messages = false) …
    let st = node.state("quiet", Some(&format!("{quota}refusal-messages=0\n")));
    let o = node.client("dlsym", &st, &args).output().unwrap();
    assert!(
        said(&o.stderr).is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let bytes = std::fs::read(st.join(region::FILE_NAME)).unwrap();
    assert_eq!(
        region::decode(&bytes, 1).unwrap().devices[0].refusals,
        Some(2),
        "still counted"
    );
    // … or by the process itself.
    let st = node.state("env", Some(&quota));
    let o = node
        .client("dlsym", &st, &args)
        .env("GPUFENCE_REFUSAL_MESSAGES", "0")
        .output()
        .unwrap();
    assert!(said(&o.stderr).is_empty());
}
