//! Allocation intake + plan from an untrusted `config.json` (annotations, `process.env`, mounts).
//! Input: two config-selector bytes, then the config.json text.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../common/plan_check.rs"]
mod plan_check;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let config = plan_check::config(data[0], data[1]);
    let Ok(spec) = serde_json::from_slice::<serde_json::Value>(&data[2..]) else {
        return;
    };
    let inv = plan_check::inventory();
    let specs = plan_check::foreign_specs();
    match gpufence::plan::plan(&spec, "ctr-1", &inv, &config, &specs) {
        Ok(p) => {
            plan_check::check(&p, &inv);
            // Deterministic: the runtime and the hook compute the same plan independently.
            let again = gpufence::plan::plan(&spec, "ctr-1", &inv, &config, &specs);
            assert_eq!(again.as_ref(), Ok(&p));
        }
        Err(e) => {
            let line = e.to_string();
            assert!(!line.contains('\n'), "multi-line error: {line}");
            assert!(line.len() < 2000, "error of {} bytes", line.len());
        }
    }
});
