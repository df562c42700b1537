//! A refused allocation explains itself: one line on the process's stderr, the first time only
//! (per process; a forked child may say it again), unless the quota file or the process's env
//! silence it. Only on the refusal path: formatting allocates, which is fine there.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::human::size;
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
