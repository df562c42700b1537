//! How long VMM memory lives. A `cuMemCreate` handle's memory is freed when its last reference
//! goes, and the references are the handle itself, each range mapped to it (`cuMemMap`) and each
//! `cuMemRetainAllocationHandle`. A common way to use VMM is create, map, release at once (the
//! mapping keeps the memory); releasing the charge at that `cuMemRelease` would let the container
//! map memory past its quota without end. So:
//!
//! - `cuMemMap` counts the ranges mapped to a handle; `cuMemRetainAllocationHandle` its extra
//!   references;
//! - `cuMemRelease` of a retained reference only drops that reference; of the handle while
//!   ranges are still mapped to it, it keeps the charge (now "released") until the last of them
//!   is unmapped (`cuMemUnmap`, or `cuMemAddressFree` of the reservation holding them);
//! - otherwise it releases the charge, as before.
//!
//! A handle imported from another handle's export (`cuMemImportFromShareableHandle`: PyTorch's
//! IPC of expandable segments) keeps the memory alive too, whatever its exporter does: each range
//! mapped to it is charged (refused past the quota, before the driver maps it) until unmapped.
//! Its size is not known before it is mapped; an imported handle never mapped is not charged.
//! When exporter and importer are processes of the same container, the memory is counted twice
//! while both hold it (fail closed).
//!
//! Entries live in the handle table (`table`): range start → handle, length and (imported) its
//! charge, handle → ranges, retains and (imported) its device, released handle → its charge.

use std::ffi::c_int;

use crate::enforce::{charge, enforce_dev};
use crate::ffi::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUresult};
use crate::state;
use crate::table::{self, Kind};

/// Add `delta` to the count kept for `handle` under `kind` (an entry at 0 is removed).
fn count(kind: Kind, handle: u64, delta: i64) -> u64 {
    let n = table::take(kind, handle)
        .unwrap_or(0)
        .saturating_add_signed(delta);
    if n != 0 {
        table::insert(kind, handle, n);
    }
    n
}

/// `handle` was imported; its memory lives on CUDA ordinal `dev`.
pub fn imported(handle: u64, dev: c_int) {
    if state::config().is_some()
        && let Ok(d) = u64::try_from(dev)
    {
        table::insert(Kind::VmmImported, handle, d + 1);
    }
}

/// Before mapping `len` bytes of `handle`: a mapping of an imported handle is charged now (the
/// quota device and bytes). `Err`: refused.
pub fn mapping(handle: u64, len: u64) -> Result<Option<(usize, u64)>, CUresult> {
    if state::config().is_none() {
        return Ok(None);
    }
    let Some(dev) = table::get(Kind::VmmImported, handle) else {
        return Ok(None);
    };
    let Some((cfg, a)) = enforce_dev((dev - 1) as c_int) else {
        return Ok(None);
    };
    if !charge(cfg, a, "cuMemMap (imported handle)", len) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(Some((a.idx, len)))
}

/// `cuMemMap` of `[ptr, ptr + len)` to `handle` returned (`ok`); `charged` is what [`mapping`]
/// charged.
pub fn mapped(ptr: u64, len: u64, handle: u64, charged: Option<(usize, u64)>, ok: bool) {
    let Some(cfg) = state::config() else {
        return;
    };
    if !ok {
        if let Some((idx, bytes)) = charged {
            cfg.region.uncharge(idx, bytes);
        }
        return;
    }
    table::insert(Kind::MapHandle, ptr, handle);
    table::insert(Kind::MapLen, ptr, len);
    if let Some((idx, bytes)) = charged {
        table::insert(Kind::MapCharge, ptr, table::pack(idx, bytes));
    }
    count(Kind::VmmMaps, handle, 1);
}

/// The driver added a reference to `handle` (`cuMemRetainAllocationHandle`).
pub fn retained(handle: u64) {
    if state::config().is_some() {
        count(Kind::VmmRetains, handle, 1);
    }
}

/// `cuMemRelease(handle)`: drops a retained reference, or the handle's own (its charge kept while
/// ranges are mapped to it, released otherwise).
pub fn release(handle: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(cfg) = state::config() else {
        return call();
    };
    if table::get(Kind::VmmRetains, handle).is_some() {
        let r = call();
        if r == CUDA_SUCCESS {
            count(Kind::VmmRetains, handle, -1);
        }
        return r;
    }
    let taken = table::take(Kind::Vmm, handle);
    let r = call();
    if r == CUDA_SUCCESS {
        table::take(Kind::VmmImported, handle);
    }
    match taken {
        Some(v) if r != CUDA_SUCCESS => {
            table::insert(Kind::Vmm, handle, v);
        }
        Some(v) if table::get(Kind::VmmMaps, handle).is_some() => {
            table::insert(Kind::VmmReleased, handle, v);
        }
        Some(v) => {
            let (d, b) = table::unpack(v);
            cfg.region.uncharge(d, b);
        }
        None => {}
    }
    r
}

/// `[ptr, ptr + len)` was unmapped (`cuMemUnmap`, `cuMemAddressFree`): the ranges mapped from
/// `ptr` on, one after the other, are gone; a released handle none maps any more gives its
/// charge back.
pub fn unmapped(ptr: u64, len: u64) {
    let Some(cfg) = state::config() else {
        return;
    };
    let end = ptr.saturating_add(len);
    let mut at = ptr;
    while at < end {
        let (Some(handle), Some(n)) = (
            table::take(Kind::MapHandle, at),
            table::take(Kind::MapLen, at),
        ) else {
            break;
        };
        if let Some(v) = table::take(Kind::MapCharge, at) {
            let (d, b) = table::unpack(v);
            cfg.region.uncharge(d, b);
        }
        if count(Kind::VmmMaps, handle, -1) == 0
            && let Some(v) = table::take(Kind::VmmReleased, handle)
        {
            let (d, b) = table::unpack(v);
            cfg.region.uncharge(d, b);
        }
        at = at.saturating_add(n.max(1));
    }
}
