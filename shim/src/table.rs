//! Per-process record of what each live allocation was charged: handle → (quota device, bytes).
//!
//! A fixed-size open-addressing hash table of atomic pairs in an anonymous mapping, created on
//! first use: no locks, no allocator, so it is safe in any thread, inside allocator callbacks
//! and right after `fork` (the child drops the parent's table: its CUDA state did not survive).
//! Keys never go back to empty (removal leaves a tombstone that inserts reuse), and probing is
//! bounded, so a lookup for a key inserted earlier always finds it.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

const BITS: u32 = 18;
const CAP: usize = 1 << BITS;
const MAX_PROBE: usize = 256;
const TOMB: u64 = u64::MAX;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u64)]
pub enum Kind {
    Linear = 1,
    Vmm = 2,
    Array = 3,
    /// memory pool → CUDA ordinal (value is the ordinal, nothing charged)
    Pool = 4,
    /// capturing stream → graph allocations so far (CUDA ordinal, bytes; nothing charged)
    CaptureMem = 5,
    /// graph → its memory nodes (CUDA ordinal, bytes; nothing charged)
    GraphMem = 6,
    /// graph instantiation → its graph's memory (CUDA ordinal, bytes; nothing charged)
    ExecMem = 7,
    /// launched graph instantiation → what its memory was charged (quota device, bytes)
    ExecResident = 8,
    /// stream-ordered allocation → the pool it came from (its free goes back to the pool)
    AllocPool = 9,
    /// start of a range mapped with `cuMemMap` → the VMM handle mapped there
    MapHandle = 10,
    /// start of a range mapped with `cuMemMap` → its length
    MapLen = 11,
    /// VMM handle → how many ranges map it
    VmmMaps = 12,
    /// VMM handle → references `cuMemRetainAllocationHandle` added
    VmmRetains = 13,
    /// VMM handle released while mapped → its charge (quota device, bytes), released with the
    /// last mapping
    VmmReleased = 14,
    /// VMM handle imported from a shareable handle → its CUDA ordinal + 1 (nothing charged:
    /// its mappings are)
    VmmImported = 15,
    /// start of a range mapped to an imported handle → what the mapping was charged (quota
    /// device, bytes)
    MapCharge = 16,
}

#[repr(C)]
struct Entry {
    key: AtomicU64,
    val: AtomicU64,
}

static TABLE: AtomicPtr<Entry> = AtomicPtr::new(std::ptr::null_mut());

/// Per quota device: what destroyed graph instantiations were charged and the driver still
/// holds until a trim (`graphmem`).
pub static GRAPH_HELD: [AtomicU64; crate::region::MAX_DEVICES] =
    [const { AtomicU64::new(0) }; crate::region::MAX_DEVICES];

/// Forget the table (fork child; async-signal-safe).
pub fn forget() {
    TABLE.store(std::ptr::null_mut(), Ordering::Relaxed);
    for h in &GRAPH_HELD {
        h.store(0, Ordering::Relaxed);
    }
}

fn table() -> Option<&'static [Entry]> {
    let mut p = TABLE.load(Ordering::Acquire);
    if p.is_null() {
        let bytes = CAP * std::mem::size_of::<Entry>();
        // SAFETY: anonymous private mapping; zero-filled, which is a valid empty table.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if m == libc::MAP_FAILED {
            return None;
        }
        match TABLE.compare_exchange(
            std::ptr::null_mut(),
            m.cast(),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => p = m.cast(),
            Err(other) => {
                // SAFETY: our own unpublished mapping.
                unsafe { libc::munmap(m, bytes) };
                p = other;
            }
        }
    }
    // SAFETY: p points to CAP entries that live for the rest of the process.
    Some(unsafe { std::slice::from_raw_parts(p, CAP) })
}

/// The kind in the top 5 bits, the handle in the rest (handles are addresses or small numbers).
fn key(kind: Kind, handle: u64) -> u64 {
    (handle & ((1 << 59) - 1)) | ((kind as u64) << 59)
}

/// First slot for a key. Handles close together (within CAP × 512 bytes = 128 MiB) land in
/// neighbouring slots, so a program's allocations touch few cache lines and pages of the table
/// (random slots in a 4 MiB table cost a TLB and cache miss per call, ~0.5 µs on a VM); farther
/// windows are scattered by a multiplicative hash of the high bits.
fn start(k: u64) -> usize {
    let low = (k >> 9) as usize;
    let high = ((k >> (9 + BITS)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - BITS)) as usize;
    low.wrapping_add(high) & (CAP - 1)
}

/// Record `val` for `handle`. False when the table is full around its hash (or unavailable).
pub fn insert(kind: Kind, handle: u64, val: u64) -> bool {
    let Some(t) = table() else {
        return false;
    };
    let k = key(kind, handle);
    let s = start(k);
    for i in 0..MAX_PROBE {
        let e = &t[(s + i) & (CAP - 1)];
        let cur = e.key.load(Ordering::Acquire);
        if (cur == 0 || cur == TOMB)
            && e.key
                .compare_exchange(cur, k, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            e.val.store(val, Ordering::Release);
            return true;
        }
    }
    false
}

/// The live entry holding `handle`'s key, if any (probing stops at an empty slot).
fn find(kind: Kind, handle: u64) -> Option<(&'static Entry, u64)> {
    let t = table()?;
    let k = key(kind, handle);
    let s = start(k);
    for i in 0..MAX_PROBE {
        let e = &t[(s + i) & (CAP - 1)];
        let cur = e.key.load(Ordering::Acquire);
        if cur == 0 {
            return None;
        }
        if cur == k {
            return Some((e, k));
        }
    }
    None
}

/// Remove `handle` and return its value.
pub fn take(kind: Kind, handle: u64) -> Option<u64> {
    let (e, k) = find(kind, handle)?;
    let v = e.val.load(Ordering::Acquire);
    e.key
        .compare_exchange(k, TOMB, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
        .then_some(v)
}

/// Look `handle` up without removing it.
pub fn get(kind: Kind, handle: u64) -> Option<u64> {
    find(kind, handle).map(|(e, _)| e.val.load(Ordering::Acquire))
}

/// Pack a charge: quota device index and bytes.
pub fn pack(dev: usize, bytes: u64) -> u64 {
    ((dev as u64) << 56) | (bytes & ((1 << 56) - 1))
}

pub fn unpack(v: u64) -> (usize, u64) {
    ((v >> 56) as usize, v & ((1 << 56) - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_take_get() {
        assert!(insert(Kind::Linear, 0x7f00_0000_1000, pack(3, 4096)));
        assert_eq!(
            get(Kind::Linear, 0x7f00_0000_1000).map(unpack),
            Some((3, 4096))
        );
        // same handle value, other kind: a different entry
        assert_eq!(get(Kind::Vmm, 0x7f00_0000_1000), None);
        assert_eq!(
            take(Kind::Linear, 0x7f00_0000_1000).map(unpack),
            Some((3, 4096))
        );
        assert_eq!(take(Kind::Linear, 0x7f00_0000_1000), None);
    }

    #[test]
    fn colliding_windows_and_tombstones() {
        // handles 128 MiB apart share a start slot; all stay findable, freed slots are reused
        let stride = (CAP as u64) * 512;
        let hs: Vec<u64> = (1..=50).map(|i| 0x5000_0000_0000 + i * stride).collect();
        for (i, h) in hs.iter().enumerate() {
            assert!(insert(Kind::Array, *h, pack(0, i as u64 + 1)));
        }
        for (i, h) in hs.iter().enumerate().rev() {
            assert_eq!(take(Kind::Array, *h), Some(pack(0, i as u64 + 1)));
        }
        for _ in 0..10_000 {
            assert!(insert(Kind::Array, hs[0], 7));
            assert_eq!(take(Kind::Array, hs[0]), Some(7));
        }
    }
}
