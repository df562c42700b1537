//! Finding the real driver functions behind the shim's exports.
//!
//! Order for each function (resolved once, cached in an atomic): the handle the application
//! itself passed to `dlsym` for that library (covers `dlopen(RTLD_LOCAL)`, which `RTLD_NEXT`
//! cannot see), `RTLD_NEXT`, `dlopen(<soname>, RTLD_NOLOAD)`, and finally any loaded object whose
//! path ends in the library's name. A candidate that lies inside the shim itself is never
//! accepted (the driver's own internal references may be interposed by our exports; returning
//! ours as "real" would recurse forever).

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ffi::{Array3dDesc, ArrayDesc, NvmlMemory, NvmlMemoryV2, PropHead, Ptr};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The real `dlsym` (glibc's), published once. Read by the `dlsym` trampoline in exports/dl.rs.
pub static GPUFENCE_REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn null_dlsym(_h: *mut c_void, _n: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// The real `dlsym`: `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`, else the 2.2.5 version (x86_64
/// base), else the aarch64 base version.
pub fn real_dlsym() -> DlsymFn {
    let p = GPUFENCE_REAL_DLSYM.load(Ordering::Acquire);
    if p != 0 {
        // SAFETY: only ever stores a dlsym-compatible function pointer.
        return unsafe { std::mem::transmute::<usize, DlsymFn>(p) };
    }
    let mut found = 0usize;
    let dlvsym = real_dlvsym();
    for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17", c"GLIBC_2.0"] {
        // SAFETY: glibc's dlvsym with valid C strings.
        let f = unsafe { dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr()) } as usize;
        if f != 0 && !is_ours(f) {
            found = f;
            break;
        }
    }
    if found == 0 {
        found = null_dlsym as DlsymFn as usize;
    }
    GPUFENCE_REAL_DLSYM.store(found, Ordering::Release);
    // SAFETY: as above.
    unsafe { std::mem::transmute::<usize, DlsymFn>(found) }
}

pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// glibc's `dlvsym`, published once. Read by the `dlvsym` trampoline in exports/dl.rs.
pub static GPUFENCE_REAL_DLVSYM: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn null_dlvsym(
    _h: *mut c_void,
    _n: *const c_char,
    _v: *const c_char,
) -> *mut c_void {
    std::ptr::null_mut()
}

/// glibc's `dlvsym`, from libc's (2.34+) or libdl's symbol table: by name the loader would
/// hand back the shim's own export.
pub fn real_dlvsym() -> DlvsymFn {
    let mut p = GPUFENCE_REAL_DLVSYM.load(Ordering::Acquire);
    if p == 0 {
        p = crate::elfsym::find(&[b"/libc.so.6".as_slice(), b"/libdl.so.2"], b"dlvsym");
        if p == 0 || is_ours(p) {
            p = null_dlvsym as DlvsymFn as usize;
        }
        GPUFENCE_REAL_DLVSYM.store(p, Ordering::Release);
    }
    // SAFETY: only ever stores a dlvsym-compatible function pointer.
    unsafe { std::mem::transmute::<usize, DlvsymFn>(p) }
}

static OUR_BASE: AtomicUsize = AtomicUsize::new(0);

/// Is this address inside libgpufence.so?
pub fn is_ours(addr: usize) -> bool {
    let mut base = OUR_BASE.load(Ordering::Relaxed);
    if base == 0 {
        base = object_base(is_ours as fn(usize) -> bool as usize);
        if base == 0 {
            return false;
        }
        OUR_BASE.store(base, Ordering::Relaxed);
    }
    object_base(addr) == base
}

fn object_base(addr: usize) -> usize {
    // SAFETY: Dl_info is a plain C struct of pointers and integers; all-zero (null pointers) is
    // a valid value, and dladdr overwrites it before any field is read.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only inspects the address (never dereferences it); `info` is a live
    // out-pointer.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 {
        return 0;
    }
    info.dli_fbase as usize
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lib {
    Cuda,
    Nvml,
}

impl Lib {
    fn soname(self) -> &'static CStr {
        match self {
            Lib::Cuda => c"libcuda.so.1",
            Lib::Nvml => c"libnvidia-ml.so.1",
        }
    }
    fn stem(self) -> &'static [u8] {
        match self {
            Lib::Cuda => b"libcuda.so",
            Lib::Nvml => b"libnvidia-ml.so",
        }
    }
    fn handle_slot(self) -> &'static AtomicUsize {
        static CUDA: AtomicUsize = AtomicUsize::new(0);
        static NVML: AtomicUsize = AtomicUsize::new(0);
        match self {
            Lib::Cuda => &CUDA,
            Lib::Nvml => &NVML,
        }
    }
    /// Which library a symbol name belongs to.
    pub fn of(name: &[u8]) -> Option<Lib> {
        if name.starts_with(b"nvml") {
            Some(Lib::Nvml)
        } else if name.starts_with(b"cu") {
            Some(Lib::Cuda)
        } else {
            None
        }
    }
}

/// Remember a library handle the application used (only handles that really resolve `name` to
/// something outside the shim are kept).
pub fn learn_handle(lib: Lib, handle: *mut c_void, name: *const c_char) -> usize {
    if handle.is_null() || handle as isize == -1 {
        return 0;
    }
    // SAFETY: handle and name come from the application's dlsym call.
    let p = unsafe { real_dlsym()(handle, name) } as usize;
    if p != 0 && !is_ours(p) {
        lib.handle_slot().store(handle as usize, Ordering::Release);
        return p;
    }
    0
}

fn lookup(lib: Lib, name: &CStr) -> usize {
    let dlsym = real_dlsym();
    let ok = |p: *mut c_void| -> usize {
        let p = p as usize;
        if p != 0 && !is_ours(p) { p } else { 0 }
    };
    let h = lib.handle_slot().load(Ordering::Acquire);
    if h != 0 {
        // SAFETY: a handle the application got from dlopen.
        let p = ok(unsafe { dlsym(h as *mut c_void, name.as_ptr()) });
        if p != 0 {
            return p;
        }
    }
    // SAFETY: RTLD_NEXT lookup relative to the shim.
    let p = ok(unsafe { dlsym(libc::RTLD_NEXT, name.as_ptr()) });
    if p != 0 {
        return p;
    }
    // SAFETY: NOLOAD never loads anything new.
    let h = unsafe { libc::dlopen(lib.soname().as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_NOW) };
    let h = if h.is_null() { find_loaded(lib) } else { h };
    if !h.is_null() {
        lib.handle_slot().store(h as usize, Ordering::Release);
        // SAFETY: valid handle.
        return ok(unsafe { dlsym(h, name.as_ptr()) });
    }
    0
}

/// A loaded object whose file name starts with the library's stem (`libcuda.so*`).
fn find_loaded(lib: Lib) -> *mut c_void {
    struct Search {
        stem: &'static [u8],
        path: [u8; 4096],
        found: bool,
    }
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes valid info; data is our Search.
        let s = unsafe { &mut *(data as *mut Search) };
        // SAFETY: `info` points to the loader's dl_phdr_info for this object, valid during the
        // callback.
        let name = unsafe { (*info).dlpi_name };
        if name.is_null() {
            return 0;
        }
        // SAFETY: dlpi_name is non-null (checked) and a NUL-terminated string owned by the loader.
        let full = unsafe { CStr::from_ptr(name) }.to_bytes();
        let file = full.rsplit(|b| *b == b'/').next().unwrap_or(full);
        if file.starts_with(s.stem) && full.len() < s.path.len() {
            s.path[..full.len()].copy_from_slice(full);
            s.path[full.len()] = 0;
            s.found = true;
            return 1;
        }
        0
    }
    let mut s = Search {
        stem: lib.stem(),
        path: [0; 4096],
        found: false,
    };
    // SAFETY: callback only touches `s`.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut s as *mut Search as *mut c_void) };
    if !s.found {
        return std::ptr::null_mut();
    }
    // SAFETY: NUL-terminated path; NOLOAD.
    unsafe { libc::dlopen(s.path.as_ptr().cast(), libc::RTLD_NOLOAD | libc::RTLD_NOW) }
}

macro_rules! reals {
    ($($id:ident : $lib:ident $name:literal fn($($a:ty),*) -> $r:ty;)*) => {
        #[allow(non_camel_case_types, dead_code)]
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        #[repr(usize)]
        pub enum Id { $($id),* }
        pub const TABLE: &[(&CStr, Lib)] = &[$(($name, Lib::$lib)),*];
        static SLOTS: [AtomicUsize; TABLE.len()] = [const { AtomicUsize::new(0) }; TABLE.len()];
        $(
            #[allow(dead_code)]
            #[inline]
            pub fn $id() -> Option<unsafe extern "C" fn($($a),*) -> $r> {
                let p = get(Id::$id);
                // SAFETY: slot holds the driver's function of exactly this signature.
                (p != 0).then(|| unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($a),*) -> $r>(p) })
            }
        )*
    };
}

reals! {
    cuMemAlloc_v2: Cuda c"cuMemAlloc_v2" fn(*mut u64, usize) -> c_int;
    cuMemAllocPitch_v2: Cuda c"cuMemAllocPitch_v2" fn(*mut u64, *mut usize, usize, usize, c_uint) -> c_int;
    cuMemAllocManaged: Cuda c"cuMemAllocManaged" fn(*mut u64, usize, c_uint) -> c_int;
    cuMemAllocAsync: Cuda c"cuMemAllocAsync" fn(*mut u64, usize, usize) -> c_int;
    cuMemAllocAsync_ptsz: Cuda c"cuMemAllocAsync_ptsz" fn(*mut u64, usize, usize) -> c_int;
    cuMemAllocFromPoolAsync: Cuda c"cuMemAllocFromPoolAsync" fn(*mut u64, usize, usize, usize) -> c_int;
    cuMemAllocFromPoolAsync_ptsz: Cuda c"cuMemAllocFromPoolAsync_ptsz" fn(*mut u64, usize, usize, usize) -> c_int;
    cuMemFree_v2: Cuda c"cuMemFree_v2" fn(u64) -> c_int;
    cuMemFreeAsync: Cuda c"cuMemFreeAsync" fn(u64, usize) -> c_int;
    cuMemFreeAsync_ptsz: Cuda c"cuMemFreeAsync_ptsz" fn(u64, usize) -> c_int;
    cuMemCreate: Cuda c"cuMemCreate" fn(*mut u64, usize, *const PropHead, u64) -> c_int;
    cuMemRelease: Cuda c"cuMemRelease" fn(u64) -> c_int;
    cuMemMap: Cuda c"cuMemMap" fn(u64, usize, usize, u64, u64) -> c_int;
    cuMemUnmap: Cuda c"cuMemUnmap" fn(u64, usize) -> c_int;
    cuMemAddressFree: Cuda c"cuMemAddressFree" fn(u64, usize) -> c_int;
    cuMemRetainAllocationHandle: Cuda c"cuMemRetainAllocationHandle" fn(*mut u64, u64) -> c_int;
    cuMemImportFromShareableHandle: Cuda c"cuMemImportFromShareableHandle" fn(*mut u64, *mut c_void, c_int) -> c_int;
    cuMemGetAllocationPropertiesFromHandle: Cuda c"cuMemGetAllocationPropertiesFromHandle" fn(*mut crate::ffi::AllocationProp, u64) -> c_int;
    cuArrayCreate_v2: Cuda c"cuArrayCreate_v2" fn(*mut usize, *const ArrayDesc) -> c_int;
    cuArray3DCreate_v2: Cuda c"cuArray3DCreate_v2" fn(*mut usize, *const Array3dDesc) -> c_int;
    cuMipmappedArrayCreate: Cuda c"cuMipmappedArrayCreate" fn(*mut usize, *const Array3dDesc, c_uint) -> c_int;
    cuArrayDestroy: Cuda c"cuArrayDestroy" fn(usize) -> c_int;
    cuMipmappedArrayDestroy: Cuda c"cuMipmappedArrayDestroy" fn(usize) -> c_int;
    cuMemPoolCreate: Cuda c"cuMemPoolCreate" fn(*mut usize, *const PropHead) -> c_int;
    cuMemPoolDestroy: Cuda c"cuMemPoolDestroy" fn(usize) -> c_int;
    cuDeviceGetDefaultMemPool: Cuda c"cuDeviceGetDefaultMemPool" fn(*mut usize, c_int) -> c_int;
    cuDeviceGetMemPool: Cuda c"cuDeviceGetMemPool" fn(*mut usize, c_int) -> c_int;
    cuDeviceSetMemPool: Cuda c"cuDeviceSetMemPool" fn(c_int, usize) -> c_int;
    cuDevicePrimaryCtxReset_v2: Cuda c"cuDevicePrimaryCtxReset_v2" fn(c_int) -> c_int;
    cuDevicePrimaryCtxReset: Cuda c"cuDevicePrimaryCtxReset" fn(c_int) -> c_int;
    cuMemGetInfo_v2: Cuda c"cuMemGetInfo_v2" fn(*mut usize, *mut usize) -> c_int;
    cuDeviceTotalMem_v2: Cuda c"cuDeviceTotalMem_v2" fn(*mut usize, c_int) -> c_int;
    cuLaunchKernel: Cuda c"cuLaunchKernel" fn(Ptr, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, usize, *mut Ptr, *mut Ptr) -> c_int;
    cuLaunchKernel_ptsz: Cuda c"cuLaunchKernel_ptsz" fn(Ptr, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, usize, *mut Ptr, *mut Ptr) -> c_int;
    cuLaunchKernelEx: Cuda c"cuLaunchKernelEx" fn(*const c_void, Ptr, *mut Ptr, *mut Ptr) -> c_int;
    cuLaunchKernelEx_ptsz: Cuda c"cuLaunchKernelEx_ptsz" fn(*const c_void, Ptr, *mut Ptr, *mut Ptr) -> c_int;
    cuLaunchCooperativeKernel: Cuda c"cuLaunchCooperativeKernel" fn(Ptr, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, usize, *mut Ptr) -> c_int;
    cuLaunchCooperativeKernel_ptsz: Cuda c"cuLaunchCooperativeKernel_ptsz" fn(Ptr, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, usize, *mut Ptr) -> c_int;
    cuGraphLaunch: Cuda c"cuGraphLaunch" fn(usize, usize) -> c_int;
    cuGraphInstantiateWithFlags: Cuda c"cuGraphInstantiateWithFlags" fn(*mut usize, usize, u64) -> c_int;
    cuGraphInstantiateWithParams: Cuda c"cuGraphInstantiateWithParams" fn(*mut usize, usize, *mut c_void) -> c_int;
    cuGraphInstantiateWithParams_ptsz: Cuda c"cuGraphInstantiateWithParams_ptsz" fn(*mut usize, usize, *mut c_void) -> c_int;
    cuGraphInstantiate_v2: Cuda c"cuGraphInstantiate_v2" fn(*mut usize, usize, *mut usize, *mut c_char, usize) -> c_int;
    cuGraphExecDestroy: Cuda c"cuGraphExecDestroy" fn(usize) -> c_int;
    cuMemPoolTrimTo: Cuda c"cuMemPoolTrimTo" fn(usize, usize) -> c_int;
    cuMemPoolSetAttribute: Cuda c"cuMemPoolSetAttribute" fn(usize, c_int, *mut u64) -> c_int;
    cuStreamSynchronize: Cuda c"cuStreamSynchronize" fn(usize) -> c_int;
    cuStreamSynchronize_ptsz: Cuda c"cuStreamSynchronize_ptsz" fn(usize) -> c_int;
    cuEventSynchronize: Cuda c"cuEventSynchronize" fn(usize) -> c_int;
    cuCtxSynchronize: Cuda c"cuCtxSynchronize" fn() -> c_int;
    cuGraphAddMemAllocNode: Cuda c"cuGraphAddMemAllocNode" fn(*mut usize, usize, *const usize, usize, *mut crate::ffi::MemAllocNodeParams) -> c_int;
    cuGraphDestroy: Cuda c"cuGraphDestroy" fn(usize) -> c_int;
    cuDeviceGraphMemTrim: Cuda c"cuDeviceGraphMemTrim" fn(c_int) -> c_int;
    cuGraphLaunch_ptsz: Cuda c"cuGraphLaunch_ptsz" fn(usize, usize) -> c_int;
    cuGraphAddNode: Cuda c"cuGraphAddNode" fn(*mut usize, usize, *const usize, usize, *mut crate::ffi::GraphNodeParams) -> c_int;
    cuGraphAddNode_v2: Cuda c"cuGraphAddNode_v2" fn(*mut usize, usize, *const usize, *const c_void, usize, *mut crate::ffi::GraphNodeParams) -> c_int;
    cuGraphNodeSetParams: Cuda c"cuGraphNodeSetParams" fn(usize, *mut crate::ffi::GraphNodeParams) -> c_int;
    cuGraphExecNodeSetParams: Cuda c"cuGraphExecNodeSetParams" fn(usize, usize, *mut crate::ffi::GraphNodeParams) -> c_int;
    cuGraphAddChildGraphNode: Cuda c"cuGraphAddChildGraphNode" fn(*mut usize, usize, *const usize, usize, usize) -> c_int;
    cuGraphExecChildGraphNodeSetParams: Cuda c"cuGraphExecChildGraphNodeSetParams" fn(usize, usize, usize) -> c_int;
    cuGraphClone: Cuda c"cuGraphClone" fn(*mut usize, usize) -> c_int;
    cuGraphUpload: Cuda c"cuGraphUpload" fn(usize, usize) -> c_int;
    cuGraphUpload_ptsz: Cuda c"cuGraphUpload_ptsz" fn(usize, usize) -> c_int;
    cuGraphExecUpdate: Cuda c"cuGraphExecUpdate" fn(usize, usize, *mut usize, *mut c_int) -> c_int;
    cuGraphExecUpdate_v2: Cuda c"cuGraphExecUpdate_v2" fn(usize, usize, *mut c_void) -> c_int;
    cuCtxSynchronize_v2: Cuda c"cuCtxSynchronize_v2" fn(usize) -> c_int;
    cuStreamBeginCapture: Cuda c"cuStreamBeginCapture" fn(usize) -> c_int;
    cuStreamBeginCapture_ptsz: Cuda c"cuStreamBeginCapture_ptsz" fn(usize) -> c_int;
    cuStreamBeginCapture_v2: Cuda c"cuStreamBeginCapture_v2" fn(usize, c_int) -> c_int;
    cuStreamBeginCapture_v2_ptsz: Cuda c"cuStreamBeginCapture_v2_ptsz" fn(usize, c_int) -> c_int;
    cuStreamEndCapture: Cuda c"cuStreamEndCapture" fn(usize, *mut usize) -> c_int;
    cuStreamEndCapture_ptsz: Cuda c"cuStreamEndCapture_ptsz" fn(usize, *mut usize) -> c_int;
    cuStreamIsCapturing: Cuda c"cuStreamIsCapturing" fn(usize, *mut c_int) -> c_int;
    cuStreamIsCapturing_ptsz: Cuda c"cuStreamIsCapturing_ptsz" fn(usize, *mut c_int) -> c_int;
    cuEventCreate: Cuda c"cuEventCreate" fn(*mut usize, c_uint) -> c_int;
    cuEventRecord: Cuda c"cuEventRecord" fn(usize, usize) -> c_int;
    cuEventRecord_ptsz: Cuda c"cuEventRecord_ptsz" fn(usize, usize) -> c_int;
    cuEventQuery: Cuda c"cuEventQuery" fn(usize) -> c_int;
    cuEventElapsedTime: Cuda c"cuEventElapsedTime" fn(*mut f32, usize, usize) -> c_int;
    cuGetProcAddress: Cuda c"cuGetProcAddress" fn(*const c_char, *mut Ptr, c_int, u64) -> c_int;
    cuGetProcAddress_v2: Cuda c"cuGetProcAddress_v2" fn(*const c_char, *mut Ptr, c_int, u64, *mut c_int) -> c_int;
    cuCtxGetDevice: Cuda c"cuCtxGetDevice" fn(*mut c_int) -> c_int;
    cuDeviceGetCount: Cuda c"cuDeviceGetCount" fn(*mut c_int) -> c_int;
    cuDeviceGetUuid_v2: Cuda c"cuDeviceGetUuid_v2" fn(*mut [u8; 16], c_int) -> c_int;
    cuDeviceGetUuid: Cuda c"cuDeviceGetUuid" fn(*mut [u8; 16], c_int) -> c_int;
    nvmlDeviceGetMemoryInfo: Nvml c"nvmlDeviceGetMemoryInfo" fn(Ptr, *mut NvmlMemory) -> c_int;
    nvmlDeviceGetMemoryInfo_v2: Nvml c"nvmlDeviceGetMemoryInfo_v2" fn(Ptr, *mut NvmlMemoryV2) -> c_int;
    nvmlDeviceGetUUID: Nvml c"nvmlDeviceGetUUID" fn(Ptr, *mut c_char, c_uint) -> c_int;
    nvmlDeviceGetIndex: Nvml c"nvmlDeviceGetIndex" fn(Ptr, *mut c_uint) -> c_int;
}

/// Cached real address of a function (0 = not found yet).
#[inline]
pub fn get(id: Id) -> usize {
    let slot = &SLOTS[id as usize];
    let p = slot.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    resolve(id)
}

#[cold]
fn resolve(id: Id) -> usize {
    let (name, lib) = TABLE[id as usize];
    let p = lookup(lib, name);
    if p != 0 {
        SLOTS[id as usize].store(p, Ordering::Release);
    }
    p
}

/// Seed a slot from a pointer the application's own `dlsym` found (never one of ours).
pub fn seed(id: Id, p: usize) {
    if p != 0 && !is_ours(p) {
        let _ = SLOTS[id as usize].compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Id of a real function by exact name.
pub fn id_of(name: &[u8]) -> Option<Id> {
    TABLE
        .iter()
        .position(|(n, _)| n.to_bytes() == name)
        .map(|i| {
            // SAFETY: Id is repr(usize) with variants 0..TABLE.len() in table order.
            unsafe { std::mem::transmute::<usize, Id>(i) }
        })
}

/// Id whose resolved real address equals `p`.
pub fn id_of_address(p: usize) -> Option<Id> {
    (0..TABLE.len()).find_map(|i| {
        // SAFETY: as in id_of.
        let id = unsafe { std::mem::transmute::<usize, Id>(i) };
        (get(id) == p).then_some(id)
    })
}
