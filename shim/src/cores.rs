//! The compute share: every process of a container together gets at most `cores` percent of
//! its GPU's time (hard cap), or may use idle time beyond it (`cores-policy=burst`).
//!
//! **Cost of a launch.** The shim cannot see inside the GPU, so it learns what each kernel (or
//! graph) costs: the first launches of a function, then one in 128, are bracketed by two events
//! (`cuEventRecord` before and after, on the launch's stream); `cuEventElapsedTime` of the pair,
//! read later without waiting, is that launch's device time. The cost kept is the minimum seen,
//! drifting up by 1/8 of a larger sample (time queued behind another context inflates a sample;
//! a kernel that really got slower is followed). Everything else on the hot path is one cache
//! lookup, one clock read and one CAS.
//!
//! **Pacing (the sliding window).** A GCRA ("virtual scheduling") per device in the shared
//! section: `tat` is the time at which the container's device-time budget is next free. A launch
//! of cost `c` at share `p` moves `tat` to `max(tat, now - credit) + c * 100 / p` and may start
//! once the old `tat` is due; otherwise the thread sleeps (`clock_nanosleep`, never a spin)
//! until then. So over any window `W` the container's device time is at most `p * W` plus one
//! credit of [`CREDIT_NS`] of device time (20 ms: 2 points of a 1 s window), and a process that
//! overslept or stalled catches up by at most that much. All processes of the container charge
//! the same `tat`, so the share is summed over them; a SIGKILLed process leaves nothing held
//! (the budget is a timestamp, not a lock).
//!
//! **Burst.** With `cores-policy=burst` the share is 100 % while nobody else uses the GPU. Every
//! [`CHECK_NS`] one process of the container compares NVML's device utilisation with the
//! container's own device time over the same 200 ms; when others used 10 % or more, the
//! container is held to its share for the next [`CONTENDED_NS`] (also when NVML cannot say).
//! From first contention to
//! share: one check period + NVML's sample period, well under a second.
//!
//! State lives in its own section of the container's accounting file (at [`OFFSET`], after the
//! memory accounting region), or in anonymous memory when that file cannot be used.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};

use crate::real;
use crate::region::MAX_DEVICES;
use crate::state::{self, Config};

/// Byte offset of the compute section in the accounting file: after the memory region (checked
/// at compile time) and small enough that both fit the 1 MiB tmpfs main mounts at /run/gpufence.
pub const OFFSET: i64 = 768 << 10;
const MAGIC: u64 = 0x6366_636f_7265_7331; // "cfcores1"
/// Device time a container may run ahead after being idle or delayed.
pub const CREDIT_NS: u64 = 20_000_000;
pub const CHECK_NS: u64 = 100_000_000;
pub const CONTENDED_NS: u64 = 500_000_000;
const WINDOW_NS: u64 = 200_000_000;
const RING: usize = 16;
const RING_SPACING_NS: u64 = 25_000_000;

#[repr(C)]
struct Dev {
    tat: AtomicU64,
    /// device time charged so far (ns)
    consumed: AtomicU64,
    check_at: AtomicU64,
    contended_until: AtomicU64,
    /// (ms << 32 | consumed µs mod 2^32) every 25 ms, for the burst check
    ring: [AtomicU64; RING],
}

#[repr(C)]
struct Section {
    magic: AtomicU64,
    devs: [Dev; MAX_DEVICES],
}

const SECTION_SIZE: usize = std::mem::size_of::<Section>();
// the memory accounting region must end before the compute section starts
const _: () = assert!(crate::region::SIZE as i64 <= OFFSET);

/// 0 = not mapped yet, 1 = unusable, else the mapping.
static SECTION: AtomicUsize = AtomicUsize::new(0);

fn section(cfg: &Config) -> Option<&'static Section> {
    match SECTION.load(Ordering::Acquire) {
        0 => map_section(cfg),
        1 => None,
        // SAFETY: a mapping of SECTION_SIZE bytes published once, never unmapped.
        p => Some(unsafe { &*(p as *const Section) }),
    }
}

#[cold]
fn map_section(cfg: &Config) -> Option<&'static Section> {
    let p = map_file(cfg).or_else(map_private);
    let v = p.map_or(1, |p| p as usize);
    match SECTION.compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(_) => {
            if let Some(p) = p {
                // SAFETY: our own unpublished mapping.
                unsafe { libc::munmap(p, SECTION_SIZE) };
            }
        }
    }
    match SECTION.load(Ordering::Acquire) {
        0 | 1 => None,
        p => {
            // SAFETY: as in section(): a value other than the 0/1 sentinels is a mapping of
            // SECTION_SIZE bytes (file-backed or private) published once and never unmapped.
            let s = unsafe { &*(p as *const Section) };
            let _ = s
                .magic
                .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire);
            (s.magic.load(Ordering::Acquire) == MAGIC).then_some(s)
        }
    }
}

fn map_file(cfg: &Config) -> Option<*mut c_void> {
    if cfg.backing != crate::region::Backing::File {
        return None;
    }
    let mut path = cfg.dir.to_bytes().to_vec();
    path.extend_from_slice(b"/");
    path.extend_from_slice(crate::region::FILE_NAME.as_bytes());
    let path = std::ffi::CString::new(path).ok()?;
    // SAFETY: plain syscalls; the mapping outlives the fd.
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        );
        if fd < 0 {
            return None;
        }
        let mut st: libc::stat = std::mem::zeroed();
        let end = OFFSET + SECTION_SIZE as i64;
        let ok = libc::fstat(fd, &mut st) == 0
            && (st.st_mode & libc::S_IFMT) == libc::S_IFREG
            && (st.st_size >= end || crate::region::grow_to(fd, OFFSET, SECTION_SIZE as i64));
        let p = if ok {
            libc::mmap(
                std::ptr::null_mut(),
                SECTION_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                OFFSET,
            )
        } else {
            libc::MAP_FAILED
        };
        libc::close(fd);
        (p != libc::MAP_FAILED).then_some(p)
    }
}

fn map_private() -> Option<*mut c_void> {
    // SAFETY: anonymous shared mapping (forked children keep pacing together).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SECTION_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p)
}

#[inline]
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer (vDSO, no syscall).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn sleep_until(t: u64) {
    let ts = libc::timespec {
        tv_sec: (t / 1_000_000_000) as libc::time_t,
        tv_nsec: (t % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: plain syscall; EINTR just ends the sleep early (the caller re-checks nothing: the
    // budget was already reserved, so waking early only shifts this launch).
    unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    };
}

// ---------------------------------------------------------------------------------------------
// Learned costs (per process)

const COSTS: usize = 1024;
const UNKNOWN: u64 = u64::MAX;
static COST_KEY: [AtomicU64; COSTS] = [const { AtomicU64::new(0) }; COSTS];
static COST_NS: [AtomicU64; COSTS] = [const { AtomicU64::new(UNKNOWN) }; COSTS];
static COST_N: [AtomicU64; COSTS] = [const { AtomicU64::new(0) }; COSTS];

fn cost_slot(key: u64) -> usize {
    ((key >> 4) ^ (key >> 14) ^ (key >> 24)) as usize % COSTS
}

/// (cost in ns or UNKNOWN, how many launches of `key` came before).
#[inline]
fn cost_of(key: u64) -> (u64, u64) {
    let i = cost_slot(key);
    if COST_KEY[i].load(Ordering::Acquire) != key {
        // a new kernel (or a collision: the newcomer takes the slot and is learnt again)
        COST_NS[i].store(UNKNOWN, Ordering::Release);
        COST_N[i].store(0, Ordering::Release);
        COST_KEY[i].store(key, Ordering::Release);
    }
    (
        COST_NS[i].load(Ordering::Acquire),
        COST_N[i].fetch_add(1, Ordering::AcqRel),
    )
}

fn learn(key: u64, ns: u64) {
    let i = cost_slot(key);
    if COST_KEY[i].load(Ordering::Acquire) != key {
        return;
    }
    let _ = COST_NS[i].fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
        Some(if old == UNKNOWN || ns <= old {
            ns
        } else {
            old + (ns - old) / 8
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Measurements in flight: event pairs around sampled launches

const PENDING: usize = 8;
const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const ARMED: u8 = 2;

struct Pending {
    state: AtomicU8,
    key: AtomicU64,
    start: AtomicUsize,
    end: AtomicUsize,
}

static PEND: [Pending; PENDING] = [const {
    Pending {
        state: AtomicU8::new(FREE),
        key: AtomicU64::new(0),
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
    }
}; PENDING];
static ARMED_COUNT: AtomicUsize = AtomicUsize::new(0);

/// A claimed measurement slot with its two events.
pub struct Sample(usize);

fn claim(key: u64) -> Option<Sample> {
    let create = real::cuEventCreate()?;
    for (i, p) in PEND.iter().enumerate() {
        if p.state
            .compare_exchange(FREE, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            for e in [&p.start, &p.end] {
                if e.load(Ordering::Acquire) == 0 {
                    let mut h: usize = 0;
                    // SAFETY: real driver call with a valid out-pointer.
                    if unsafe { create(&mut h, 0) } != 0 {
                        p.state.store(FREE, Ordering::Release);
                        return None;
                    }
                    e.store(h, Ordering::Release);
                }
            }
            p.key.store(key, Ordering::Release);
            return Some(Sample(i));
        }
    }
    None
}

type RecordFn = unsafe extern "C" fn(usize, usize) -> c_int;

fn record_fn(ptsz: bool) -> Option<RecordFn> {
    if ptsz {
        real::cuEventRecord_ptsz()
    } else {
        real::cuEventRecord()
    }
}

impl Sample {
    /// Record the start event on `stream`; false (and the slot freed) when that fails.
    pub fn begin(&self, stream: usize, ptsz: bool) -> bool {
        let p = &PEND[self.0];
        // SAFETY: real driver call on our own event.
        let ok = record_fn(ptsz)
            .is_some_and(|f| unsafe { f(p.start.load(Ordering::Acquire), stream) } == 0);
        if !ok {
            p.state.store(FREE, Ordering::Release);
        }
        ok
    }

    /// Record the end event after a successful launch and arm the slot.
    pub fn end(self, stream: usize, ptsz: bool, launched: bool) {
        let p = &PEND[self.0];
        // SAFETY: as in begin.
        let ok = launched
            && record_fn(ptsz)
                .is_some_and(|f| unsafe { f(p.end.load(Ordering::Acquire), stream) } == 0);
        if ok {
            ARMED_COUNT.fetch_add(1, Ordering::AcqRel);
            p.state.store(ARMED, Ordering::Release);
        } else {
            p.state.store(FREE, Ordering::Release);
        }
    }
}

/// Read the measurements whose end event completed (never waits).
fn poll() {
    if ARMED_COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let (Some(query), Some(elapsed)) = (real::cuEventQuery(), real::cuEventElapsedTime()) else {
        return;
    };
    for p in &PEND {
        if p.state
            .compare_exchange(ARMED, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            continue;
        }
        let (s, e) = (
            p.start.load(Ordering::Acquire),
            p.end.load(Ordering::Acquire),
        );
        // SAFETY: real driver calls on our own events.
        let r = unsafe { query(e) };
        if r == CUDA_ERROR_NOT_READY {
            p.state.store(ARMED, Ordering::Release);
            continue;
        }
        let mut ms: f32 = 0.0;
        // SAFETY: as above, valid out-pointer.
        if r == 0 && unsafe { elapsed(&mut ms, s, e) } == 0 && ms >= 0.0 {
            learn(p.key.load(Ordering::Acquire), (ms as f64 * 1e6) as u64);
        }
        ARMED_COUNT.fetch_sub(1, Ordering::AcqRel);
        p.state.store(FREE, Ordering::Release);
    }
}

const CUDA_ERROR_NOT_READY: c_int = 600;

/// Fork child: the parent's events belong to its contexts (atomics only).
pub fn forget_process() {
    for p in &PEND {
        p.state.store(FREE, Ordering::Relaxed);
        p.start.store(0, Ordering::Relaxed);
        p.end.store(0, Ordering::Relaxed);
    }
    ARMED_COUNT.store(0, Ordering::Relaxed);
}

// ---------------------------------------------------------------------------------------------
// Capture: launches on a capturing stream build a graph, they do not run

static CAPTURING: AtomicUsize = AtomicUsize::new(0);

pub fn capture_begun() {
    CAPTURING.fetch_add(1, Ordering::AcqRel);
}

pub fn capture_ended() {
    let _ = CAPTURING.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
}

pub fn capturing(stream: usize, ptsz: bool) -> bool {
    if CAPTURING.load(Ordering::Acquire) == 0 {
        return false;
    }
    let f = if ptsz {
        real::cuStreamIsCapturing_ptsz()
    } else {
        real::cuStreamIsCapturing()
    };
    let mut st: c_int = 0;
    // SAFETY: real driver call with a valid out-pointer.
    f.is_some_and(|f| unsafe { f(stream, &mut st) } == 0 && st != 0)
}

// ---------------------------------------------------------------------------------------------
// Admission

/// Pace a launch of `key` (function or graph exec) on `stream` of the current device. Returns
/// a measurement to bracket the launch with, when this launch is sampled. Sleeps while the
/// container is over its share.
#[inline]
pub fn admit(key: u64, stream: usize, ptsz: bool) -> Option<Sample> {
    let cfg = state::config()?;
    if !cfg.any_cores {
        return None;
    }
    admit_limited(cfg, key, stream, ptsz)
}

fn admit_limited(cfg: &'static Config, key: u64, stream: usize, ptsz: bool) -> Option<Sample> {
    let get = real::cuCtxGetDevice()?;
    let mut dev: c_int = 0;
    // SAFETY: real driver call with a valid out-pointer.
    if unsafe { get(&mut dev) } != 0 {
        return None;
    }
    let (idx, share) = state::cores_for(cfg, dev)?;
    if capturing(stream, ptsz) {
        return None;
    }
    poll();
    let sec = section(cfg)?;
    let d = &sec.devs[idx];
    let (cost, n) = cost_of(key);
    let now = now_ns();
    let share = if cfg.cores_burst && !contended(cfg, idx, d, now) {
        100
    } else {
        share.clamp(1, 100)
    };
    if cost != UNKNOWN {
        let inc = cost.saturating_mul(100) / share as u64;
        let credit = CREDIT_NS.saturating_mul(100) / share as u64;
        let mut cur = d.tat.load(Ordering::Acquire);
        let start = loop {
            let start = cur.max(now.saturating_sub(credit));
            match d
                .tat
                .compare_exchange_weak(cur, start + inc, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break start,
                Err(c) => cur = c,
            }
        };
        d.consumed.fetch_add(cost, Ordering::AcqRel);
        cfg.region.note_compute(idx, cost);
        if start > now {
            sleep_until(start);
        }
    }
    (n < 3 || n % 128 == 0).then(|| claim(key)).flatten()
}

/// Is anyone outside the container using the GPU? Refreshed every CHECK_NS by one process.
fn contended(cfg: &Config, idx: usize, d: &Dev, now: u64) -> bool {
    note_consumed(d, now);
    let at = d.check_at.load(Ordering::Acquire);
    if now >= at
        && d.check_at
            .compare_exchange(at, now + CHECK_NS, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        let others = cfg
            .entries
            .get(idx)
            .and_then(|e| nvml_utilization(&e.uuid_text))
            .map(|total| total as i64 - own_percent(d, now) as i64);
        // fail closed: without NVML's word that the GPU is otherwise idle, hold to the share
        if others.is_none_or(|o| o >= 10) {
            d.contended_until
                .store(now + CONTENDED_NS, Ordering::Release);
        }
    }
    d.contended_until.load(Ordering::Acquire) > now
}

fn pack(t: u64, consumed: u64) -> u64 {
    ((t / 1_000_000) << 32) | ((consumed / 1000) & 0xffff_ffff)
}

fn note_consumed(d: &Dev, now: u64) {
    let tick = now / RING_SPACING_NS;
    let e = &d.ring[(tick as usize) % RING];
    let old = e.load(Ordering::Relaxed);
    if old == 0 || (old >> 32) * 1_000_000 / RING_SPACING_NS != tick {
        e.store(
            pack(now, d.consumed.load(Ordering::Acquire)),
            Ordering::Release,
        );
    }
}

/// The container's own device time over the last ~200 ms, in percent.
fn own_percent(d: &Dev, now: u64) -> u64 {
    let now_ms = now / 1_000_000;
    let want = (now.saturating_sub(WINDOW_NS)) / 1_000_000;
    let Some(old) = d
        .ring
        .iter()
        .map(|e| e.load(Ordering::Acquire))
        .filter(|v| *v != 0 && (v >> 32) <= want && (v >> 32) + 400 >= now_ms)
        .max_by_key(|v| v >> 32)
    else {
        return 0;
    };
    let cur = pack(now, d.consumed.load(Ordering::Acquire));
    let dt_ms = (cur >> 32).saturating_sub(old >> 32).max(1);
    let used_us = (cur & 0xffff_ffff).wrapping_sub(old & 0xffff_ffff) & 0xffff_ffff;
    used_us / 10 / dt_ms
}

// NVML, loaded by the shim itself for the burst check only.

type NvmlInit = unsafe extern "C" fn() -> c_int;
type NvmlByUuid = unsafe extern "C" fn(*const libc::c_char, *mut *mut c_void) -> c_int;
type NvmlUtil = unsafe extern "C" fn(*mut c_void, *mut [c_uint; 2]) -> c_int;

/// NVML's "busy % over the last sample period" of the GPU with this UUID.
fn nvml_utilization(uuid: &str) -> Option<u32> {
    static LIB: AtomicUsize = AtomicUsize::new(0);
    let mut h = LIB.load(Ordering::Acquire);
    if h == 0 {
        // SAFETY: loading the node's NVML (already loaded by most GPU programs).
        h = unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW) } as usize;
        if h == 0 {
            return None;
        }
        let init: NvmlInit = sym(h, c"nvmlInit_v2")?;
        // SAFETY: real NVML call.
        if unsafe { init() } != 0 {
            return None;
        }
        LIB.store(h, Ordering::Release);
    }
    let by_uuid: NvmlByUuid = sym(h, c"nvmlDeviceGetHandleByUUID")?;
    let util: NvmlUtil = sym(h, c"nvmlDeviceGetUtilizationRates")?;
    let u = std::ffi::CString::new(uuid).ok()?;
    let mut dev: *mut c_void = std::ptr::null_mut();
    let mut out: [c_uint; 2] = [0; 2];
    // SAFETY: real NVML calls with valid pointers.
    unsafe { (by_uuid(u.as_ptr(), &mut dev) == 0 && util(dev, &mut out) == 0).then_some(out[0]) }
}

fn sym<T: Copy>(h: usize, name: &std::ffi::CStr) -> Option<T> {
    // SAFETY: real dlsym on a handle from dlopen.
    let p = unsafe { real::real_dlsym()(h as *mut c_void, name.as_ptr()) };
    if p.is_null() || real::is_ours(p as usize) {
        return None;
    }
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<usize>());
    // SAFETY: T is the function pointer type of the named NVML function.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_learn_the_minimum_and_drift_up_slowly() {
        let k = 0xabc0;
        assert_eq!(cost_of(k), (UNKNOWN, 0));
        learn(k, 3000);
        learn(k, 1000);
        assert_eq!(cost_of(k).0, 1000);
        learn(k, 9000);
        assert_eq!(cost_of(k).0, 2000);
        assert_eq!(cost_of(k).1, 3);
        // another key in the same slot takes it over
        let other = k + (COSTS as u64) * 16 * 1024 * 1024 * 1024;
        if cost_slot(other) == cost_slot(k) {
            assert_eq!(cost_of(other).0, UNKNOWN);
        }
    }

    #[test]
    fn own_percent_over_the_window() {
        // SAFETY: zeroed Dev is valid (atomics).
        let d: Dev = unsafe { std::mem::zeroed() };
        let ms = 1_000_000u64;
        let base = 10_000 * ms;
        // 30 % for 400 ms
        for k in 0..=400 {
            let t = base + k * ms;
            if k % 10 == 0 {
                d.consumed.fetch_add(3 * ms, Ordering::AcqRel);
            }
            note_consumed(&d, t);
        }
        let p = own_percent(&d, base + 400 * ms);
        assert!((27..=33).contains(&p), "{p}");
    }
}
