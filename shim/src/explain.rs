//! A refused allocation explains itself: one line on the process's stderr, the first time only
//! (per process; a forked child may say it again), unless the quota file or the process's env
//! silence it. Only on the refusal path: formatting allocates, which is fine there.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::state::{self, Acct, Config};

static SAID: AtomicBool = AtomicBool::new(false);

/// `what` (the driver call, e.g. `cuMemAlloc`) of `bytes` was refused on quota device `a`.
#[cold]
pub fn refused(cfg: &Config, a: Acct, what: &str, bytes: u64) {
    if !cfg.explain || SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    state::warn(&line(cfg, a, what, bytes));
}

fn line(cfg: &Config, a: Acct, what: &str, bytes: u64) -> String {
    let ordinal = cfg.entries.get(a.idx).map_or(a.idx as u32, |e| e.ordinal);
    format!(
        "{what} of {} refused on GPU {ordinal}: {} of this container's {} quota in use",
        size(bytes, false),
        size(cfg.region.used(a.idx), false),
        size(a.limit, true)
    )
}

/// Fork child: the child explains its own first refusal (atomics only).
pub fn forget_process() {
    SAID.store(false, Ordering::Relaxed);
}

/// `2.0 GiB`, `512.0 MiB`, `100 B`; `whole`: `4 GiB` when the value is a whole number of units.
pub fn size(b: u64, whole: bool) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut unit = 1024u64;
    let mut name = UNITS[0];
    for u in &UNITS[1..] {
        if b / unit < 1024 {
            break;
        }
        unit *= 1024;
        name = u;
    }
    if whole && b % unit == 0 {
        format!("{} {name}", b / unit)
    } else {
        format!("{:.1} {name}", b as f64 / unit as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::size;

    #[test]
    fn sizes() {
        let g = 1u64 << 30;
        assert_eq!(size(2 * g, false), "2.0 GiB");
        assert_eq!(size(7 * g / 2, false), "3.5 GiB");
        assert_eq!(size(4 * g, true), "4 GiB");
        assert_eq!(size(100 << 20, true), "100 MiB");
        assert_eq!(size(1536, true), "1.5 KiB");
        assert_eq!(size(1000, false), "1000 B");
        assert_eq!(size(u64::MAX, true), "16384.0 PiB");
    }
}
