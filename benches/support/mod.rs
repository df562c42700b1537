//! What the in-process benches share.

use std::time::{Duration, Instant};

/// Mean time of one `f()` over `n` calls, after one warm-up call (results kept from the
/// optimiser).
pub fn time<T>(n: u32, mut f: impl FnMut() -> T) -> Duration {
    let _ = f(); // warm-up
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(f());
    }
    t.elapsed() / n
}
