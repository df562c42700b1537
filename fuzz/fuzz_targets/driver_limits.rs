//! The driver backend's parsers of container-controlled input: `linux.cgroupsPath` (either of
//! runc's forms) resolved to the cgroup the NVML limit is set on, the `0::` line of
//! `/proc/<pid>/cgroup`, and the hook's `--limit <uuid>=<bytes>` arguments.
#![no_main]

use gpufence::backend::parse_limit;
use gpufence::inventory::limits::cgroup::{expected_path, v2_member};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let (a, b) = s.split_once('\n').unwrap_or((s, "/"));
    for systemd in [false, true] {
        match expected_path(Some(a), b, "ctr", systemd) {
            // Always an absolute, normalised path inside the hierarchy: never `..`, never `//`.
            Ok(p) => {
                assert!(p.starts_with('/'), "{p:?}");
                assert!(!p.split('/').any(|c| c == ".."), "{p:?}");
                assert!(!p.contains("//"), "{p:?}");
            }
            Err(e) => assert!(!e.to_string().contains('\n') || a.contains('\n')),
        }
    }
    if let Some(m) = v2_member(s) {
        assert!(s.contains(&format!("0::{m}")));
    }
    if let Ok(l) = parse_limit(a) {
        assert!(l.hard > 0 && l.uuid.starts_with("GPU-"));
        assert_eq!(parse_limit(&format!("{}={}", l.uuid, l.hard)), Ok(l));
    }
});
