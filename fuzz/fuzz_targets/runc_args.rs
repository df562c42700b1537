//! runc's argv as gpufence-runtime receives it (NUL-separated arguments, any bytes).
#![no_main]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use gpufence::runtime::args::parse;
use gpufence::text::valid_container_id;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let args: Vec<OsString> = if data.is_empty() {
        vec![]
    } else {
        data.split(|&b| b == 0)
            .map(|a| OsString::from_vec(a.to_vec()))
            .collect()
    };
    let r = parse(&args);
    let lossy: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // Everything extracted is one of the arguments (or the inline value of a `--flag=value`).
    let from_args = |v: &str| {
        lossy
            .iter()
            .any(|a| a == v || a.split_once('=').is_some_and(|(_, x)| x == v))
    };
    if let Some(sub) = &r.subcommand {
        assert!(lossy.contains(sub), "subcommand {sub:?} not in argv");
    }
    if let Some(id) = &r.container_id {
        assert!(r.subcommand.is_some(), "container id without a subcommand");
        assert!(lossy.contains(id), "id {id:?} not in argv");
    }
    for p in [&r.bundle, &r.log, &r.root].into_iter().flatten() {
        assert!(from_args(&p.to_string_lossy()), "{p:?} not in argv");
    }
    if r.bundle.is_some() {
        assert!(r.is_create(), "bundle outside create/run");
    }
    if let Some(id) = &r.container_id
        && valid_container_id(id)
    {
        assert!(!id.contains('/') && id != "." && id != ".." && id.len() <= 255);
    }
    // Deterministic.
    assert_eq!(parse(&args), r);
});
