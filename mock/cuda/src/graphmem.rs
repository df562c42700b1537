//! Memory of CUDA graphs (graph memory nodes), as the driver keeps it: an allocation made while
//! a stream captures (`cuMemAllocAsync` in capture) is a memory node of the graph: it gets its
//! address at capture, and no memory. The graph's memory is taken from the device when an
//! instantiation of it is first launched (a launch that does not fit fails with
//! `CUDA_ERROR_OUT_OF_MEMORY`), stays with the instantiation while it lives, and goes back to the
//! device when `cuDeviceGraphMemTrim` finds its instantiation destroyed. A captured free of the
//! graph's own allocation happens inside the graph: nothing to give back then.
//! `cuDeviceGetGraphMemAttribute` reports used (live instantiations) and reserved (all resident)
//! bytes and their high-water marks.
//!
//! Simplification: each instantiation holds the sum of its graph's allocations (the real driver
//! reuses memory between a graph's nodes and across graphs), so the simulated footprint is an
//! upper bound.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::driver::{
    CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, CUresult, charge, device, guard, state, tri, uncharge,
};

#[derive(Default)]
struct Book {
    /// graph → (device, bytes of its memory nodes)
    graphs: HashMap<usize, (usize, u64)>,
    /// instantiation → (device, bytes, resident)
    execs: HashMap<usize, (usize, u64, bool)>,
    /// destroyed instantiations' memory still held, per device (given back by a trim)
    held: HashMap<usize, u64>,
    /// addresses of graph allocations
    addresses: HashSet<u64>,
}

static BOOK: Mutex<Option<Book>> = Mutex::new(None);
const MAX_DEVICES: usize = 64;
static USED_HIGH: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static RESERVED_HIGH: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

fn with<R>(f: impl FnOnce(&mut Book) -> R) -> R {
    let mut b = BOOK.lock().unwrap_or_else(|e| e.into_inner());
    f(b.get_or_insert_with(Book::default))
}

/// A graph allocation's address was handed out.
pub(crate) fn note_address(p: u64) {
    with(|b| b.addresses.insert(p));
}

pub(crate) fn is_graph_address(p: u64) -> bool {
    with(|b| b.addresses.contains(&p))
}

/// Capture ended: graph `g` of device `dev` holds `bytes` of memory nodes.
pub(crate) fn captured_graph(g: usize, dev: usize, bytes: u64) {
    if bytes > 0 {
        with(|b| b.graphs.insert(g, (dev, bytes)));
    }
}

/// A memory node of `bytes` on `dev` was added to graph `g` (explicit construction).
pub(crate) fn added_to_graph(g: usize, dev: usize, bytes: u64) {
    with(|b| {
        let e = b.graphs.entry(g).or_insert((dev, 0));
        e.1 = e.1.saturating_add(bytes);
    });
}

/// The memory nodes of graph `g`: (device, bytes), if any.
pub(crate) fn graph_memory(g: usize) -> Option<(usize, u64)> {
    with(|b| b.graphs.get(&g).copied())
}

/// Graph `to` gets memory nodes of `bytes` on `dev` (a clone, or a child graph moved into it).
pub(crate) fn add_nodes(to: usize, (dev, bytes): (usize, u64)) {
    added_to_graph(to, dev, bytes);
}

/// `exec` was updated from `graph` (`cuGraphExecUpdate`): it holds `graph`'s memory from now
/// on; a resident instantiation takes the growth from the device at once (refused: nothing
/// changes).
pub(crate) fn updated(exec: usize, graph: usize) -> Result<(), CUresult> {
    let s = state()?;
    with(|b| -> Result<(), CUresult> {
        let (dev, bytes) = b.graphs.get(&graph).copied().unwrap_or((0, 0));
        match b.execs.get_mut(&exec) {
            Some(e) if e.2 && bytes > e.1 => {
                charge(s, e.0, bytes - e.1)?;
                e.1 = bytes;
            }
            Some(e) if e.2 => {}
            Some(e) => *e = (dev, bytes, false),
            None if bytes > 0 => {
                b.execs.insert(exec, (dev, bytes, false));
            }
            None => {}
        }
        Ok(())
    })?;
    note_highs();
    Ok(())
}

/// `exec` was instantiated from `graph`.
pub(crate) fn instantiated(exec: usize, graph: usize) {
    with(|b| {
        if let Some((dev, bytes)) = b.graphs.get(&graph).copied() {
            b.execs.insert(exec, (dev, bytes, false));
        }
    });
}

/// Before launching or uploading `exec`: its memory, taken from the device the first time.
pub(crate) fn launching(exec: usize) -> Result<(), CUresult> {
    let s = state()?;
    with(|b| -> Result<(), CUresult> {
        let Some(e) = b.execs.get_mut(&exec) else {
            return Ok(());
        };
        if !e.2 {
            charge(s, e.0, e.1)?;
            e.2 = true;
        }
        Ok(())
    })?;
    note_highs();
    Ok(())
}

/// A graph or an instantiation was destroyed.
pub(crate) fn destroyed(handle: usize) {
    with(|b| {
        b.graphs.remove(&handle);
        if let Some((dev, bytes, true)) = b.execs.remove(&handle) {
            *b.held.entry(dev).or_insert(0) += bytes;
        }
    });
}

/// (used, reserved) bytes of graph memory on `dev`.
fn footprint(b: &Book, dev: usize) -> (u64, u64) {
    let used: u64 = b
        .execs
        .values()
        .filter(|e| e.0 == dev && e.2)
        .map(|e| e.1)
        .sum();
    (used, used + b.held.get(&dev).copied().unwrap_or(0))
}

fn note_highs() {
    with(|b| {
        for dev in 0..MAX_DEVICES {
            let (u, r) = footprint(b, dev);
            USED_HIGH[dev].fetch_max(u, Ordering::AcqRel);
            RESERVED_HIGH[dev].fetch_max(r, Ordering::AcqRel);
        }
    });
}

fn dev_index(dev: c_int) -> Result<usize, CUresult> {
    let s = state()?;
    device(s, dev)?;
    usize::try_from(dev)
        .ok()
        .filter(|d| *d < MAX_DEVICES)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// Give destroyed instantiations' memory on `dev` back to the device.
#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGraphMemTrim(dev: c_int) -> CUresult {
    guard(|| {
        let d = tri!(dev_index(dev));
        let s = tri!(state());
        let held = with(|b| b.held.remove(&d)).unwrap_or(0);
        uncharge(s, d, held);
        CUDA_SUCCESS
    })
}

/// `CUgraphMem_attribute`: used / used high / reserved / reserved high, as `cuuint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    dev: c_int,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    guard(|| {
        let d = tri!(dev_index(dev));
        if value.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let (used, reserved) = with(|b| footprint(b, d));
        let v = match attr {
            0 => used,
            1 => USED_HIGH[d].load(Ordering::Acquire),
            2 => reserved,
            3 => RESERVED_HIGH[d].load(Ordering::Acquire),
            _ => return CUDA_ERROR_INVALID_VALUE,
        };
        // SAFETY: `value` checked non-null; the attributes are cuuint64_t.
        unsafe { *value.cast::<u64>() = v };
        CUDA_SUCCESS
    })
}

/// Only the high-water marks can be set (reset to the current value).
#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceSetGraphMemAttribute(
    dev: c_int,
    attr: c_int,
    _value: *const c_void,
) -> CUresult {
    guard(|| {
        let d = tri!(dev_index(dev));
        let (used, reserved) = with(|b| footprint(b, d));
        match attr {
            1 => USED_HIGH[d].store(used, Ordering::Release),
            3 => RESERVED_HIGH[d].store(reserved, Ordering::Release),
            _ => return CUDA_ERROR_INVALID_VALUE,
        }
        CUDA_SUCCESS
    })
}

pub(crate) fn exports() -> Vec<(&'static str, usize)> {
    crate::driver::table!(
        cuDeviceGraphMemTrim,
        cuDeviceGetGraphMemAttribute,
        cuDeviceSetGraphMemAttribute
    )
}
