//! The region's shape, as every process of a container and every host-side reader must agree on
//! it: the quota devices it counts, its slots, and the magic and layout words its header starts
//! with (region.rs).

pub const MAX_DEVICES: usize = 64;
pub const SLOTS: usize = 1024;
pub const MAGIC: u64 = 0x6770_7566_656e_6365; // "gpufence"
/// Bits 40..: layout revision (2: `slots_hwm` in the header; 3: the stats block follows the
/// slots).
pub const LAYOUT: u64 = ((SLOTS as u64) << 16) | MAX_DEVICES as u64 | (3 << 40);
