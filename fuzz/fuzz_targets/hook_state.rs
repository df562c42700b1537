//! The OCI state JSON the hook reads on stdin (bounded read, then `parse_state`).
#![no_main]

use gpufence::hook::state::{MAX_STATE_BYTES, parse_state, read_bounded, valid_id};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let bytes = read_bounded(&mut &data[..], MAX_STATE_BYTES, "stdin").expect("fits the bound");
    assert_eq!(bytes, data);
    // The bound is exact: one byte over is refused, never truncated.
    if !data.is_empty() {
        let limit = data.len() as u64 - 1;
        assert!(read_bounded(&mut &data[..], limit, "stdin").is_err());
    }
    match parse_state(&bytes) {
        Ok(s) => {
            // What the hook goes on to use is safe: the id is a single path component, the pid
            // a real process other than init, the bundle absolute.
            assert!(valid_id(&s.id), "{:?}", s.id);
            assert!(!s.id.contains('/') && s.id != "." && s.id != "..");
            let pid = s.pid.expect("pid");
            assert!(pid > 1 && pid <= i64::from(i32::MAX));
            assert!(s.bundle.is_absolute());
            assert!(s.status.is_empty() || s.status == "creating" || s.status == "created");
        }
        Err(e) => {
            let line = e.to_string();
            assert!(!line.contains('\n'), "multi-line error: {line}");
            assert!(line.len() < 4096, "error of {} bytes", line.len());
        }
    }
});
