//! CDI spec files (JSON or YAML) as found in /etc/cdi and /var/run/cdi. Input: one selector
//! byte (even = `.json`, odd = `.yaml`), then the file text.
#![no_main]

use std::path::Path;

use gpufence::cdi::parse::{minimum_version, parse_spec, validate_spec};
use libfuzzer_sys::fuzz_target;

#[path = "../common/cdi_input.rs"]
mod cdi_input;

fuzz_target!(|data: &[u8]| {
    let Some((path, text)) = cdi_input::split(data, "/etc/cdi/f") else {
        return;
    };
    match parse_spec(text, Path::new(&path)) {
        Ok(spec) => {
            assert!(validate_spec(&spec).is_ok());
            let _ = minimum_version(&spec);
            // What gpufence would write back (`cdi generate` serialises the same types) parses
            // to the same spec in both formats.
            let json = serde_json::to_string(&spec).expect("serialise spec");
            let back = parse_spec(&json, Path::new("/etc/cdi/back.json"));
            assert_eq!(back.as_ref().ok(), Some(&spec), "JSON round trip of {json}");
        }
        Err(e) => {
            let line = e.to_string();
            assert!(!line.contains('\n'), "multi-line error: {line}");
        }
    }
});
