//! Decoding a copy of a container's accounting region (its one layout definition is
//! [`gpufence_format::region`], which the shim maps). The bytes come from a file every process of the container
//! can write: decoding is bounds-checked, never panics, and its figures serve display only.

use gpufence_format::region as layout;

use layout::{MAX_DEVICES, SLOTS, offsets as off};

/// Bytes of a well-formed region (readers never read more).
pub const SIZE: usize = layout::SIZE;
/// File name inside the container's `/run/gpufence`.
pub const FILE_NAME: &str = layout::FILE_NAME;

/// Figures of one quota device (container ordinal order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceUsage {
    /// Bytes charged container-wide: the header's total, or the slots' sum where that is more
    /// (the shim's own view, `Region::used`).
    pub used: u64,
    /// Highest bytes charged (`None`: the region has no stats block this reader knows).
    pub peak: Option<u64>,
    /// Allocations refused.
    pub refusals: Option<u64>,
    /// Bytes asked by the last refused allocation.
    pub last_refused: Option<u64>,
    /// Device time charged by the compute-share limiter, once it writes it (non-zero).
    pub compute_ns: Option<u64>,
}

/// What a region says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub devices: Vec<DeviceUsage>,
    /// Processes holding device memory (pids in the container's pid namespace), ascending. A
    /// process that exited holding memory counts until the shim reclaims its slot (as its
    /// memory does in `used`).
    pub pids: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("accounting region is {0} bytes, expected {SIZE}")]
    Size(usize),
    #[error("accounting region has a foreign header (magic {magic:#x}, layout {layout:#x})")]
    Header { magic: u64, layout: u64 },
}

/// A fresh region as the first shim process leaves it (header and stats block stamped, nothing
/// charged): the base that tests and the fuzz target patch.
pub fn blank() -> Vec<u8> {
    let mut b = vec![0u8; SIZE];
    for (at, v) in [
        (off::MAGIC, layout::MAGIC),
        (off::LAYOUT, layout::LAYOUT),
        (off::STATS_VERSION, layout::stats::VERSION),
    ] {
        b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }
    b
}

/// Check what [`decode`] promises about any input (the fuzz target and the property test).
pub fn check_decoded(b: &[u8], devices: usize) {
    if let Ok(u) = decode(b, devices) {
        assert_eq!(u.devices.len(), devices.min(MAX_DEVICES));
        assert!(u.pids.len() <= SLOTS);
        assert!(u.pids.windows(2).all(|w| w[0] <= w[1]));
        for d in &u.devices {
            assert!(d.peak.is_none_or(|p| p >= d.used));
            assert!(d.compute_ns != Some(0));
        }
    }
}

fn word(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|w| <[u8; 8]>::try_from(w).ok())
        .map_or(0, u64::from_ne_bytes)
}

/// Decode the first `devices` quota devices from the file's first [`SIZE`] bytes (readers read
/// no more; sections after the region are not this decoder's). An empty file (no GPU process
/// yet) reads as zero usage; a shorter file or a foreign header is an error.
pub fn decode(b: &[u8], devices: usize) -> Result<Usage, DecodeError> {
    let devices = devices.min(MAX_DEVICES);
    if b.is_empty() {
        return Ok(Usage {
            devices: vec![DeviceUsage::default(); devices],
            pids: Vec::new(),
        });
    }
    if b.len() != SIZE {
        return Err(DecodeError::Size(b.len()));
    }
    let (magic, lay) = (word(b, off::MAGIC), word(b, off::LAYOUT));
    if magic == 0 && lay == 0 {
        // Sized but not stamped yet.
        return decode(&[], devices);
    }
    if magic != layout::MAGIC || lay != layout::LAYOUT {
        return Err(DecodeError::Header { magic, layout: lay });
    }
    let stats = word(b, off::STATS_VERSION) == layout::stats::VERSION;
    let at = |base: usize, d: usize| word(b, base + 8 * d);
    let slot_sum = |d: usize| {
        (0..SLOTS).fold(0u64, |acc, i| {
            acc.saturating_add(word(
                b,
                off::SLOTS + i * off::SLOT_SIZE + off::SLOT_USED + 8 * d,
            ))
        })
    };
    let devices = (0..devices)
        .map(|d| {
            let used = at(off::USED, d).max(slot_sum(d));
            DeviceUsage {
                used,
                peak: stats.then(|| at(off::PEAK, d).max(used)),
                refusals: stats.then(|| at(off::REFUSALS, d)),
                last_refused: stats.then(|| at(off::LAST_REFUSED, d)),
                compute_ns: Some(at(off::COMPUTE_NS, d)).filter(|v| stats && *v != 0),
            }
        })
        .collect();
    let mut pids: Vec<u32> = (0..SLOTS)
        .map(|i| off::SLOTS + i * off::SLOT_SIZE)
        .filter(|s| (0..MAX_DEVICES).any(|d| word(b, s + off::SLOT_USED + 8 * d) != 0))
        .map(|s| word(b, s + off::SLOT_OWNER))
        .filter(|o| *o != 0 && *o & layout::RECLAIM == 0)
        .map(|o| (o >> 40) as u32)
        .collect();
    pids.sort_unstable();
    Ok(Usage { devices, pids })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }

    fn region() -> Vec<u8> {
        blank()
    }

    proptest::proptest! {
        #[test]
        fn any_patched_region_decodes_within_bounds(
            patches in proptest::collection::vec((0usize..SIZE, proptest::num::u64::ANY), 0..64),
            devices in 0usize..80,
        ) {
            let mut b = blank();
            for (at, v) in patches {
                let at = at.min(SIZE - 8);
                put(&mut b, at, v);
            }
            check_decoded(&b, devices);
        }
    }

    #[test]
    fn figures_and_processes() {
        let mut b = region();
        put(&mut b, off::USED + 8, 300);
        put(&mut b, off::PEAK + 8, 500);
        put(&mut b, off::REFUSALS + 8, 2);
        put(&mut b, off::LAST_REFUSED + 8, 4096);
        let slot = |i: usize| off::SLOTS + i * off::SLOT_SIZE;
        put(&mut b, slot(3) + off::SLOT_OWNER, (7 << 40) | 99);
        put(&mut b, slot(3) + off::SLOT_USED + 8, 300);
        put(&mut b, slot(0) + off::SLOT_OWNER, (5 << 40) | 1);
        put(&mut b, slot(0) + off::SLOT_USED + 8 * 63, 1);
        // holding nothing: not a GPU process
        put(&mut b, slot(4) + off::SLOT_OWNER, (6 << 40) | 1);
        put(
            &mut b,
            slot(9) + off::SLOT_OWNER,
            layout::RECLAIM | (8 << 40),
        );
        put(&mut b, slot(9) + off::SLOT_USED, 5);
        let u = decode(&b, 2).unwrap();
        assert_eq!(u.pids, [5, 7]);
        // a slot being reclaimed still counts until its counters are swapped out (as in the shim)
        assert_eq!(
            u.devices[0],
            DeviceUsage {
                used: 5,
                peak: Some(5),
                refusals: Some(0),
                last_refused: Some(0),
                compute_ns: None
            }
        );
        assert_eq!(
            (u.devices[1].used, u.devices[1].peak, u.devices[1].refusals),
            (300, Some(500), Some(2))
        );
        assert_eq!(u.devices[1].last_refused, Some(4096));
    }

    #[test]
    fn peak_never_below_use_and_unknown_stats_hidden() {
        let mut b = region();
        put(&mut b, off::USED, 900);
        put(&mut b, off::PEAK, 100);
        assert_eq!(decode(&b, 1).unwrap().devices[0].peak, Some(900));
        // a zeroed header does not hide what the slots hold
        put(&mut b, off::USED, 0);
        put(
            &mut b,
            off::SLOTS + 2 * off::SLOT_SIZE + off::SLOT_USED,
            700,
        );
        put(
            &mut b,
            off::SLOTS + 5 * off::SLOT_SIZE + off::SLOT_USED,
            200,
        );
        assert_eq!(decode(&b, 1).unwrap().devices[0].used, 900);
        put(&mut b, off::STATS_VERSION, 12345);
        let d = decode(&b, 1).unwrap().devices[0];
        assert_eq!((d.used, d.peak, d.refusals), (900, None, None));
    }

    #[test]
    fn malformed() {
        assert_eq!(decode(&[], 3).unwrap().devices.len(), 3);
        assert_eq!(decode(&vec![0; SIZE], 1).unwrap().devices[0].used, 0);
        assert_eq!(decode(&[1, 2, 3], 1), Err(DecodeError::Size(3)));
        assert!(decode(&vec![0; SIZE + 1], 1).is_err());
        let mut b = region();
        put(&mut b, off::LAYOUT, 1);
        assert!(matches!(decode(&b, 1), Err(DecodeError::Header { .. })));
        // More devices asked than a region holds: capped.
        assert_eq!(decode(&region(), 1000).unwrap().devices.len(), MAX_DEVICES);
    }
}
