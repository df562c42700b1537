//! Limits the simulated driver applies to this process besides the device's size:
//!
//! * driver memory limits (NVML R615, `gpufence_mock_node::memlimits`): every allocation on a
//!   whole GPU is charged against the hard limit of this process's cgroup (`0::` line of
//!   `/proc/self/cgroup`), shared with every other process of the cgroup — whether or not it
//!   runs the shim;
//! * MPS (`gpufence_mock_node::mps`): when an MPS control daemon answers at
//!   `CUDA_MPS_PIPE_DIRECTORY`, this process is an MPS client: its allocations on device `i` are
//!   held to its pinned memory limit (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, else the daemon's
//!   default), and the multiprocessor count it sees is scaled by its active thread percentage
//!   (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, which only lowers the daemon's default).
//!
//! Both are read once, at `cuInit`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use gpufence_mock_node::memlimits::{self, Charger};

#[derive(Default)]
pub(crate) struct DeviceLimits {
    driver: Option<Mutex<Charger>>,
    mps_pinned: Option<u64>,
    mps_used: AtomicU64,
}

pub(crate) struct Limits {
    devices: Vec<DeviceLimits>,
    /// MPS active thread percentage, when this process is an MPS client.
    pub(crate) mps_pct: Option<f64>,
}

/// The limits of the devices (by UUID, in CUDA order) of this process.
pub(crate) fn build<'a>(
    node: &gpufence_mock_node::Node,
    uuids: impl ExactSizeIterator<Item = &'a str>,
) -> Limits {
    let n = uuids.len();
    let cgroup = node
        .memory_limits_dir
        .as_ref()
        .and_then(|d| memlimits::own_cgroup().map(|c| (d.clone(), c)));
    let mps = gpufence_mock_node::mps::client_limits(n);
    let devices = uuids
        .enumerate()
        .map(|(i, uuid)| DeviceLimits {
            driver: cgroup
                .as_ref()
                .filter(|_| uuid.starts_with("GPU-"))
                .and_then(|(d, c)| Charger::open(std::path::Path::new(d), c, uuid))
                .map(Mutex::new),
            mps_pinned: mps
                .as_ref()
                .and_then(|m| m.pinned.get(i).copied().flatten()),
            mps_used: AtomicU64::new(0),
        })
        .collect();
    Limits {
        devices,
        mps_pct: mps.map(|m| m.active_thread_percentage),
    }
}

/// Charge `bytes` on device `dev`; `false`: a limit refuses it (nothing charged).
pub(crate) fn charge(l: &Limits, dev: usize, bytes: u64) -> bool {
    let Some(d) = l.devices.get(dev) else {
        return true;
    };
    if let Some(limit) = d.mps_pinned {
        let ok = d
            .mps_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|n| *n <= limit)
            })
            .is_ok();
        if !ok {
            return false;
        }
    }
    if let Some(c) = &d.driver {
        let ok = c.lock().map(|mut c| c.charge(bytes)).unwrap_or(false);
        if !ok {
            if d.mps_pinned.is_some() {
                d.mps_used.fetch_sub(bytes, Ordering::AcqRel);
            }
            return false;
        }
    }
    true
}

pub(crate) fn release(l: &Limits, dev: usize, bytes: u64) {
    let Some(d) = l.devices.get(dev) else { return };
    if d.mps_pinned.is_some() {
        d.mps_used.fetch_sub(bytes, Ordering::AcqRel);
    }
    if let Some(c) = &d.driver
        && let Ok(mut c) = c.lock()
    {
        c.release(bytes);
    }
}

/// The multiprocessor count this process sees (MPS: scaled by its active thread percentage).
pub(crate) fn sm_count(l: &Limits, full: i32) -> i32 {
    match l.mps_pct {
        Some(p) => ((f64::from(full) * p / 100.0).floor() as i32).max(1),
        None => full,
    }
}
