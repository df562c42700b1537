//! What a runtime does with memory besides allocating device memory (`lib.rs`): copies and
//! memsets (honoured: device memory is real, lazily committed host memory, `vram.rs`), what the
//! driver knows about a pointer, page-locked host memory, managed-memory hints, IPC.
//!
//! IPC: a handle carries the exporting process's id, the allocation's address and size. Another
//! process opening it gets a fresh mapping of that size on the same device (no data is shared:
//! the simulation has no shared device memory) that is not charged to the importer, as on a
//! real GPU where the exporter's allocation holds the memory. The exporter itself opening its
//! own handle is refused as the real driver refuses it.

use std::ffi::{c_int, c_uint, c_void};

use crate::driver::{
    CTX_BASE, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED,
    CUDA_SUCCESS, CUresult, current_device, guard, put, state, tri,
};
use crate::vram::{self, RegionKind};

fn done(r: Result<(), CUresult>) -> CUresult {
    guard(|| match (state(), r) {
        (Err(e), _) | (Ok(_), Err(e)) => e,
        (Ok(_), Ok(())) => CUDA_SUCCESS,
    })
}

/// Copies between any two pointers (unified addressing): device sides are found in the map.
fn copy_any(dst: u64, src: u64, n: usize) -> CUresult {
    let dd = vram::find(dst).is_some();
    let sd = vram::find(src).is_some();
    done(vram::copy(dst, src, n as u64, dd, sd))
}

macro_rules! copies {
    ($($name:ident($($a:ident: $t:ty),*) => $body:expr;)*) => {
        $(
            #[unsafe(no_mangle)]
            pub extern "C" fn $name($($a: $t),*) -> CUresult {
                $body
            }
        )*
        pub(crate) fn copy_exports() -> Vec<(&'static str, usize)> {
            vec![$((stringify!($name), $name as *const c_void as usize)),*]
        }
    };
}

copies! {
    cuMemcpy(dst: u64, src: u64, n: usize) => copy_any(dst, src, n);
    cuMemcpy_ptds(dst: u64, src: u64, n: usize) => copy_any(dst, src, n);
    cuMemcpyAsync(dst: u64, src: u64, n: usize, _s: usize) => copy_any(dst, src, n);
    cuMemcpyAsync_ptsz(dst: u64, src: u64, n: usize, _s: usize) => copy_any(dst, src, n);
    cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) => done(vram::copy(dst, src as u64, n as u64, true, false));
    cuMemcpyHtoD_v2_ptds(dst: u64, src: *const c_void, n: usize) => done(vram::copy(dst, src as u64, n as u64, true, false));
    cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, n: usize, _s: usize) => done(vram::copy(dst, src as u64, n as u64, true, false));
    cuMemcpyHtoDAsync_v2_ptsz(dst: u64, src: *const c_void, n: usize, _s: usize) => done(vram::copy(dst, src as u64, n as u64, true, false));
    cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) => done(vram::copy(dst as u64, src, n as u64, false, true));
    cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: u64, n: usize) => done(vram::copy(dst as u64, src, n as u64, false, true));
    cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, n: usize, _s: usize) => done(vram::copy(dst as u64, src, n as u64, false, true));
    cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: u64, n: usize, _s: usize) => done(vram::copy(dst as u64, src, n as u64, false, true));
    cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize) => done(vram::copy(dst, src, n as u64, true, true));
    cuMemcpyDtoD_v2_ptds(dst: u64, src: u64, n: usize) => done(vram::copy(dst, src, n as u64, true, true));
    cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, _s: usize) => done(vram::copy(dst, src, n as u64, true, true));
    cuMemcpyDtoDAsync_v2_ptsz(dst: u64, src: u64, n: usize, _s: usize) => done(vram::copy(dst, src, n as u64, true, true));
    cuMemcpyPeer(dst: u64, _dc: usize, src: u64, _sc: usize, n: usize) => done(vram::copy(dst, src, n as u64, true, true));
    cuMemcpyPeerAsync(dst: u64, _dc: usize, src: u64, _sc: usize, n: usize, _s: usize) => done(vram::copy(dst, src, n as u64, true, true));
    cuMemsetD8_v2(dst: u64, v: u8, n: usize) => done(vram::fill(dst, u32::from(v), 1, n as u64));
    cuMemsetD8_v2_ptds(dst: u64, v: u8, n: usize) => done(vram::fill(dst, u32::from(v), 1, n as u64));
    cuMemsetD8Async(dst: u64, v: u8, n: usize, _s: usize) => done(vram::fill(dst, u32::from(v), 1, n as u64));
    cuMemsetD8Async_ptsz(dst: u64, v: u8, n: usize, _s: usize) => done(vram::fill(dst, u32::from(v), 1, n as u64));
    cuMemsetD16_v2(dst: u64, v: u16, n: usize) => done(vram::fill(dst, u32::from(v), 2, n as u64));
    cuMemsetD16_v2_ptds(dst: u64, v: u16, n: usize) => done(vram::fill(dst, u32::from(v), 2, n as u64));
    cuMemsetD16Async(dst: u64, v: u16, n: usize, _s: usize) => done(vram::fill(dst, u32::from(v), 2, n as u64));
    cuMemsetD16Async_ptsz(dst: u64, v: u16, n: usize, _s: usize) => done(vram::fill(dst, u32::from(v), 2, n as u64));
    cuMemsetD32_v2(dst: u64, v: u32, n: usize) => done(vram::fill(dst, v, 4, n as u64));
    cuMemsetD32_v2_ptds(dst: u64, v: u32, n: usize) => done(vram::fill(dst, v, 4, n as u64));
    cuMemsetD32Async(dst: u64, v: u32, n: usize, _s: usize) => done(vram::fill(dst, v, 4, n as u64));
    cuMemsetD32Async_ptsz(dst: u64, v: u32, n: usize, _s: usize) => done(vram::fill(dst, v, 4, n as u64));
    cuMemsetD2D8_v2(dst: u64, pitch: usize, v: u8, w: usize, h: usize) => done(fill_2d(dst, pitch, u32::from(v), 1, w, h));
    cuMemsetD2D8Async(dst: u64, pitch: usize, v: u8, w: usize, h: usize, _s: usize) => done(fill_2d(dst, pitch, u32::from(v), 1, w, h));
    cuMemsetD2D16_v2(dst: u64, pitch: usize, v: u16, w: usize, h: usize) => done(fill_2d(dst, pitch, u32::from(v), 2, w, h));
    cuMemsetD2D16Async(dst: u64, pitch: usize, v: u16, w: usize, h: usize, _s: usize) => done(fill_2d(dst, pitch, u32::from(v), 2, w, h));
    cuMemsetD2D32_v2(dst: u64, pitch: usize, v: u32, w: usize, h: usize) => done(fill_2d(dst, pitch, v, 4, w, h));
    cuMemsetD2D32Async(dst: u64, pitch: usize, v: u32, w: usize, h: usize, _s: usize) => done(fill_2d(dst, pitch, v, 4, w, h));
    cuMemcpy2D_v2(p: *const Copy2d) => done(copy_2d(p));
    cuMemcpy2DUnaligned_v2(p: *const Copy2d) => done(copy_2d(p));
    cuMemcpy2DAsync_v2(p: *const Copy2d, _s: usize) => done(copy_2d(p));
    cuMemcpy2DAsync_v2_ptsz(p: *const Copy2d, _s: usize) => done(copy_2d(p));
}

fn fill_2d(dst: u64, pitch: usize, v: u32, elem: u64, w: usize, h: usize) -> Result<(), CUresult> {
    for row in 0..h as u64 {
        vram::fill(dst + row * pitch as u64, v, elem, w as u64)?;
    }
    Ok(())
}

/// `CUDA_MEMCPY2D`
#[repr(C)]
pub struct Copy2d {
    src_x: usize,
    src_y: usize,
    src_type: c_int,
    src_host: *const c_void,
    src_device: u64,
    src_array: usize,
    src_pitch: usize,
    dst_x: usize,
    dst_y: usize,
    dst_type: c_int,
    dst_host: *mut c_void,
    dst_device: u64,
    dst_array: usize,
    dst_pitch: usize,
    width: usize,
    height: usize,
}

/// 2D copies between host, device and unified memory (arrays are not simulated).
fn copy_2d(p: *const Copy2d) -> Result<(), CUresult> {
    // SAFETY: the caller's CUDA_MEMCPY2D (null refused).
    let c = unsafe { p.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let side = |kind: c_int, host: u64, dev: u64| -> Result<(u64, bool), CUresult> {
        match kind {
            1 => Ok((host, false)),
            2 => Ok((dev, true)),
            4 => Ok((dev, vram::find(dev).is_some())),
            _ => Err(CUDA_ERROR_NOT_SUPPORTED),
        }
    };
    let (src, sd) = side(c.src_type, c.src_host as u64, c.src_device)?;
    let (dst, dd) = side(c.dst_type, c.dst_host as u64, c.dst_device)?;
    for row in 0..c.height as u64 {
        let s = src + (c.src_y as u64 + row) * c.src_pitch as u64 + c.src_x as u64;
        let d = dst + (c.dst_y as u64 + row) * c.dst_pitch as u64 + c.dst_x as u64;
        vram::copy(d, s, c.width as u64, dd, sd)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Pointers

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut u64,
    size: *mut usize,
    p: u64,
) -> CUresult {
    guard(|| {
        tri!(state());
        let Some((start, r)) = vram::find(p) else {
            return crate::driver::CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: either out-slot may be null (CUDA allows it); non-null ones are the caller's.
        unsafe {
            if !base.is_null() {
                *base = start;
            }
            if !size.is_null() {
                *size = r.len as usize;
            }
        }
        CUDA_SUCCESS
    })
}

const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_DEVICE: u32 = 2;

/// Write one pointer attribute of `p` into `data`; `Err` for a pointer the driver does not know.
unsafe fn attribute(attr: c_int, data: *mut c_void, p: u64) -> Result<(), CUresult> {
    if data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (start, r) = vram::find(p).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let host_visible = matches!(r.kind, RegionKind::Host | RegionKind::Managed);
    // SAFETY: every write goes to `data`, the caller's non-null slot sized for the attribute's type.
    unsafe {
        match attr {
            1 => *data.cast::<usize>() = CTX_BASE + r.dev,
            2 => {
                *data.cast::<u32>() = if r.kind == RegionKind::Host {
                    MEMORYTYPE_HOST
                } else {
                    MEMORYTYPE_DEVICE
                }
            }
            3 => *data.cast::<u64>() = p,
            4 if host_visible => *data.cast::<u64>() = p,
            4 => return Err(CUDA_ERROR_INVALID_VALUE),
            6 | 10 | 15 => *data.cast::<u32>() = 1,
            7 | 20 => *data.cast::<u64>() = r.id,
            8 => *data.cast::<u32>() = u32::from(r.kind == RegionKind::Managed),
            9 => *data.cast::<c_int>() = r.dev as c_int,
            11 | 19 => *data.cast::<u64>() = start,
            12 | 18 => *data.cast::<usize>() = r.len as usize,
            13 => *data.cast::<u8>() = 1,
            14 => *data.cast::<u64>() = 0,
            16 => *data.cast::<c_int>() = 3,
            17 => *data.cast::<u64>() = r.pool,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attr: c_int, p: u64) -> CUresult {
    // SAFETY: the caller's slot, passed on (null refused there).
    done(unsafe { attribute(attr, data, p) })
}

/// Several attributes at once; for memory the driver does not know every slot is zeroed (as the
/// real driver answers for plain host memory) and the call succeeds.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: c_uint,
    attrs: *const c_int,
    data: *const *mut c_void,
    p: u64,
) -> CUresult {
    guard(|| {
        tri!(state());
        if attrs.is_null() || data.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let known = vram::find(p).is_some();
        for i in 0..n as usize {
            // SAFETY: the caller's arrays of `n` attributes and slots.
            let (a, d) = unsafe { (*attrs.add(i), *data.add(i)) };
            if d.is_null() {
                continue;
            }
            if known {
                // SAFETY: the caller's slot for attribute `a`.
                if unsafe { attribute(a, d, p) }.is_ok() {
                    continue;
                }
            }
            // SAFETY: every attribute's type fits in 4 bytes or more except MAPPED (a bool);
            // zero the smallest slot the attribute may have.
            unsafe {
                match a {
                    13 => *d.cast::<u8>() = 0,
                    2 | 6 | 8 | 9 | 10 | 15 | 16 => *d.cast::<u32>() = 0,
                    _ => *d.cast::<u64>() = 0,
                }
            }
        }
        CUDA_SUCCESS
    })
}

// ---------------------------------------------------------------------------------------------
// Page-locked host memory

fn host_alloc(pp: *mut *mut c_void, bytes: usize) -> CUresult {
    guard(|| {
        let s = tri!(state());
        let dev = current_device(s).unwrap_or(0);
        if pp.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let Some(p) = vram::map(bytes as u64, libc::PROT_READ | libc::PROT_WRITE) else {
            return crate::driver::CUDA_ERROR_OUT_OF_MEMORY;
        };
        vram::insert(p, bytes.max(1) as u64, dev, RegionKind::Host, 0);
        // SAFETY: `pp` checked non-null; the caller's out-slot.
        unsafe { *pp = p as *mut c_void };
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) -> CUresult {
    host_alloc(pp, bytes)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, _flags: c_uint) -> CUresult {
    host_alloc(pp, bytes)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    guard(|| {
        tri!(state());
        match vram::find(p as u64) {
            Some((start, r)) if start == p as u64 && r.kind == RegionKind::Host => {
                vram::remove(start);
                vram::unmap(start, r.len);
                CUDA_SUCCESS
            }
            _ => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, _flags: c_uint) -> CUresult {
    guard(|| {
        let s = tri!(state());
        if p.is_null() || bytes == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if vram::find(p as u64).is_some() {
            return 712; // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        }
        vram::insert(
            p as u64,
            bytes as u64,
            current_device(s).unwrap_or(0),
            RegionKind::Host,
            0,
        );
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    guard(|| {
        tri!(state());
        match vram::find(p as u64) {
            Some((start, r)) if start == p as u64 && r.kind == RegionKind::Host => {
                vram::remove(start);
                CUDA_SUCCESS
            }
            _ => 713, // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    pd: *mut u64,
    p: *mut c_void,
    _flags: c_uint,
) -> CUresult {
    guard(|| {
        tri!(state());
        match vram::find(p as u64) {
            // SAFETY: put refuses a null `pd`; otherwise the caller's out-slot.
            Some((_, r)) if r.kind == RegionKind::Host => unsafe { put(pd, p as u64) },
            _ => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> CUresult {
    guard(|| {
        tri!(state());
        match vram::find(p as u64) {
            // SAFETY: put refuses a null `flags`; otherwise the caller's out-slot.
            Some((_, r)) if r.kind == RegionKind::Host => unsafe { put(flags, 0) },
            _ => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Managed memory hints (accepted; the simulated GPU and the host share the pages anyway)

fn managed_hint(p: u64, n: usize) -> CUresult {
    guard(|| {
        tri!(state());
        if vram::covers(p, n as u64) {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_INVALID_VALUE
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAdvise(p: u64, n: usize, _advice: c_int, _dev: c_int) -> CUresult {
    managed_hint(p, n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAdvise_v2(
    p: u64,
    n: usize,
    _advice: c_int,
    _loc: crate::pools::Location,
) -> CUresult {
    managed_hint(p, n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPrefetchAsync(p: u64, n: usize, _dev: c_int, _s: usize) -> CUresult {
    managed_hint(p, n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPrefetchAsync_v2(
    p: u64,
    n: usize,
    _loc: crate::pools::Location,
    _flags: c_uint,
    _s: usize,
) -> CUresult {
    managed_hint(p, n)
}

// ---------------------------------------------------------------------------------------------
// IPC

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
pub struct IpcHandle([u64; 8]);

const IPC_MAGIC: u64 = 0x6770_6675_6970_6331;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut [u64; 8], p: u64) -> CUresult {
    guard(|| {
        tri!(state());
        match vram::find(p) {
            Some((start, r)) if start == p && r.kind == RegionKind::Device => {
                let h = [
                    IPC_MAGIC,
                    u64::from(std::process::id()),
                    p,
                    r.len,
                    r.dev as u64,
                    0,
                    0,
                    0,
                ];
                // SAFETY: put refuses a null `handle`; otherwise the caller's 64-byte handle.
                unsafe { put(handle, h) }
            }
            _ => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    pd: *mut u64,
    handle: IpcHandle,
    _flags: c_uint,
) -> CUresult {
    let handle = handle.0;
    guard(|| {
        let s = tri!(state());
        if handle[0] != IPC_MAGIC || handle[3] == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if handle[1] == u64::from(std::process::id()) {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        let dev = (handle[4] as usize).min(s.devices.len().saturating_sub(1));
        let Some(p) = vram::map(handle[3], libc::PROT_READ | libc::PROT_WRITE) else {
            return crate::driver::CUDA_ERROR_OUT_OF_MEMORY;
        };
        vram::insert(p, handle[3], dev, RegionKind::Ipc, 0);
        // SAFETY: put refuses a null `pd`; otherwise the caller's out-slot.
        unsafe { put(pd, p) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuIpcCloseMemHandle(p: u64) -> CUresult {
    guard(|| {
        tri!(state());
        match vram::find(p) {
            Some((start, r)) if start == p && r.kind == RegionKind::Ipc => {
                vram::remove(start);
                vram::unmap(start, r.len);
                CUDA_SUCCESS
            }
            _ => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

pub(crate) fn exports() -> Vec<(&'static str, usize)> {
    let mut t = copy_exports();
    t.extend(crate::driver::table!(
        cuMemGetAddressRange_v2,
        cuPointerGetAttribute,
        cuPointerGetAttributes,
        cuMemAllocHost_v2,
        cuMemHostAlloc,
        cuMemFreeHost,
        cuMemHostRegister_v2,
        cuMemHostUnregister,
        cuMemHostGetDevicePointer_v2,
        cuMemHostGetFlags,
        cuMemAdvise,
        cuMemAdvise_v2,
        cuMemPrefetchAsync,
        cuMemPrefetchAsync_v2,
        cuIpcGetMemHandle,
        cuIpcOpenMemHandle_v2,
        cuIpcCloseMemHandle,
    ));
    t
}
