//! The container-wide accounting region: `$GPUFENCE_STATE/accounting`, mmap'ed `MAP_SHARED` by
//! every process of the container. Atomics only — no locks, so a process killed at any
//! instruction never blocks the others.
//!
//! Layout (native endian, all `u64`):
//! ```text
//! header:  magic, layout, used[64], slots_hwm    (bytes charged per quota device, container-wide;
//!                                                 slots ever taken: the live ones lie below)
//! slot*1024: owner, used[64]                     (bytes charged by one process)
//! stats:   version, peak[64], refusals[64], …    (observability, versioned on its own: stats.rs)
//! ```
//! `owner` is 0 (free), a process key `pid << 40 | starttime & (2^40-1)` (start time from
//! `/proc/<pid>/stat`, so a reused pid is a different key), or `RECLAIM | key of the reclaimer`.
//!
//! Invariant: `header.used[d] >= Σ slot.used[d]`. Charging adds to the header first (the limit
//! check, one CAS) and then to the slot; uncharging subtracts from the slot first. A process
//! killed between the two steps therefore leaves at most one allocation over-counted (fail
//! closed), never under-counted. Reclaiming a dead process's slot swaps each of its counters to 0
//! and subtracts what it took from the header, so a reclaimer that dies half-way can be taken
//! over by the next one without double subtraction.
//!
//! The file is 0666 (every uid of the container shares it), so any process of the container can
//! overwrite it: the header's totals are a fast path, not the truth. A charge that passes the
//! header is checked against the sum of the live slots too (the first `slots_hwm`, at least up
//! to our own), so zeroing the header does not lift the quota; a process that also zeroes the
//! other processes' slots can, which no preloaded library can prevent (see
//! docs/allocations-and-trust.md: hard isolation against a hostile tenant needs the driver
//! backend or MIG).

use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

pub mod layout;
pub mod stats;

pub use layout::{LAYOUT, MAGIC, MAX_DEVICES, SLOTS};

pub const RECLAIM: u64 = 1 << 63;
const START_BITS: u32 = 40;
/// File name of the region inside `$GPUFENCE_STATE`.
pub const FILE_NAME: &str = "accounting";

#[repr(C)]
pub struct Header {
    magic: AtomicU64,
    layout: AtomicU64,
    used: [AtomicU64; MAX_DEVICES],
    /// 1 + the highest slot index ever taken.
    slots_hwm: AtomicU64,
}

#[repr(C)]
pub struct Slot {
    owner: AtomicU64,
    used: [AtomicU64; MAX_DEVICES],
}

#[repr(C)]
pub struct Region {
    header: Header,
    slots: [Slot; SLOTS],
    pub(crate) stats: stats::Stats,
}

pub const SIZE: usize = std::mem::size_of::<Region>();

/// Byte offsets of the fields a host-side reader decodes (`gpufence ps`, the exporter), from
/// the one definition above.
#[allow(dead_code)]
pub mod offsets {
    use super::Region;
    use std::mem::{offset_of, size_of};
    pub const MAGIC: usize = offset_of!(Region, header.magic);
    pub const LAYOUT: usize = offset_of!(Region, header.layout);
    pub const USED: usize = offset_of!(Region, header.used);
    pub const SLOTS: usize = offset_of!(Region, slots);
    pub const SLOT_SIZE: usize = size_of::<super::Slot>();
    pub const SLOT_OWNER: usize = offset_of!(super::Slot, owner);
    pub const SLOT_USED: usize = offset_of!(super::Slot, used);
    pub const STATS_VERSION: usize = offset_of!(Region, stats.version);
    pub const PEAK: usize = offset_of!(Region, stats.peak);
    pub const REFUSALS: usize = offset_of!(Region, stats.refusals);
    pub const LAST_REFUSED: usize = offset_of!(Region, stats.last_refused);
    pub const COMPUTE_NS: usize = offset_of!(Region, stats.compute_ns);
}

/// Where the region came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Shared by the container (the file in `$GPUFENCE_STATE`).
    File,
    /// The file could not be used: this process (and its forks) only.
    Private,
}

/// Map the region file (creating it world-writable if needed), or a private anonymous region
/// when that fails. Never fails (a private region can only fail if mmap itself does, in which
/// case `None`).
pub fn open(dir: &CStr) -> Option<(&'static Region, Backing)> {
    if let Some(r) = open_file(dir) {
        return Some((r, Backing::File));
    }
    // SAFETY: anonymous shared mapping (shared so that forked children keep one accounting).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: zeroed mapping of SIZE bytes; all-zero is a valid Region (atomics).
    let r = unsafe { &*(p as *const Region) };
    r.header.magic.store(MAGIC, Ordering::Relaxed);
    r.header.layout.store(LAYOUT, Ordering::Relaxed);
    r.stats.stamp();
    Some((r, Backing::Private))
}

fn open_file(dir: &CStr) -> Option<&'static Region> {
    let mut path = dir.to_bytes().to_vec();
    path.push(b'/');
    path.extend_from_slice(FILE_NAME.as_bytes());
    let path = CString::new(path).ok()?;
    let flags = libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    // SAFETY: plain syscalls on a valid path.
    unsafe {
        let mut fd = libc::open(path.as_ptr(), flags | libc::O_CREAT | libc::O_EXCL, 0o666);
        if fd >= 0 {
            // every user of the container shares it, whatever the umask
            libc::fchmod(fd, 0o666);
        } else {
            fd = libc::open(path.as_ptr(), flags);
            if fd < 0 {
                return None;
            }
        }
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 || (st.st_mode & libc::S_IFMT) != libc::S_IFREG {
            libc::close(fd);
            return None;
        }
        if (st.st_size as u64) < SIZE as u64 && !grow_to(fd, 0, SIZE as libc::off_t) {
            libc::close(fd);
            return None;
        }
        let p = libc::mmap(
            std::ptr::null_mut(),
            SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        libc::close(fd);
        if p == libc::MAP_FAILED {
            return None;
        }
        let r = &*(p as *const Region);
        // first user stamps the header; anyone else must find the same layout
        let _ = r
            .header
            .layout
            .compare_exchange(0, LAYOUT, Ordering::AcqRel, Ordering::Acquire);
        let _ = r
            .header
            .magic
            .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire);
        if r.header.magic.load(Ordering::Acquire) != MAGIC
            || r.header.layout.load(Ordering::Acquire) != LAYOUT
        {
            libc::munmap(p, SIZE);
            return None;
        }
        r.stats.stamp();
        Some(r)
    }
}

/// Make the file at least `off + len` bytes long, never shorter: other sections of the file
/// (the compute section beyond this region) may already have grown it, and a plain `ftruncate`
/// racing with them would cut their mappings off.
pub fn grow_to(fd: libc::c_int, off: libc::off_t, len: libc::off_t) -> bool {
    // SAFETY: plain syscalls on an fd we own.
    unsafe {
        match libc::fallocate(fd, 0, off, len) {
            0 => true,
            _ => {
                let mut st: libc::stat = std::mem::zeroed();
                libc::fstat(fd, &mut st) == 0
                    && (st.st_size >= off + len || libc::ftruncate(fd, off + len) == 0)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Process identity

/// This process's key, cached; reset in the fork child.
static MY_KEY: AtomicU64 = AtomicU64::new(0);
/// Index + 1 of this process's slot (0 = not registered).
static MY_SLOT: AtomicUsize = AtomicUsize::new(0);
/// 0: unknown, 1: /proc shows our own pid namespace (liveness checks possible), 2: it does not.
static PROC_OK: AtomicUsize = AtomicUsize::new(0);

/// Called in the fork child (async-signal-safe: atomics only).
pub fn forget_process() {
    MY_KEY.store(0, Ordering::Relaxed);
    MY_SLOT.store(0, Ordering::Relaxed);
}

fn make_key(pid: u32, start: u64) -> u64 {
    ((pid as u64) << START_BITS) | (start & ((1 << START_BITS) - 1))
}

/// Start time (field 22) of `/proc/<pid>/stat`, and whether the process is a zombie.
fn stat_of(pid: &str) -> Option<(u64, bool)> {
    let text = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = text.iter().rposition(|b| *b == b')')?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let mut it = rest.split_ascii_whitespace();
    let state = it.next()?; // field 3
    // fields 4..=21 then 22
    let start = it.nth(18)?.parse().ok()?;
    Some((start, matches!(state, "Z" | "X" | "x")))
}

fn proc_ok() -> bool {
    match PROC_OK.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            // SAFETY: getpid never fails.
            let pid = unsafe { libc::getpid() };
            let ok = std::fs::read_link("/proc/self")
                .ok()
                .and_then(|p| p.to_str().and_then(|s| s.parse::<i32>().ok()))
                == Some(pid);
            PROC_OK.store(if ok { 1 } else { 2 }, Ordering::Relaxed);
            ok
        }
    }
}

pub fn my_key() -> u64 {
    let k = MY_KEY.load(Ordering::Relaxed);
    if k != 0 {
        return k;
    }
    // SAFETY: getpid never fails.
    let pid = unsafe { libc::getpid() } as u32;
    let start = if proc_ok() {
        stat_of("self").map_or(0, |s| s.0)
    } else {
        0
    };
    let k = make_key(pid, start);
    MY_KEY.store(k, Ordering::Relaxed);
    k
}

/// Is the process behind `key` gone? Only answers yes when /proc can prove it.
fn dead(key: u64) -> bool {
    if !proc_ok() {
        return false;
    }
    let pid = key >> START_BITS;
    match stat_of(&pid.to_string()) {
        None => std::path::Path::new("/proc/self/stat").exists(),
        Some((start, zombie)) => {
            zombie || (start & ((1 << START_BITS) - 1)) != (key & ((1 << START_BITS) - 1))
        }
    }
}

impl Region {
    /// Device time charged on quota device `d` by the compute-share limiter (stats block).
    #[inline]
    pub fn note_compute(&self, d: usize, ns: u64) {
        self.stats.note_compute(d, ns);
    }

    /// Bytes charged container-wide on quota device `d`: the header's total, or the live
    /// slots' sum where the header was lowered behind our back.
    pub fn used(&self, d: usize) -> u64 {
        self.header
            .used
            .get(d)
            .map_or(0, |u| u.load(Ordering::Acquire).max(self.live_sum(d)))
    }

    /// What `used` reports, after reclaiming the charges of processes that are gone: what a
    /// program is told is free (`cuMemGetInfo`, NVML) must not count an exited process's
    /// memory until the next allocation happens to reclaim it.
    pub fn used_by_live(&self, d: usize) -> u64 {
        self.reclaim_dead();
        self.used(d)
    }

    /// Sum of the slots' charges on device `d` (slots up to the high-water mark, and at least
    /// up to ours: a zeroed mark hides no more than the other processes' slots).
    #[inline]
    fn live_sum(&self, d: usize) -> u64 {
        let hwm = self.header.slots_hwm.load(Ordering::Acquire);
        let n = usize::try_from(hwm)
            .unwrap_or(SLOTS)
            .max(MY_SLOT.load(Ordering::Relaxed))
            .min(SLOTS);
        self.slots[..n]
            .iter()
            .filter_map(|s| s.used.get(d))
            .fold(0u64, |a, u| a.saturating_add(u.load(Ordering::Acquire)))
    }

    /// Reclaim every slot whose process is gone. `me` is this process's key; a slot holding
    /// `me` that is not our registered slot belongs to our image before `exec` (same pid and
    /// start time), whose driver memory is gone too.
    pub fn reclaim_dead(&self) -> u64 {
        let me = my_key();
        let mine = MY_SLOT.load(Ordering::Relaxed);
        let mut freed = 0;
        let mut top = 0;
        for (i, s) in self.slots.iter().enumerate() {
            let owner = s.owner.load(Ordering::Acquire);
            if owner != 0 {
                top = i + 1;
            }
            if owner == 0 || i + 1 == mine {
                continue;
            }
            let stale = if owner & RECLAIM != 0 {
                let r = owner & !RECLAIM;
                r != me && dead(r)
            } else {
                owner == me || dead(owner)
            };
            if stale
                && s.owner
                    .compare_exchange(owner, RECLAIM | me, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                for (d, u) in s.used.iter().enumerate() {
                    let v = u.swap(0, Ordering::AcqRel);
                    if v != 0 {
                        sub_sat(&self.header.used[d], v);
                        freed += v;
                    }
                }
                s.owner.store(0, Ordering::Release);
            }
        }
        // Repair a lowered high-water mark (it only ever grows).
        self.header
            .slots_hwm
            .fetch_max(top as u64, Ordering::AcqRel);
        freed
    }

    /// Register this process (reclaiming dead ones first). Returns the slot, None when all are
    /// taken (charges then go to the header only and are not reclaimable).
    fn slot(&self) -> Option<&Slot> {
        let i = MY_SLOT.load(Ordering::Relaxed);
        if i != 0 {
            return self.slots.get(i - 1);
        }
        self.register()
    }

    #[cold]
    fn register(&self) -> Option<&Slot> {
        self.reclaim_dead();
        let me = my_key();
        for (i, s) in self.slots.iter().enumerate() {
            if s.owner
                .compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // another thread of ours may have won meanwhile: keep the first, free ours
                match MY_SLOT.compare_exchange(0, i + 1, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        self.header
                            .slots_hwm
                            .fetch_max(i as u64 + 1, Ordering::AcqRel);
                        return Some(s);
                    }
                    Err(other) => {
                        s.owner.store(0, Ordering::Release);
                        return self.slots.get(other - 1);
                    }
                }
            }
        }
        None
    }

    /// Charge `bytes` on quota device `d` against `limit`. Reclaims dead processes once before
    /// refusing.
    pub fn charge(&self, d: usize, bytes: u64, limit: u64) -> bool {
        let Some(total) = self.header.used.get(d) else {
            return false;
        };
        let slot = self.slot();
        let try_add = || {
            total
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                    u.checked_add(bytes).filter(|n| *n <= limit)
                })
                .ok()
        };
        let Some(before) = try_add().or_else(|| (self.reclaim_dead() != 0).then(try_add).flatten())
        else {
            self.stats.note_refusal(d, bytes);
            return false;
        };
        // The header passed; the live slots must agree (by the invariant they never hold more
        // than the header did before our add, so this refuses a lowered header — or, rarely, a
        // sum read slot by slot while others freed and charged). The header is not raised to
        // that sum: a sum read that way can exceed every value the header ever held, and
        // raising it would charge the container memory nobody holds, for good (the likely cause
        // of a CI run finding 4 MiB of a 100 MiB quota still charged after every process had
        // exited). Readers take max(header, live sum) anyway.
        let live = self.live_sum(d);
        if live.saturating_add(bytes) > limit {
            total.fetch_sub(bytes, Ordering::AcqRel);
            self.stats.note_refusal(d, bytes);
            return false;
        }
        self.stats
            .note_in_use(d, before.max(live).saturating_add(bytes));
        if let Some(s) = slot {
            s.used[d].fetch_add(bytes, Ordering::AcqRel);
        }
        true
    }

    /// Give back `bytes` on quota device `d` (slot first, see the module docs).
    pub fn uncharge(&self, d: usize, bytes: u64) {
        let Some(total) = self.header.used.get(d) else {
            return;
        };
        // Plain subtractions (one locked instruction each): we only ever give back what this
        // process charged, so neither counter can go below it (and a wrap would read as "full",
        // failing closed).
        if let Some(s) = self.slot() {
            s.used[d].fetch_sub(bytes, Ordering::AcqRel);
        }
        total.fetch_sub(bytes, Ordering::AcqRel);
    }
}

fn sub_sat(a: &AtomicU64, v: u64) {
    let _ = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        Some(u.saturating_sub(v))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout() {
        let k = make_key(4_194_303, (1 << 41) + 5);
        assert_eq!(k >> START_BITS, 4_194_303);
        assert_eq!(k & RECLAIM, 0);
        assert_eq!(k & ((1 << START_BITS) - 1), 5);
    }

    #[test]
    fn a_refusal_never_raises_the_container_counter() {
        const MIB: u64 = 1 << 20;
        // SAFETY: all-zero bytes are a valid Region (atomics and integers only); boxed, so the
        // 1024 slots do not sit on the test thread's stack.
        let r: Box<Region> = unsafe { Box::<Region>::new_zeroed().assume_init() };
        // Another live process (pid 1, which outlives the test) holds 60 MiB; the container
        // counter reads 30 MiB — lowered by a hand, or read mid-update by a racing sum.
        let (start, _) = stat_of("1").expect("/proc/1/stat");
        r.slots[1]
            .owner
            .store(make_key(1, start), Ordering::Release);
        r.slots[1].used[0].store(60 * MIB, Ordering::Release);
        r.header.slots_hwm.store(2, Ordering::Release);
        r.header.used[0].store(30 * MIB, Ordering::Release);
        // 50 MiB passes the counter (80 ≤ 100) but not the live sum (110 > 100): refused, and
        // the counter is left where it was — not raised to a sum nobody may hold any more.
        assert!(!r.charge(0, 50 * MIB, 100 * MIB));
        assert_eq!(r.header.used[0].load(Ordering::Acquire), 30 * MIB);
        assert_eq!(r.used(0), 60 * MIB, "readers see the larger of the two");
        // What fits beside the live 60 MiB is granted.
        assert!(r.charge(0, 40 * MIB, 100 * MIB));
        assert_eq!(r.used(0), 100 * MIB);
        assert!(!r.charge(0, 1, 100 * MIB));
    }

    #[test]
    fn stat_self() {
        let (start, zombie) = stat_of("self").unwrap();
        assert!(start > 0);
        assert!(!zombie);
    }
}
