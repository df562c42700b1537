//! Memory held by CUDA graphs. An allocation made while a stream captures (`cuMemAllocAsync` in
//! capture: what PyTorch's `cudaMallocAsync` backend and CuPy's async pool do inside a CUDA graph)
//! is a memory node of the graph: the driver hands out an address and takes the memory only when
//! an instantiation of the graph is launched, and keeps it (the graph's own frees return it to
//! the graph memory pool, not to the device) until the instantiation is destroyed and the device's
//! graph memory trimmed (`cuDeviceGraphMemTrim`). Charging at capture and releasing at the
//! captured free (as for any allocation) would count nothing for what the graph holds while
//! it runs, so instead:
//!
//! - a captured allocation is not charged; its bytes add up per capturing stream (or per graph
//!   for a memory node added explicitly, `cuGraphAddMemAllocNode`);
//! - `cuStreamEndCapture` gives the sum to the graph, `cuGraphInstantiate*` to the instantiation;
//! - the first launch of the instantiation charges it (refused: the launch fails with
//!   `CUDA_ERROR_OUT_OF_MEMORY` before the driver takes anything);
//! - `cuGraphExecDestroy` leaves the charge as held, `cuDeviceGraphMemTrim` releases it.
//!
//! The charge is the sum of the graph's allocations: the driver may reuse memory between them
//! and across graphs, so the quota sees at least what the driver holds (fail closed).
//! Entries live in the handle table (`table`), keyed by stream, graph and instantiation; their
//! value packs the CUDA ordinal (not the quota index) and the bytes.

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use crate::enforce::{charge, current_ordinal, enforce_dev};
use crate::ffi::{CUDA_ERROR_OUT_OF_MEMORY, CUresult};
use crate::state;
use crate::table::{self, Kind};

/// Key of a capturing stream (the per-thread default stream apart from the legacy one).
fn stream_key(stream: usize, ptsz: bool) -> u64 {
    if ptsz && stream == 0 {
        2
    } else {
        stream as u64
    }
}

/// A captured stream-ordered allocation of `bytes` succeeded on `stream`.
pub fn captured_alloc(stream: usize, ptsz: bool, bytes: u64) {
    let Some(dev) = current_ordinal() else {
        return;
    };
    let key = stream_key(stream, ptsz);
    let before = table::take(Kind::CaptureMem, key).map_or(0, |v| table::unpack(v).1);
    table::insert(
        Kind::CaptureMem,
        key,
        table::pack(dev as usize, before.saturating_add(bytes)),
    );
}

/// The capture on `stream` ended as `graph`.
pub fn capture_ended(stream: usize, ptsz: bool, graph: usize) {
    if let Some(v) = table::take(Kind::CaptureMem, stream_key(stream, ptsz)) {
        table::insert(Kind::GraphMem, graph as u64, v);
    }
}

/// A memory node of `bytes` on CUDA ordinal `dev` was added to `graph` (explicit construction).
pub fn added_to_graph(graph: usize, dev: c_int, bytes: u64) {
    let Ok(dev) = usize::try_from(dev) else {
        return;
    };
    let before = table::take(Kind::GraphMem, graph as u64).map_or(0, |v| table::unpack(v).1);
    table::insert(
        Kind::GraphMem,
        graph as u64,
        table::pack(dev, before.saturating_add(bytes)),
    );
}

/// `exec` was instantiated from `graph`.
pub fn instantiated(exec: usize, graph: usize) {
    if let Some(v) = table::get(Kind::GraphMem, graph as u64) {
        table::insert(Kind::ExecMem, exec as u64, v);
    }
}

/// Charge a graph's memory (packed CUDA ordinal and bytes) for `what`: the quota device and
/// bytes charged (None: the device has no quota). `Err`: refused.
fn charge_graph(v: u64, what: &str) -> Result<Option<(usize, u64)>, CUresult> {
    let (dev, bytes) = table::unpack(v);
    let Some((cfg, a)) = enforce_dev(dev as c_int) else {
        return Ok(None);
    };
    if !charge(cfg, a, what, bytes) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(Some((a.idx, bytes)))
}

/// Before launching or uploading `exec` (`what`): charge its graph's memory the first time.
/// `Err`: refused.
pub fn launching(exec: usize, what: &str) -> Result<(), CUresult> {
    if state::config().is_none() || table::get(Kind::ExecResident, exec as u64).is_some() {
        return Ok(());
    }
    let Some(v) = table::get(Kind::ExecMem, exec as u64) else {
        return Ok(());
    };
    if let Some((idx, bytes)) = charge_graph(v, what)? {
        table::insert(Kind::ExecResident, exec as u64, table::pack(idx, bytes));
    }
    Ok(())
}

/// Before instantiating `graph` with an upload (`CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`): the
/// instantiation takes the graph's memory at once, so it is charged now. `Err`: refused.
pub fn instantiating_uploaded(graph: usize) -> Result<Option<(usize, u64)>, CUresult> {
    match (state::config(), table::get(Kind::GraphMem, graph as u64)) {
        (Some(_), Some(v)) => charge_graph(v, "cuGraphInstantiateWithParams (upload)"),
        _ => Ok(None),
    }
}

/// The instantiation [`instantiating_uploaded`] charged for ended as `exec` (None: failed, the
/// charge goes back).
pub fn instantiated_uploaded(charged: Option<(usize, u64)>, exec: Option<usize>) {
    let Some((idx, bytes)) = charged else { return };
    match exec {
        Some(x) => {
            table::insert(Kind::ExecResident, x as u64, table::pack(idx, bytes));
        }
        None => {
            if let Some(cfg) = state::config() {
                cfg.region.uncharge(idx, bytes);
            }
        }
    }
}

/// `graph` is cloned: the clone's memory nodes are the original's.
pub fn cloned(clone: usize, original: usize) {
    if let Some(v) = table::get(Kind::GraphMem, original as u64) {
        table::insert(Kind::GraphMem, clone as u64, v);
    }
}

/// A child graph node of `child` was added to `parent`: the child's memory nodes are the
/// parent's (a child moved into its parent lives on only there: `moved`).
pub fn child_added(parent: usize, child: usize, moved: bool) {
    let v = if moved {
        table::take(Kind::GraphMem, child as u64)
    } else {
        table::get(Kind::GraphMem, child as u64)
    };
    if let Some(v) = v {
        let (dev, bytes) = table::unpack(v);
        added_to_graph(parent, dev as c_int, bytes);
    }
}

/// Whether `graph` has memory nodes (a node's parameters may not bring it into a graph
/// afterwards: the shim could not follow the bytes).
pub fn has_memory(graph: usize) -> bool {
    table::get(Kind::GraphMem, graph as u64).is_some()
}

/// Before `cuGraphExecUpdate(exec, graph)`: a resident instantiation holds the larger of its
/// memory and the new graph's from now on; the growth is charged now. `Err`: refused.
pub fn updating(exec: usize, graph: usize) -> Result<Option<(usize, u64)>, CUresult> {
    if state::config().is_none() {
        return Ok(None);
    }
    let (Some(res), Some(new)) = (
        table::get(Kind::ExecResident, exec as u64),
        table::get(Kind::GraphMem, graph as u64),
    ) else {
        return Ok(None);
    };
    let ((_, held), (dev, bytes)) = (table::unpack(res), table::unpack(new));
    if bytes <= held {
        return Ok(None);
    }
    charge_graph(
        table::pack(dev, bytes - held),
        "cuGraphExecUpdate (graph memory)",
    )
}

/// `cuGraphExecUpdate(exec, graph)` returned (`ok`); `grown` is what [`updating`] charged.
pub fn updated(exec: usize, graph: usize, grown: Option<(usize, u64)>, ok: bool) {
    if !ok {
        instantiated_uploaded(grown, None);
        return;
    }
    let old = table::take(Kind::ExecMem, exec as u64);
    match (old, table::get(Kind::GraphMem, graph as u64)) {
        (Some(o), Some(n)) => {
            let keep = if table::unpack(n).1 >= table::unpack(o).1 {
                n
            } else {
                o
            };
            table::insert(Kind::ExecMem, exec as u64, keep);
        }
        (o, n) => {
            if let Some(v) = n.or(o) {
                table::insert(Kind::ExecMem, exec as u64, v);
            }
        }
    }
    if let Some((_, d)) = grown
        && let Some(v) = table::take(Kind::ExecResident, exec as u64)
    {
        let (idx, held) = table::unpack(v);
        table::insert(Kind::ExecResident, exec as u64, table::pack(idx, held + d));
    }
}

/// The launch [`launching`] admitted failed: the driver took nothing.
pub fn launch_failed(exec: usize) {
    if let (Some(cfg), Some(v)) = (
        state::config(),
        table::take(Kind::ExecResident, exec as u64),
    ) {
        let (idx, bytes) = table::unpack(v);
        cfg.region.uncharge(idx, bytes);
    }
}

/// `exec` was destroyed: its memory stays with the device's graph memory until a trim.
pub fn exec_destroyed(exec: usize) {
    table::take(Kind::ExecMem, exec as u64);
    if let Some(v) = table::take(Kind::ExecResident, exec as u64) {
        let (idx, bytes) = table::unpack(v);
        if let Some(h) = table::GRAPH_HELD.get(idx) {
            h.fetch_add(bytes, Ordering::AcqRel);
        }
    }
}

/// `graph` was destroyed (its instantiations keep what they hold).
pub fn graph_destroyed(graph: usize) {
    table::take(Kind::GraphMem, graph as u64);
}

/// The driver trimmed the graph memory of CUDA ordinal `dev`: destroyed instantiations' memory
/// went back to the device.
pub fn trimmed(dev: c_int) {
    let Some((cfg, a)) = enforce_dev(dev) else {
        return;
    };
    if let Some(h) = table::GRAPH_HELD.get(a.idx) {
        let v = h.swap(0, Ordering::AcqRel);
        if v != 0 {
            cfg.region.uncharge(a.idx, v);
        }
    }
}
