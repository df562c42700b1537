//! The proptest configuration of the property test binaries: bounded by default so `make test`
//! stays quick; `GPUFENCE_FUZZ_CASES` raises the number of cases for a longer run.

use proptest::test_runner::Config as ProptestConfig;

pub fn cases(default: u32) -> ProptestConfig {
    let n = std::env::var("GPUFENCE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}
