//! The share of a shared DRA device (KEP-5075) as its driver wrote it on the claim's CDI device
//! — gpufence's CDI annotations `gpufence.dev/memory|cores`, HAMi's env
//! `CUDA_DEVICE_MEMORY_LIMIT_<i>` / `CUDA_DEVICE_SM_LIMIT` — read from a spec file of the
//! engine's CDI directories. Input: one selector byte (even = `.json`, odd = `.yaml`), then the
//! file text. Every device of a spec that parses: no panic, the same answer twice; a share is
//! never empty, never 0 bytes, its compute 1-100 %, named by the file it came from; an error is
//! one line naming the file.
#![no_main]

use std::path::{Path, PathBuf};

use gpufence::allocation::dra_share;
use gpufence::cdi::LoadedSpec;
use gpufence::cdi::parse::parse_spec;
use libfuzzer_sys::fuzz_target;

#[path = "../common/cdi_input.rs"]
mod cdi_input;

fuzz_target!(|data: &[u8]| {
    let Some((path, text)) = cdi_input::split(data, "/var/run/cdi/claim") else {
        return;
    };
    let Ok(spec) = parse_spec(text, Path::new(&path)) else {
        return;
    };
    let loaded = LoadedSpec {
        path: PathBuf::from(&path),
        priority: 1,
        spec,
    };
    for dev in &loaded.spec.devices {
        let share = dra_share::read(&loaded, dev);
        assert_eq!(share, dra_share::read(&loaded, dev), "not deterministic");
        match share {
            Ok(None) => {}
            Ok(Some(s)) => {
                assert!(!s.is_empty() && !s.shown().is_empty(), "{s:?}");
                assert_ne!(s.memory, Some(0), "{s:?}");
                assert!(s.cores.is_none_or(|c| (1..=100).contains(&c)), "{s:?}");
                assert!(s.source.starts_with(&path), "{s:?}");
            }
            Err(e) => {
                assert!(!e.contains('\n'), "multi-line error: {e}");
                assert!(e.starts_with(&path), "error not naming the file: {e}");
            }
        }
    }
});
