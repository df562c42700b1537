//! Where simulated device memory lives: every device allocation is an anonymous private mapping
//! made with `MAP_NORESERVE`, so its address is a real one that host code may copy to and from,
//! while the host commits a page only when something writes it (allocating 60 GiB of simulated
//! GPU costs address space, not memory). VMM reservations are `PROT_NONE` mappings that
//! `cuMemMap` turns read-write and `cuMemUnmap` back. Freed ranges go back to the kernel.
//!
//! The address map (start → region) answers what the driver knows about a pointer:
//! `cuPointerGetAttribute(s)`, `cuMemGetAddressRange`, and which copies touch device memory.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::driver::CUDA_ERROR_INVALID_VALUE;
use crate::driver::CUresult;

pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegionKind {
    Device,
    Managed,
    /// page-locked host memory the driver allocated (`cuMemHostAlloc`) or registered
    Host,
    /// a mapped range of a VMM reservation
    Mapped,
    /// a peer process's allocation opened through IPC
    Ipc,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    pub(crate) len: u64,
    pub(crate) dev: usize,
    pub(crate) kind: RegionKind,
    /// the memory pool it came from (stream-ordered allocations), 0 otherwise
    pub(crate) pool: u64,
    pub(crate) id: u64,
}

static REGIONS: Mutex<BTreeMap<u64, Region>> = Mutex::new(BTreeMap::new());
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn regions() -> std::sync::MutexGuard<'static, BTreeMap<u64, Region>> {
    REGIONS.lock().unwrap_or_else(|e| e.into_inner())
}

fn page_round(bytes: u64) -> Option<usize> {
    let b = usize::try_from(bytes).ok()?;
    Some(b.max(1).checked_add(4095)? & !4095)
}

/// A fresh lazily committed read-write mapping of at least `bytes` (`None`: no address space).
pub(crate) fn map(bytes: u64, prot: i32) -> Option<u64> {
    let len = page_round(bytes)?;
    // SAFETY: a new anonymous private mapping at an address the kernel picks; no existing memory
    // is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as u64)
}

/// Give `[p, p + bytes)` back to the kernel (a mapping `map` made).
pub(crate) fn unmap(p: u64, bytes: u64) {
    if let Some(len) = page_round(bytes) {
        // SAFETY: the range is a whole mapping this module made and nothing references it any more
        // (the caller removed it from the address map).
        unsafe { libc::munmap(p as *mut libc::c_void, len) };
    }
}

/// Replace `[p, p + bytes)` (inside a reservation) with fresh pages of protection `prot`.
pub(crate) fn remap_fixed(p: u64, bytes: u64, prot: i32) -> Result<(), CUresult> {
    let len = page_round(bytes).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: MAP_FIXED over a range that lies inside a reservation this module made (the caller
    // checked it), so no other mapping is clobbered.
    let r = unsafe {
        libc::mmap(
            p as *mut libc::c_void,
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if r == libc::MAP_FAILED {
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    } else {
        Ok(())
    }
}

pub(crate) fn insert(start: u64, len: u64, dev: usize, kind: RegionKind, pool: u64) {
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    regions().insert(
        start,
        Region {
            len,
            dev,
            kind,
            pool,
            id,
        },
    );
}

pub(crate) fn remove(start: u64) -> Option<Region> {
    regions().remove(&start)
}

/// The region holding `p`, with its start.
pub(crate) fn find(p: u64) -> Option<(u64, Region)> {
    let m = regions();
    let (start, r) = m.range(..=p).next_back()?;
    (p < start.saturating_add(r.len.max(1))).then_some((*start, *r))
}

/// Whether `[p, p + n)` lies inside one known region.
pub(crate) fn covers(p: u64, n: u64) -> bool {
    n == 0 || find(p).is_some_and(|(s, r)| p.saturating_add(n) <= s + r.len)
}

/// Device allocations of `dev` from `pool` still live (bytes).
pub(crate) fn pool_bytes(pool: u64) -> u64 {
    regions()
        .values()
        .filter(|r| r.pool == pool)
        .map(|r| r.len)
        .sum()
}

/// Copy `n` bytes; each side must be memory the driver knows or host memory of the caller.
/// `dst_dev` / `src_dev`: the side is a device pointer (checked against the address map).
pub(crate) fn copy(
    dst: u64,
    src: u64,
    n: u64,
    dst_dev: bool,
    src_dev: bool,
) -> Result<(), CUresult> {
    if n == 0 {
        return Ok(());
    }
    if dst == 0 || src == 0 || (dst_dev && !covers(dst, n)) || (src_dev && !covers(src, n)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = usize::try_from(n).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: device sides were checked to lie inside live mappings of this module; host sides
    // are the caller's buffers of at least `n` bytes (CUDA caller contract). `copy` (memmove)
    // allows overlap.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    Ok(())
}

/// Fill `count` elements of `elem` bytes (1, 2 or 4) with `value`. Zero over whole pages is
/// `MADV_DONTNEED` (the pages read back as zero and commit nothing).
pub(crate) fn fill(dst: u64, value: u32, elem: u64, count: u64) -> Result<(), CUresult> {
    let n = count.checked_mul(elem).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if n == 0 {
        return Ok(());
    }
    if !covers(dst, n) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (mut lo, hi) = (dst, dst + n);
    if value == 0 {
        let a = (lo + 4095) & !4095;
        let b = hi & !4095;
        if b > a {
            // SAFETY: [a, b) is page-aligned and inside a mapping of this module (checked above);
            // MADV_DONTNEED on a private anonymous mapping makes it read back as zeros.
            unsafe {
                libc::madvise(
                    a as *mut libc::c_void,
                    (b - a) as usize,
                    libc::MADV_DONTNEED,
                )
            };
            // SAFETY: the head [lo, a) lies inside the same checked range.
            unsafe { std::ptr::write_bytes(lo as *mut u8, 0, (a - lo) as usize) };
            lo = b;
        }
    }
    let bytes = value.to_ne_bytes();
    let mut p = lo;
    while p < hi {
        let k = ((hi - p) as usize).min(elem as usize);
        // SAFETY: [p, p + k) lies inside the checked range [dst, dst + n).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p as *mut u8, k) };
        p += k as u64;
    }
    Ok(())
}

static RESERVED: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());

fn reserved() -> std::sync::MutexGuard<'static, BTreeMap<u64, u64>> {
    RESERVED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reserve `size` bytes of address space aligned to `align` (a power of two, at least a page).
pub(crate) fn reserve(size: u64, align: u64) -> Option<u64> {
    let align = align.max(4096).next_power_of_two();
    let whole = size.checked_add(align)?;
    let p = map(whole, libc::PROT_NONE)?;
    let start = (p + align - 1) & !(align - 1);
    // trim the unaligned head and the tail beyond the reservation
    if start > p {
        unmap(p, start - p);
    }
    let end = start + size;
    let whole_end = p + page_round(whole).map_or(whole, |w| w as u64);
    if whole_end > end {
        unmap(end, whole_end - end);
    }
    reserved().insert(start, size);
    Some(start)
}

/// Whether `[p, p + n)` lies inside one reservation.
pub(crate) fn reserved_covers(p: u64, n: u64) -> bool {
    let m = reserved();
    m.range(..=p)
        .next_back()
        .is_some_and(|(s, len)| p.saturating_add(n) <= s + len)
}

/// Drop the regions mapped inside `[p, p + n)`; they are returned.
pub(crate) fn forget_range(p: u64, n: u64) -> Vec<Region> {
    let mut m = regions();
    let inside: Vec<u64> = m.range(p..p.saturating_add(n)).map(|(s, _)| *s).collect();
    inside.iter().filter_map(|s| m.remove(s)).collect()
}

/// Whether some range is mapped to VMM handle `handle`.
pub(crate) fn handle_mapped(handle: u64) -> bool {
    regions()
        .values()
        .any(|r| r.kind == RegionKind::Mapped && r.pool == handle)
}

/// Release a reservation made by `reserve` (it must start at `p`); the regions mapped in it
/// are returned.
pub(crate) fn unreserve(p: u64, n: u64) -> Result<Vec<Region>, CUresult> {
    let len = reserved().remove(&p).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let gone = forget_range(p, len.max(n));
    unmap(p, len);
    Ok(gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazy_map_copy_fill_find() {
        let big = 8u64 << 30;
        let p = map(big, libc::PROT_READ | libc::PROT_WRITE).expect("8 GiB of address space");
        insert(p, big, 0, RegionKind::Device, 0);
        assert!(covers(p + 100, 1000));
        assert!(!covers(p + big - 10, 100));
        let host = [7u8; 64];
        copy(p + 4096, host.as_ptr() as u64, 64, true, false).unwrap();
        let mut back = [0u8; 64];
        copy(back.as_mut_ptr() as u64, p + 4096, 64, false, true).unwrap();
        assert_eq!(back, host);
        fill(p, 0, 1, 3 * 4096).unwrap();
        copy(back.as_mut_ptr() as u64, p + 4096, 64, false, true).unwrap();
        assert_eq!(back, [0u8; 64]);
        fill(p + 1, 0xab, 1, 5).unwrap();
        copy(back.as_mut_ptr() as u64, p, 8, false, true).unwrap();
        assert_eq!(&back[..8], &[0, 0xab, 0xab, 0xab, 0xab, 0xab, 0, 0]);
        assert_eq!(find(p + 5).map(|(s, _)| s), Some(p));
        assert_eq!(copy(0x10, p, 8, true, true), Err(CUDA_ERROR_INVALID_VALUE));
        remove(p);
        unmap(p, big);
    }
}
