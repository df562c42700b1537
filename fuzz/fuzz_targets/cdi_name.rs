//! CDI qualified device names (`vendor/class=name`), kinds, `cdi.k8s.io/*` annotation keys and
//! values, as read from container annotations.
#![no_main]

use gpufence::cdi::parse::{
    parse_annotation_value, parse_kind, parse_qualified_name, validate_annotation_key,
    validate_device_name, validate_vendor_or_class,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match parse_qualified_name(s) {
        Ok(q) => {
            // Round-trips, and each part passes its own validator.
            assert_eq!(q.to_string(), s);
            assert_eq!(parse_qualified_name(&q.to_string()).as_ref(), Ok(&q));
            assert!(validate_vendor_or_class("v", &q.vendor).is_ok());
            assert!(validate_vendor_or_class("c", &q.class).is_ok());
            assert!(validate_device_name(&q.name).is_ok());
            assert_eq!(
                parse_kind(&q.kind()),
                Ok((q.vendor.clone(), q.class.clone()))
            );
            // Nothing that could escape a path or an env/annotation syntax.
            assert!(!q.name.contains(['/', ',', '=']) && !q.name.is_empty() && q.name != "..");
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
    if let Ok((v, c)) = parse_kind(s) {
        assert_eq!(format!("{v}/{c}"), s);
    }
    let key = format!("cdi.k8s.io/{s}");
    if validate_annotation_key(&key).is_ok() {
        assert!(s.len() <= 63 && !s.is_empty());
        assert!(
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        );
    }
    assert!(validate_annotation_key(s).is_err() || s.starts_with("cdi.k8s.io/"));
    if let Ok(names) = parse_annotation_value(s) {
        // Every listed device parses on its own; the count matches the comma list.
        assert_eq!(names.len(), s.split(',').count());
        for (q, part) in names.iter().zip(s.split(',')) {
            assert_eq!(q.to_string(), part.trim());
        }
    }
});
