//! The C side of the boundary: the CUDA driver's and NVML's types and codes the shim reads or
//! returns, laid out as the driver's headers lay them out (`repr(C)`). Nothing here calls
//! anything; every other file of the shim may use it.

use std::ffi::{c_int, c_uint, c_void};

// ---------------------------------------------------------------------------------------------
// CUDA driver API (cuda.h)

pub type CUresult = c_int;
pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;
/// `CU_MEM_ATTACH_GLOBAL`
pub const ATTACH_GLOBAL: c_uint = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`
pub const LOCATION_DEVICE: c_int = 1;

pub type Ptr = *mut c_void;

/// `CUmemAllocationProp` / `CUmemPoolProps` share this head: type, handle types, location.
#[repr(C)]
pub struct PropHead {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
}

/// `CUmemAllocationProp` whole (32 bytes): what `cuMemGetAllocationPropertiesFromHandle` writes.
#[repr(C)]
pub struct AllocationProp {
    pub head: PropHead,
    pub rest: [u64; 2],
}

/// `CUDA_ARRAY_DESCRIPTOR`
#[repr(C)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`
#[repr(C)]
pub struct Array3dDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

/// `CUlaunchConfig` up to the stream.
#[repr(C)]
pub struct LaunchConfigHead {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
    pub stream: usize,
}

// ---------------------------------------------------------------------------------------------
// NVML (nvml.h)

pub const NVML_ERROR_UNINITIALIZED: c_int = 1;
pub const NVML_ERROR_UNKNOWN: c_int = 999;

/// `nvmlMemory_t`
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS`: the pool properties (88 bytes, starting as every allocation
/// property does), the access descriptors, then the size and the address the driver returns.
#[repr(C)]
pub struct MemAllocNodeParams {
    pub head: PropHead,
    pub pool_props_rest: [u8; 72],
    pub access: *const std::ffi::c_void,
    pub access_count: usize,
    pub bytesize: usize,
    pub dptr: u64,
}

/// `CUgraphNodeParams` (CUDA 12.2+): the node type, then at byte 16 the union of the per-type
/// parameters (232 bytes), then a reserved word.
#[repr(C)]
pub struct GraphNodeParams {
    pub node_type: c_int,
    pub reserved0: [c_int; 3],
    pub body: [u64; 29],
    pub reserved2: i64,
}

/// `CU_GRAPH_NODE_TYPE_GRAPH`: a child graph (`CUDA_CHILD_GRAPH_NODE_PARAMS`: the graph, then its
/// ownership).
pub const NODE_GRAPH: c_int = 4;
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`: `CUDA_MEM_ALLOC_NODE_PARAMS_v2` (laid out as v1).
pub const NODE_MEM_ALLOC: c_int = 10;
/// `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`
pub const OWNERSHIP_MOVE: c_int = 1;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` (in `CUDA_GRAPH_INSTANTIATE_PARAMS.flags`, its first
/// field)
pub const INSTANTIATE_FLAG_UPLOAD: u64 = 2;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
