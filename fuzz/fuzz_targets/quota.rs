//! The quota file (`/run/gpufence/quota`), parsed by the host and by `libgpufence.so` inside
//! the container (the same source file is compiled into the shim).
#![no_main]

use gpufence::quota::{MAX_DEVICES, Quota};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Quota::parse(text) {
        Ok(q) => {
            assert!(q.devices.len() <= MAX_DEVICES);
            assert!(
                q.devices.windows(2).all(|w| w[0].ordinal < w[1].ordinal),
                "{q:?}"
            );
            for d in &q.devices {
                assert!((d.ordinal as usize) < MAX_DEVICES);
                if let Some(c) = d.cores {
                    assert!((1..=100).contains(&c));
                }
                assert!(!d.uuid.contains('\n'));
            }
            // render → parse is the identity, and rendering is a fixed point.
            let r = q.render();
            let back = Quota::parse(&r).unwrap_or_else(|e| panic!("{e}: {r:?}"));
            assert_eq!(back, q, "render/parse of {r:?}");
            assert_eq!(back.render(), r);
        }
        Err(e) => assert!(e.line <= text.lines().count()),
    }
});
