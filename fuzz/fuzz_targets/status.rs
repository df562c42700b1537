//! What `gpufence ps` and the exporter read from the state directory, all of it writable or
//! influenced by someone else: the accounting region (every process of the container writes
//! it), the status record, the create-refusal counters. Never a panic, figures within bounds.
#![no_main]

use gpufence::status::{meta::Meta, refusals, region};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    match sel % 4 {
        // a region: a stamped base patched with (offset, value) pairs from the input
        0 => {
            let mut b = region::blank();
            for p in rest.chunks_exact(12) {
                let at = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize % (b.len() - 7);
                b[at..at + 8].copy_from_slice(&p[4..12]);
            }
            region::check_decoded(&b, usize::from(sel / 4));
        }
        // raw bytes as a region (wrong sizes, garbage headers)
        1 => region::check_decoded(rest, usize::from(sel / 4)),
        2 => {
            if let Ok(m) = Meta::parse(rest) {
                for s in [&m.namespace, &m.pod, &m.container].into_iter().flatten() {
                    assert!(s.len() <= 253 && !s.chars().any(char::is_control), "{s:?}");
                }
                assert!(m.devices.len() <= gpufence::quota::MAX_DEVICES);
                let again = Meta::parse(&serde_json::to_vec(&m).unwrap()).unwrap();
                assert_eq!(again, m);
            }
        }
        _ => assert_eq!(refusals::decode(rest).len(), refusals::REASONS.len()),
    }
});
