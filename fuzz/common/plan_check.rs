//! The plan fuzz target's fixed inputs (the hand-built inventory of the allocation tests, a
//! config chosen by the input's first bytes, one foreign CDI spec) and its invariants: the same
//! ones `tests/alloc_fuzz.rs` checks (`alloc_support::check_plan`, shared by both).

use gpufence::config::{Config, Dialect, MemoryUnit, ShimInject, TrustEnv};

#[path = "../../tests/alloc_support/mod.rs"]
mod alloc_support;

pub use alloc_support::inventory;

/// A node config from two selector bytes: which dialects are enabled, which are trusted from the
/// environment, shim injection, HAMi-core library, gpushare memory unit.
pub fn config(a: u8, b: u8) -> Config {
    let mut c = alloc_support::config();
    c.allocation.dialects = Dialect::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| a & (1 << i) == 0)
        .map(|(_, d)| *d)
        .collect();
    c.allocation.trust_env = match (a >> 5) & 3 {
        0 => TrustEnv::All(false),
        1 => TrustEnv::All(true),
        2 => TrustEnv::Dialects(vec![Dialect::Hami, Dialect::Gpushare, Dialect::Nvidia]),
        _ => TrustEnv::Dialects(
            [Dialect::Hami, Dialect::Gpushare, Dialect::Nvidia]
                .into_iter()
                .enumerate()
                .filter(|(i, _)| b & (1 << i) != 0)
                .map(|(_, d)| d)
                .collect(),
        ),
    };
    if a & 0x80 != 0 {
        c.shim.inject = ShimInject::Env;
    }
    if b & 0x08 != 0 {
        c.shim.library = "/usr/local/vgpu/libvgpu.so".into();
    }
    if b & 0x10 != 0 {
        c.gpushare.memory_unit = MemoryUnit::MiB;
    }
    c
}

pub use alloc_support::{check_plan as check, foreign_specs};
