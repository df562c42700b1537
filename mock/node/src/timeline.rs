//! The simulated GPUs' device timeline: node-wide state shared by every process that loads the
//! mock driver, on the host or in a container, like a real driver's state behind `/dev/nvidia*`.
//!
//! It is one file, `gpufence-mock-timeline`, beside the node description (`gpufence-sim`
//! installs it in the driver root's library directory, mode 0666, and the plan bind-mounts it
//! read-write into GPU containers with the other driver files), mapped `MAP_SHARED` by every
//! process. Lock-free: a process SIGKILLed at any instruction never blocks the others.
//!
//! Model: each GPU (and each MIG instance) is a *lane* that runs one kernel at a time, in the
//! order kernels were launched across the whole node. A launch of a kernel lasting `d` reserves
//! `[start, start + d)` with `start = max(now, busy_until)` (one CAS on `busy_until`), so two
//! processes spinning on one GPU alternate and each gets half of it. Because a start is never
//! later than `busy_until` and never earlier than its launch, the reserved time after any
//! instant `t` is contiguous up to `busy_until`: busy time up to `t` is `committed -
//! max(0, busy_until - t)`. Times are `CLOCK_MONOTONIC` nanoseconds.
//!
//! Utilisation for NVML: every launch (and NVML query) drops a `(time, busy)` snapshot into a
//! 64-entry ring at 20 ms spacing; "busy % over the last sample period" compares now with the
//! newest snapshot at least [`SAMPLE_PERIOD_NS`] old. Processes have slots of their own (busy
//! time, last activity, two snapshots) for per-process samples and the running-process list.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// File name beside the node description.
pub const FILE_NAME: &str = "gpufence-mock-timeline";
/// Lanes: 8 per GPU minor (0 = the whole GPU, 1.. = MIG instances), 64 minors.
pub const LANES: usize = 512;
pub const PROCS: usize = 32;
const RING: usize = 64;
const SNAP_SPACING_MS: u64 = 20;
/// NVML's "last sample period" (real GPUs: between 1/6 s and 1 s).
pub const SAMPLE_PERIOD_NS: u64 = 200_000_000;
/// A process slot counts as running while it launched within this long.
pub const ACTIVE_NS: u64 = 2_000_000_000;
const MAGIC: u64 = 0x746c_6e65_6666_7067; // "gpffentl"
const VERSION: u64 = 1;

#[repr(C)]
pub struct Proc {
    /// random per-process token (0 = free)
    token: AtomicU64,
    pid: AtomicU64,
    busy: AtomicU64,
    last_end: AtomicU64,
    last_launch: AtomicU64,
    prev: AtomicU64,
    cur: AtomicU64,
}

#[repr(C)]
pub struct Lane {
    busy_until: AtomicU64,
    committed: AtomicU64,
    kernels: AtomicU64,
    ring: [AtomicU64; RING],
    procs: [Proc; PROCS],
}

#[repr(C)]
pub struct Timeline {
    magic: AtomicU64,
    version: AtomicU64,
    lanes: [Lane; LANES],
}

pub const SIZE: usize = std::mem::size_of::<Timeline>();

/// Monotonic clock in nanoseconds.
pub fn now_ns() -> u64 {
    clock(libc::CLOCK_MONOTONIC)
}

/// Realtime clock in microseconds (NVML sample timestamps).
pub fn realtime_us() -> u64 {
    clock(libc::CLOCK_REALTIME) / 1000
}

fn clock(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleep (never spin) until the monotonic clock reaches `t`.
pub fn sleep_until(t: u64) {
    let ts = libc::timespec {
        tv_sec: (t / 1_000_000_000) as libc::time_t,
        tv_nsec: (t % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: plain syscall with a valid timespec.
        let r = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if r != libc::EINTR {
            return;
        }
    }
}

/// Lane of a GPU minor (`mig` = MIG instance position + 1, or 0 for the whole GPU).
pub fn lane_index(minor: u32, mig: usize) -> usize {
    (minor as usize * 8 + mig.min(7)) % LANES
}

/// Where the timeline of the node file at `node` lives: the node's `timeline` path when it
/// exists in this mount namespace, else beside the node file.
pub fn path_for(node_file: &Path, named: Option<&str>) -> PathBuf {
    if let Some(p) = named.map(Path::new).filter(|p| p.exists()) {
        return p.to_path_buf();
    }
    node_file.with_file_name(FILE_NAME)
}

/// Map the timeline file (creating it 0666 if absent); a private anonymous timeline (this
/// process only) when the file cannot be used. None only when mmap itself fails.
pub fn open(path: &Path) -> Option<(&'static Timeline, bool)> {
    if let Some(t) = open_file(path) {
        return Some((t, true));
    }
    // SAFETY: anonymous shared mapping; zeroed memory is a valid Timeline (atomics).
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
    // SAFETY: as above.
    Some((unsafe { &*(p as *const Timeline) }, false))
}

fn open_file(path: &Path) -> Option<&'static Timeline> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let flags = libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    // SAFETY: plain syscalls on a valid path; the mapping outlives the fd.
    unsafe {
        let mut fd = libc::open(c.as_ptr(), flags | libc::O_CREAT | libc::O_EXCL, 0o666);
        if fd >= 0 {
            libc::fchmod(fd, 0o666);
        } else {
            fd = libc::open(c.as_ptr(), flags);
            if fd < 0 {
                return None;
            }
        }
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 || (st.st_mode & libc::S_IFMT) != libc::S_IFREG {
            libc::close(fd);
            return None;
        }
        if (st.st_size as u64) < SIZE as u64 && libc::ftruncate(fd, SIZE as libc::off_t) != 0 {
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
        let t = &*(p as *const Timeline);
        let _ = t
            .version
            .compare_exchange(0, VERSION, Ordering::AcqRel, Ordering::Acquire);
        let _ = t
            .magic
            .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire);
        if t.magic.load(Ordering::Acquire) != MAGIC || t.version.load(Ordering::Acquire) != VERSION
        {
            libc::munmap(p, SIZE);
            return None;
        }
        Some(t)
    }
}

fn pack(t_ns: u64, busy_ns: u64) -> u64 {
    // milliseconds since boot (49 days) | busy microseconds modulo 2^32 (differences stay right
    // over any window shorter than 71 minutes)
    ((t_ns / 1_000_000) << 32) | ((busy_ns / 1000) & 0xffff_ffff)
}

fn unpack(v: u64) -> (u64, u64) {
    (v >> 32, v & 0xffff_ffff)
}

/// Busy % between two packed snapshots (None when they are not ordered in time).
fn pct(old: u64, new: u64) -> Option<u32> {
    let (t0, b0) = unpack(old);
    let (t1, b1) = unpack(new);
    if old == 0 || t1 <= t0 {
        return None;
    }
    let busy_us = b1.wrapping_sub(b0) & 0xffff_ffff;
    Some(((busy_us * 100 / ((t1 - t0) * 1000)) as u32).min(100))
}

/// One process's identity on the timeline.
#[derive(Clone, Copy, Debug)]
pub struct Me {
    pub token: u64,
    pub pid: u64,
}

impl Me {
    pub fn new() -> Me {
        // SAFETY: getpid never fails.
        let pid = unsafe { libc::getpid() } as u64;
        let mut token = 0u64;
        // SAFETY: valid buffer of 8 bytes.
        unsafe { libc::getrandom((&mut token as *mut u64).cast(), 8, 0) };
        Me {
            token: token | 1,
            pid,
        }
    }
}

impl Default for Me {
    fn default() -> Self {
        Me::new()
    }
}

impl Lane {
    /// Reserve `dur` ns of this lane for a kernel launched at `now`; returns (start, end).
    pub fn reserve(&self, dur: u64, now: u64, me: &Me) -> (u64, u64) {
        let mut cur = self.busy_until.load(Ordering::Acquire);
        let (start, end) = loop {
            let start = cur.max(now);
            let end = start + dur;
            match self.busy_until.compare_exchange_weak(
                cur,
                end,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break (start, end),
                Err(c) => cur = c,
            }
        };
        self.committed.fetch_add(dur, Ordering::AcqRel);
        self.kernels.fetch_add(1, Ordering::Relaxed);
        self.snapshot(now);
        if let Some(p) = self.proc_slot(me, now) {
            let busy = p.busy.fetch_add(dur, Ordering::AcqRel) + dur;
            p.last_end.fetch_max(end, Ordering::AcqRel);
            p.last_launch.store(now, Ordering::Release);
            let cur = p.cur.load(Ordering::Acquire);
            if cur == 0 || (now / 1_000_000).saturating_sub(unpack(cur).0) >= 100 {
                let future = end.saturating_sub(now).min(busy);
                p.prev.store(cur, Ordering::Release);
                p.cur.store(pack(now, busy - future), Ordering::Release);
            }
        }
        (start, end)
    }

    /// When work queued behind everything launched so far would start.
    pub fn busy_until(&self) -> u64 {
        self.busy_until.load(Ordering::Acquire)
    }

    /// Device time this lane has spent running kernels up to `now`.
    pub fn busy_at(&self, now: u64) -> u64 {
        let c = self.committed.load(Ordering::Acquire);
        c.saturating_sub(self.busy_until().saturating_sub(now))
    }

    /// Kernels launched on this lane so far.
    pub fn kernels(&self) -> u64 {
        self.kernels.load(Ordering::Relaxed)
    }

    fn snapshot(&self, now: u64) {
        let ms = now / 1_000_000;
        let i = ((ms / SNAP_SPACING_MS) as usize) % RING;
        let e = &self.ring[i];
        let old = e.load(Ordering::Relaxed);
        if old == 0 || unpack(old).0 / SNAP_SPACING_MS != ms / SNAP_SPACING_MS {
            e.store(pack(now, self.busy_at(now)), Ordering::Release);
        }
    }

    /// Busy % over the last sample period (0–100).
    pub fn utilization(&self, now: u64) -> u32 {
        self.snapshot(now);
        let cur = pack(now, self.busy_at(now));
        let now_ms = now / 1_000_000;
        let period_ms = SAMPLE_PERIOD_NS / 1_000_000;
        let horizon_ms = (RING as u64 - 1) * SNAP_SPACING_MS;
        let best = self
            .ring
            .iter()
            .map(|e| e.load(Ordering::Acquire))
            .filter(|v| {
                let t = unpack(*v).0;
                *v != 0 && t + period_ms <= now_ms && t + horizon_ms >= now_ms
            })
            .max_by_key(|v| unpack(*v).0);
        match best {
            Some(old) => pct(old, cur).unwrap_or(0),
            // nothing old enough: whatever was seen since the first snapshot
            None => self
                .ring
                .iter()
                .map(|e| e.load(Ordering::Acquire))
                .filter(|v| *v != 0 && unpack(*v).0 + horizon_ms >= now_ms)
                .min_by_key(|v| unpack(*v).0)
                .and_then(|old| pct(old, cur))
                .unwrap_or(0),
        }
    }

    /// This process's slot, claimed on first use (a free slot, or one idle for 10 s).
    fn proc_slot(&self, me: &Me, now: u64) -> Option<&Proc> {
        if let Some(p) = self
            .procs
            .iter()
            .find(|p| p.token.load(Ordering::Acquire) == me.token)
        {
            return Some(p);
        }
        for p in &self.procs {
            let t = p.token.load(Ordering::Acquire);
            let stale = t != 0
                && now.saturating_sub(p.last_launch.load(Ordering::Acquire)) > 10_000_000_000;
            if (t == 0 || stale)
                && p.token
                    .compare_exchange(t, me.token, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                for a in [&p.busy, &p.last_end, &p.prev, &p.cur] {
                    a.store(0, Ordering::Release);
                }
                p.last_launch.store(now, Ordering::Release);
                p.pid.store(me.pid, Ordering::Release);
                return Some(p);
            }
        }
        None
    }

    /// Processes that launched within [`ACTIVE_NS`]: (pid, busy ns so far, utilisation % over
    /// their last ~100 ms sample, sample time in CLOCK_MONOTONIC ns).
    pub fn processes(&self, now: u64) -> Vec<ProcSample> {
        self.procs
            .iter()
            .filter(|p| p.token.load(Ordering::Acquire) != 0)
            .filter(|p| now.saturating_sub(p.last_launch.load(Ordering::Acquire)) <= ACTIVE_NS)
            .map(|p| {
                let cur = p.cur.load(Ordering::Acquire);
                ProcSample {
                    pid: p.pid.load(Ordering::Acquire),
                    busy_ns: p.busy.load(Ordering::Acquire),
                    util: pct(p.prev.load(Ordering::Acquire), cur).unwrap_or(0),
                    at_ns: unpack(cur).0 * 1_000_000,
                }
            })
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcSample {
    pub pid: u64,
    pub busy_ns: u64,
    pub util: u32,
    pub at_ns: u64,
}

impl Timeline {
    pub fn lane(&self, i: usize) -> &Lane {
        &self.lanes[i % LANES]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn private() -> &'static Timeline {
        open(Path::new("/nonexistent/dir/t")).unwrap().0
    }

    #[test]
    fn one_kernel_at_a_time_in_launch_order() {
        let t = private();
        let (a, b) = (Me::new(), Me::new());
        let l = t.lane(3);
        let now = 1_000_000_000;
        assert_eq!(l.reserve(1000, now, &a), (now, now + 1000));
        // launched later but while the first runs: queued behind it
        assert_eq!(l.reserve(500, now + 10, &b), (now + 1000, now + 1500));
        // busy time at any instant after the last launch
        assert_eq!(l.busy_at(now + 1200), 1200);
        // after the lane went idle: starts at its launch
        assert_eq!(l.reserve(7, now + 5000, &a), (now + 5000, now + 5007));
        assert_eq!(l.busy_at(now + 10_000), 1507);
        assert_eq!(l.kernels(), 3);
        let ps = l.processes(now + 6000);
        assert_eq!(ps.len(), 2);
        assert_eq!(ps.iter().map(|p| p.busy_ns).sum::<u64>(), 1507);
        // other lanes untouched
        assert_eq!(t.lane(4).busy_at(now + 10_000), 0);
    }

    #[test]
    fn utilization_over_the_sample_period() {
        let t = private();
        let me = Me::new();
        let l = t.lane(9);
        let ms = 1_000_000u64;
        let base = 50_000 * ms;
        // 1 s of 50 % duty: 1 ms kernels every 2 ms
        for k in 0..500 {
            l.reserve(ms, base + k * 2 * ms, &me);
        }
        let u = l.utilization(base + 1000 * ms);
        assert!((45..=55).contains(&u), "{u}");
        // idle for a second: 0 %
        assert_eq!(l.utilization(base + 2200 * ms), 0);
    }

    #[test]
    fn packed_differences_survive_wrap() {
        let a = pack(1_000_000_000, (u32::MAX as u64 - 10) * 1000);
        let b = pack(1_100_000_000, (u32::MAX as u64 + 50_000 - 10) * 1000);
        assert_eq!(pct(a, b), Some(50));
    }
}
