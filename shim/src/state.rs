//! What this process enforces: the container's quota (file first, env only when there is no
//! file), the shared accounting region, and the mapping from this process's CUDA ordinals to the
//! quota's devices (by UUID, falling back to the ordinal).
//!
//! Everything is decided lazily on the first hooked call that needs it — never in a
//! constructor — and published through atomics.

use std::ffi::{CStr, CString, c_int};
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicU16, Ordering};

use crate::quota::Quota;
use crate::real;
use crate::region::{self, Backing, Region};

pub const DEFAULT_STATE_DIR: &str = "/run/gpufence";

/// One quota device.
#[derive(Debug, Clone)]
pub struct Entry {
    pub ordinal: u32,
    pub uuid: Option<[u8; 16]>,
    /// bytes; `u64::MAX` = no memory limit
    pub limit: u64,
    /// compute share in percent (None = no limit)
    pub cores: Option<u8>,
    /// `GPU-…` as written in the quota (NVML lookups of the burst policy)
    pub uuid_text: String,
}

pub struct Config {
    pub oversubscribe: bool,
    /// Explain a refused allocation on stderr (once per process).
    pub explain: bool,
    pub entries: Vec<Entry>,
    pub region: &'static Region,
    pub backing: Backing,
    /// compute shares may use idle GPU time (`cores-policy=burst`)
    pub cores_burst: bool,
    /// some device has a compute share
    pub any_cores: bool,
    /// the state directory (the compute section lives in its accounting file)
    pub dir: CString,
}

const UNKNOWN: u8 = 0;
const PASSTHROUGH: u8 = 1;
const ENFORCING: u8 = 2;
const BUSY: u8 = 3;

static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);
static CONFIG: AtomicPtr<Config> = AtomicPtr::new(std::ptr::null_mut());

/// The config when a quota applies; None = pure pass-through.
#[inline]
pub fn config() -> Option<&'static Config> {
    match MODE.load(Ordering::Acquire) {
        PASSTHROUGH => None,
        // SAFETY: published once (Box::leak) before MODE became ENFORCING.
        ENFORCING => unsafe { CONFIG.load(Ordering::Acquire).as_ref() },
        _ => init(),
    }
}

#[cold]
fn init() -> Option<&'static Config> {
    loop {
        match MODE.compare_exchange(UNKNOWN, BUSY, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(PASSTHROUGH) => return None,
            // SAFETY: see config().
            Err(ENFORCING) => return unsafe { CONFIG.load(Ordering::Acquire).as_ref() },
            Err(_) => std::thread::yield_now(),
        }
    }
    match load() {
        Some(c) => {
            let c: &'static Config = Box::leak(Box::new(c));
            CONFIG.store(c as *const Config as *mut Config, Ordering::Release);
            MODE.store(ENFORCING, Ordering::Release);
            if c.backing == Backing::Private {
                warn("accounting region unavailable; quota enforced per process only");
            }
            Some(c)
        }
        None => {
            MODE.store(PASSTHROUGH, Ordering::Release);
            None
        }
    }
}

pub fn warn(msg: &str) {
    // one line on stderr, straight to the fd (no std buffering or locks)
    let line = format!("gpufence: {msg}\n");
    // SAFETY: writing a valid buffer to fd 2.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// Where gpufence mounts this library inside the containers it sets up (the plan's
/// `CONTAINER_SHIM_PATH`).
pub const CONTAINER_SHIM_PATH: &CStr = c"/usr/lib/gpufence/libgpufence.so";

/// Whether this copy of the shim is the one gpufence mounted into a container: loaded from
/// `CONTAINER_SHIM_PATH` (by name, or the same file under another name, e.g. `/lib/…` on a
/// merged-/usr image). Then the state directory is fixed at `/run/gpufence` and every missing
/// piece fails closed; elsewhere (host-side tests, a shim preloaded by hand) `GPUFENCE_STATE`
/// may point it at another directory and the env quota applies without a file.
pub fn in_gpufence_container() -> bool {
    // SAFETY: Dl_info is plain data; all-zero is a valid value for dladdr to overwrite.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let me = in_gpufence_container as fn() -> bool as *const libc::c_void;
    // SAFETY: dladdr only reads the loader's tables for an address of this object.
    if unsafe { libc::dladdr(me, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the dynamic loader, alive while
    // this object is loaded.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    if name == CONTAINER_SHIM_PATH {
        return true;
    }
    let id = |p: &CStr| {
        // SAFETY: stat is plain data; all-zero is valid for stat to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: p is NUL-terminated; st is a valid out-buffer.
        (unsafe { libc::stat(p.as_ptr(), &mut st) } == 0).then_some((st.st_dev, st.st_ino))
    };
    matches!((id(name), id(CONTAINER_SHIM_PATH)), (Some(a), Some(b)) if a == b)
}

/// The state directory: fixed inside a gpufence container, else `GPUFENCE_STATE` (default
/// `/run/gpufence`).
pub fn state_dir(fixed: bool) -> CString {
    let env = std::env::var_os("GPUFENCE_STATE").filter(|v| !v.is_empty());
    if fixed {
        if env.as_deref().is_some_and(|v| v != DEFAULT_STATE_DIR) {
            warn("GPUFENCE_STATE ignored: the quota of a gpufence container is at /run/gpufence");
        }
        return CString::new(DEFAULT_STATE_DIR).unwrap_or_default();
    }
    env.and_then(|v| CString::new(std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str())).ok())
        .unwrap_or_else(|| CString::new(DEFAULT_STATE_DIR).unwrap_or_default())
}

fn load() -> Option<Config> {
    let fixed = in_gpufence_container();
    let dir = state_dir(fixed);
    let (oversubscribe, cores_burst, entries, quiet) = quota_entries(&dir, fixed)?;
    let any_cores = entries.iter().any(|e| e.cores.is_some());
    let explain = !quiet
        && std::env::var_os("GPUFENCE_REFUSAL_MESSAGES").is_none_or(|v| v != "0" && v != "false");
    let opened = region::open(&dir);
    match opened {
        // Inside a gpufence container the region must be the container's shared one.
        Some((region, backing)) if !(fixed && backing == Backing::Private) => Some(Config {
            oversubscribe,
            explain,
            entries,
            region,
            backing,
            cores_burst,
            any_cores,
            dir,
        }),
        _ => {
            warn("cannot map the container's accounting region; refusing all device memory");
            Some(Config {
                oversubscribe: false,
                explain,
                entries: entries
                    .into_iter()
                    .map(|e| Entry { limit: 0, ..e })
                    .collect(),
                region: match opened {
                    Some((r, _)) => r,
                    None => empty_region()?,
                },
                backing: Backing::Private,
                cores_burst,
                any_cores,
                dir,
            })
        }
    }
}

fn empty_region() -> Option<&'static Region> {
    region::open(c"/nonexistent").map(|r| r.0)
}

/// The quota: from the file when it exists; a file that exists but cannot be read or parsed
/// fails closed (every device limited to 0), and so does a missing one inside a gpufence
/// container (`fixed`); elsewhere env only without a file; None = no quota.
/// (oversubscribe, cores burst, devices, quota silences refusal messages)
type Entries = (bool, bool, Vec<Entry>, bool);

fn quota_entries(dir: &CStr, fixed: bool) -> Option<Entries> {
    let path = format!("{}/quota", dir.to_string_lossy());
    match std::fs::read_to_string(&path) {
        Ok(text) => match Quota::parse(&text) {
            Ok(q) => Some((
                q.oversubscribe,
                q.cores_burst,
                q.devices
                    .iter()
                    .take(region::MAX_DEVICES)
                    .map(|d| Entry {
                        ordinal: d.ordinal,
                        uuid: parse_uuid(&d.uuid),
                        limit: d.memory.unwrap_or(u64::MAX),
                        cores: d.cores,
                        uuid_text: d.uuid.clone(),
                    })
                    .collect(),
                q.quiet_refusals,
            )),
            Err(e) => {
                warn(&format!("{path}: {e}; refusing all device memory"));
                Some((false, false, fail_closed(), false))
            }
        },
        // A gpufence container always has its quota file: gone means tampered with.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !fixed => {
            env_entries().map(|(o, b, e)| (o, b, e, false))
        }
        Err(e) => {
            warn(&format!("{path}: {e}; refusing all device memory"));
            Some((false, false, fail_closed(), false))
        }
    }
}

fn fail_closed() -> Vec<Entry> {
    (0..region::MAX_DEVICES as u32)
        .map(|ordinal| Entry {
            ordinal,
            uuid: None,
            limit: 0,
            cores: None,
            uuid_text: String::new(),
        })
        .collect()
}

fn env_entries() -> Option<(bool, bool, Vec<Entry>)> {
    let mut entries: Vec<Entry> = Vec::new();
    for (k, v) in std::env::vars_os() {
        let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
            continue;
        };
        let (i, memory) = if let Some(i) = k.strip_prefix("GPUFENCE_MEMORY_LIMIT_") {
            (i, true)
        } else if let Some(i) = k.strip_prefix("GPUFENCE_CORES_") {
            (i, false)
        } else {
            continue;
        };
        let Ok(ordinal) = i.parse::<u32>() else {
            continue;
        };
        if ordinal as usize >= region::MAX_DEVICES {
            continue;
        }
        let pos = match entries.iter().position(|e| e.ordinal == ordinal) {
            Some(p) => p,
            None => {
                entries.push(Entry {
                    ordinal,
                    uuid: None,
                    limit: u64::MAX,
                    cores: None,
                    uuid_text: String::new(),
                });
                entries.len() - 1
            }
        };
        let e = &mut entries[pos];
        if memory {
            // malformed value: fail closed on that device
            e.limit = v.trim().parse::<u64>().unwrap_or_else(|_| {
                warn(&format!(
                    "{k}={v} is not a byte count; device {ordinal} gets no memory"
                ));
                0
            });
        } else {
            // malformed value: the smallest share
            e.cores = Some(
                v.trim()
                    .parse::<u8>()
                    .ok()
                    .filter(|c| (1..=100).contains(c))
                    .unwrap_or_else(|| {
                        warn(&format!(
                            "{k}={v} is not a percentage 1-100; device {ordinal} gets 1 %"
                        ));
                        1
                    }),
            );
        }
    }
    if entries.is_empty() {
        return None;
    }
    entries.sort_by_key(|e| e.ordinal);
    let over = std::env::var("GPUFENCE_OVERSUBSCRIBE").is_ok_and(|v| v == "1" || v == "true");
    let burst = std::env::var("GPUFENCE_CORES_POLICY").is_ok_and(|v| v == "burst");
    Some((over, burst, entries))
}

/// 16 bytes of `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` / `MIG-…` (None if not in that form).
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex = text
        .strip_prefix("GPU-")
        .or_else(|| text.strip_prefix("MIG-"))
        .unwrap_or(text);
    let digits: Vec<u8> = hex.bytes().filter(|b| *b != b'-').collect();
    if digits.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let s = std::str::from_utf8(&digits[2 * i..2 * i + 2]).ok()?;
        *o = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

// ---------------------------------------------------------------------------------------------
// CUDA ordinal → quota device

/// A device's enforcement: index into the region + limit.
#[derive(Clone, Copy, Debug)]
pub struct Acct {
    pub idx: usize,
    pub limit: u64,
}

const MAP_CAP: usize = 64;
/// 0 unknown, 1 no limit, 2 + entry index
static ORD_MAP: [AtomicU16; MAP_CAP] = [const { AtomicU16::new(0) }; MAP_CAP];
const NO_LIMIT: u16 = 1;

/// Enforcement for CUDA ordinal `dev` of this process (None = unlimited).
#[inline]
pub fn acct_for(cfg: &Config, dev: c_int) -> Result<Option<Acct>, ()> {
    let Ok(d) = usize::try_from(dev) else {
        return Ok(None);
    };
    if let Some(m) = ORD_MAP.get(d) {
        match m.load(Ordering::Acquire) {
            0 => {}
            NO_LIMIT => return Ok(None),
            v => return Ok(Some(acct(cfg, (v - 2) as usize))),
        }
    }
    let idx = map_ordinal(cfg, dev)?;
    if let Some(m) = ORD_MAP.get(d) {
        m.store(idx.map_or(NO_LIMIT, |i| i as u16 + 2), Ordering::Release);
    }
    Ok(idx.map(|i| acct(cfg, i)))
}

fn acct(cfg: &Config, idx: usize) -> Acct {
    let limit = cfg.entries.get(idx).map_or(0, |e| e.limit);
    Acct { idx, limit }
}

fn uuid_of(dev: c_int) -> Option<[u8; 16]> {
    let mut u = [0u8; 16];
    for f in [real::cuDeviceGetUuid_v2(), real::cuDeviceGetUuid()]
        .into_iter()
        .flatten()
    {
        // SAFETY: real driver call with a valid out-buffer.
        if unsafe { f(&mut u, dev) } == 0 {
            return Some(u);
        }
    }
    None
}

/// Entry index for a CUDA ordinal: the entry with its UUID; else the entry with the same
/// ordinal whose UUID names no device this process can see. Err when the driver cannot say
/// (not initialised): the caller passes the call through and the driver fails it.
#[cold]
fn map_ordinal(cfg: &Config, dev: c_int) -> Result<Option<usize>, ()> {
    let count_fn = real::cuDeviceGetCount().ok_or(())?;
    let mut n: c_int = 0;
    // SAFETY: real driver call.
    if unsafe { count_fn(&mut n) } != 0 || dev >= n {
        return Err(());
    }
    let visible: Vec<Option<[u8; 16]>> = (0..n).map(uuid_of).collect();
    let idx = entry_index(cfg, dev, &visible);
    Ok(idx.filter(|i| cfg.entries[*i].limit != u64::MAX))
}

/// The entry with the device's UUID; else the entry with the same ordinal whose UUID names no
/// device this process can see.
fn entry_index(cfg: &Config, dev: c_int, visible: &[Option<[u8; 16]>]) -> Option<usize> {
    let own = visible.get(dev as usize).copied().flatten();
    let by_uuid = cfg
        .entries
        .iter()
        .position(|e| e.uuid.is_some() && e.uuid == own);
    by_uuid.or_else(|| {
        cfg.entries.iter().position(|e| {
            e.ordinal == dev as u32 && e.uuid.is_none_or(|u| !visible.contains(&Some(u)))
        })
    })
}

/// Quota entry for an NVML device (by UUID text, else NVML index).
pub fn entry_for_nvml(cfg: &Config, uuid: Option<&str>, index: Option<u32>) -> Option<Acct> {
    let u = uuid.and_then(parse_uuid);
    let idx = cfg
        .entries
        .iter()
        .position(|e| u.is_some() && e.uuid == u)
        .or_else(|| {
            let i = index?;
            cfg.entries
                .iter()
                .position(|e| e.ordinal == i && (e.uuid.is_none() || u.is_none()))
        })?;
    (cfg.entries[idx].limit != u64::MAX).then(|| acct(cfg, idx))
}

/// Fork child: forget the ordinal maps (atomics only).
pub fn forget_process() {
    for m in ORD_MAP.iter().chain(CORES_MAP.iter()) {
        m.store(0, Ordering::Relaxed);
    }
}

/// 0 unknown, 1 no share, 2 + entry index
static CORES_MAP: [AtomicU16; MAP_CAP] = [const { AtomicU16::new(0) }; MAP_CAP];

/// Quota entry index and share of CUDA ordinal `dev` (None = no compute share).
#[inline]
pub fn cores_for(cfg: &Config, dev: c_int) -> Option<(usize, u8)> {
    let d = usize::try_from(dev).ok()?;
    let m = CORES_MAP.get(d)?;
    let v = m.load(Ordering::Acquire);
    let idx = match v {
        NO_LIMIT => return None,
        0 => {
            let idx = map_cores(cfg, dev);
            m.store(idx.map_or(NO_LIMIT, |i| i as u16 + 2), Ordering::Release);
            idx?
        }
        v => (v - 2) as usize,
    };
    Some((idx, cfg.entries.get(idx)?.cores?))
}

#[cold]
fn map_cores(cfg: &Config, dev: c_int) -> Option<usize> {
    let count_fn = real::cuDeviceGetCount()?;
    let mut n: c_int = 0;
    // SAFETY: real driver call.
    if unsafe { count_fn(&mut n) } != 0 || dev >= n {
        return None;
    }
    let visible: Vec<Option<[u8; 16]>> = (0..n).map(uuid_of).collect();
    entry_index(cfg, dev, &visible).filter(|i| cfg.entries[*i].cores.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_text() {
        let u = parse_uuid("GPU-2f5d1c3a-0000-1111-2222-333344445555").unwrap();
        assert_eq!(u[0], 0x2f);
        assert_eq!(u[15], 0x55);
        assert_eq!(
            parse_uuid("MIG-2f5d1c3a-0000-1111-2222-333344445555"),
            Some(u)
        );
        assert_eq!(parse_uuid("GPU-1"), None);
        assert_eq!(
            parse_uuid("MIG-GPU-2f5d1c3a-0000-1111-2222-333344445555/1/0"),
            None
        );
    }
}
