//! Kubernetes quantities (`gpufence.dev/memory`) and HAMi memory limits
//! (`CUDA_DEVICE_MEMORY_LIMIT_<i>`).
#![no_main]

use gpufence::quantity::{MAX_LEN, format_bytes, parse_hami_bytes, parse_k8s_bytes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let k8s = parse_k8s_bytes(s);
    let hami = parse_hami_bytes(s);
    let t = s.trim();
    for r in [&k8s, &hami] {
        if r.is_ok() {
            assert!(!t.is_empty() && t.len() <= MAX_LEN, "accepted {s:?}");
        }
    }
    if let Ok(n) = k8s {
        // What gpufence prints (plan notes, errors) reads back as the same number of bytes.
        assert_eq!(
            parse_k8s_bytes(&format_bytes(n)),
            Ok(n),
            "format_bytes({n})"
        );
        assert_eq!(parse_k8s_bytes(&n.to_string()), Ok(n));
    }
    if let Ok(n) = hami {
        // HAMi's k/m/g are binary: the same as Kubernetes' Ki/Mi/Gi; no suffix = bytes.
        let digits = t.trim_end_matches(|c: char| !c.is_ascii_digit());
        let as_k8s = match &t[digits.len()..] {
            "" => digits.to_string(),
            "k" | "K" => format!("{digits}Ki"),
            "m" | "M" => format!("{digits}Mi"),
            "g" | "G" => format!("{digits}Gi"),
            other => panic!("HAMi accepted suffix {other:?} in {s:?}"),
        };
        if as_k8s.len() <= MAX_LEN {
            assert_eq!(parse_k8s_bytes(&as_k8s), Ok(n), "{s:?} vs {as_k8s:?}");
        }
    }
    // Plain decimal integers mean bytes to both parsers.
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) && t.len() <= MAX_LEN {
        match t.parse::<u64>() {
            Ok(n) => {
                assert_eq!(k8s, Ok(n), "{s:?}");
                assert_eq!(hami, Ok(n), "{s:?}");
            }
            Err(_) => assert!(k8s.is_err() && hami.is_err(), "{s:?} overflows u64"),
        }
    }
});
