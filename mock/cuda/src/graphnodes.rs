//! Building graphs node by node beyond memory nodes, as the driver does: the generic
//! `cuGraphAddNode(_v2)` (CUDA 12.2+: kernel, empty, child-graph, memory-allocation and
//! memory-free nodes), child graphs (`cuGraphAddChildGraphNode`), `cuGraphClone`,
//! `cuGraphInstantiateWithParams` (with `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`), `cuGraphUpload`
//! and `cuGraphExecUpdate(_v2)`. What a graph's memory nodes hold follows every one of them
//! (`graphmem.rs`): a clone has its original's memory nodes; a child graph's memory nodes become
//! the parent's (only a child moved into its parent may have any: a cloned child with memory
//! nodes is refused, as the driver refuses it); an upload takes an instantiation's memory as its
//! first launch would; an update gives the instantiation the new graph's memory.
//! `cuGraphNodeSetParams` and `cuGraphExecNodeSetParams` stay unsupported (`unsupported.rs`):
//! the driver refuses them for memory nodes too.

use std::ffi::{c_int, c_void};

use crate::driver::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, CUDA_SUCCESS, CUresult, guard, put, tri,
};
use crate::exec::{self, MemAllocNodeParams};
use crate::graphmem;

/// `CUgraphNodeType` values the simulated driver builds.
const NODE_KERNEL: c_int = 0;
const NODE_GRAPH: c_int = 4;
const NODE_EMPTY: c_int = 5;
const NODE_MEM_ALLOC: c_int = 10;
const NODE_MEM_FREE: c_int = 11;
/// `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE` / `_MOVE`
const OWNERSHIP_CLONE: c_int = 0;
const OWNERSHIP_MOVE: c_int = 1;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`
const FLAG_UPLOAD: u64 = 2;

/// `CUgraphNodeParams`: the type, then (at byte 16) the union of the per-type parameters
/// (232 bytes), then a reserved word.
#[repr(C)]
pub struct NodeParams {
    node_type: c_int,
    reserved0: [c_int; 3],
    union: [u64; 29],
    reserved2: i64,
}

/// `CUDA_CHILD_GRAPH_NODE_PARAMS`
#[repr(C)]
struct ChildParams {
    graph: usize,
    ownership: c_int,
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`
#[repr(C)]
pub struct InstantiateParams {
    flags: u64,
    upload_stream: usize,
    err_node: usize,
    result: c_int,
}

/// Add the child graph `child` to `parent`: its kernels, and its memory nodes when it moves in.
fn add_child(parent: usize, child: usize, ownership: c_int) -> Result<(), CUresult> {
    exec::graph_kernels(parent)?;
    let kernels = exec::graph_kernels(child)?;
    let mem = graphmem::graph_memory(child);
    match ownership {
        OWNERSHIP_CLONE if mem.is_some() => return Err(CUDA_ERROR_NOT_SUPPORTED),
        OWNERSHIP_CLONE | OWNERSHIP_MOVE => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    exec::graph_set(parent, &kernels, false)?;
    if let Some(m) = mem {
        graphmem::add_nodes(parent, m);
    }
    if ownership == OWNERSHIP_MOVE {
        // the parent owns it now: it can no longer be instantiated or destroyed on its own
        let _ = exec::destroy_graph(child);
    }
    Ok(())
}

/// One node of `params` added to graph `g`, its handle in `node`.
fn add_node_out(node: *mut usize, g: usize, params: *mut NodeParams) -> CUresult {
    guard(|| {
        tri!(add_node(g, params));
        // SAFETY: the caller's out-pointer (put refuses NULL).
        unsafe { put(node, exec::new_handle()) }
    })
}

fn add_node(g: usize, params: *mut NodeParams) -> Result<(), CUresult> {
    // SAFETY: the caller's node parameters (null refused).
    let p = unsafe { params.as_mut() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let body = p.union.as_mut_ptr().cast::<u8>();
    match p.node_type {
        NODE_KERNEL => {
            // SAFETY: a kernel node's parameters start with its CUfunction.
            let f = unsafe { body.cast::<*mut c_void>().read() };
            let ns = exec::kernel_ns(f)?;
            exec::graph_set(g, &[ns], false)
        }
        NODE_EMPTY => exec::graph_kernels(g).map(|_| ()),
        NODE_GRAPH => {
            // SAFETY: a child-graph node's parameters are CUDA_CHILD_GRAPH_NODE_PARAMS.
            let c = unsafe { &*body.cast::<ChildParams>() };
            add_child(g, c.graph, c.ownership)
        }
        NODE_MEM_ALLOC => {
            // SAFETY: a memory-allocation node's parameters are CUDA_MEM_ALLOC_NODE_PARAMS_v2
            // (laid out as v1), within the 232-byte union.
            exec::add_mem_alloc_node(g, unsafe { body.cast::<MemAllocNodeParams>().as_mut() })
        }
        NODE_MEM_FREE => {
            // SAFETY: a memory-free node's parameters are its CUdeviceptr.
            exec::add_mem_free_node(g, unsafe { body.cast::<u64>().read() })
        }
        _ => Err(CUDA_ERROR_NOT_SUPPORTED),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode(
    node: *mut usize,
    g: usize,
    _deps: *const usize,
    _n: usize,
    params: *mut NodeParams,
) -> CUresult {
    add_node_out(node, g, params)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    node: *mut usize,
    g: usize,
    _deps: *const usize,
    _edges: *const c_void,
    _n: usize,
    params: *mut NodeParams,
) -> CUresult {
    add_node_out(node, g, params)
}

/// A child graph node: the child is cloned into the parent (one with memory nodes is refused).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    node: *mut usize,
    g: usize,
    _deps: *const usize,
    _n: usize,
    child: usize,
) -> CUresult {
    guard(|| {
        tri!(add_child(g, child, OWNERSHIP_CLONE));
        // SAFETY: the caller's out-pointer (put refuses NULL).
        unsafe { put(node, exec::new_handle()) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphClone(clone: *mut usize, original: usize) -> CUresult {
    guard(|| {
        let h = tri!(exec::new_graph(tri!(exec::graph_kernels(original))));
        if let Some(m) = graphmem::graph_memory(original) {
            graphmem::add_nodes(h, m);
        }
        // SAFETY: the caller's out-pointer (put refuses NULL).
        unsafe { put(clone, h) }
    })
}

fn instantiate_with_params(
    out: *mut usize,
    graph: usize,
    params: *mut InstantiateParams,
) -> CUresult {
    guard(|| {
        // SAFETY: the caller's parameters (null refused).
        let Some(p) = (unsafe { params.as_mut() }) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        let h = tri!(exec::instantiate(graph));
        if p.flags & FLAG_UPLOAD != 0
            && let Err(e) = graphmem::launching(h)
        {
            let _ = exec::destroy_graph(h);
            return e;
        }
        p.result = 0;
        // SAFETY: the caller's out-pointer (put refuses NULL).
        unsafe { put(out, h) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    out: *mut usize,
    graph: usize,
    params: *mut InstantiateParams,
) -> CUresult {
    instantiate_with_params(out, graph, params)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    out: *mut usize,
    graph: usize,
    params: *mut InstantiateParams,
) -> CUresult {
    instantiate_with_params(out, graph, params)
}

/// An upload maps an instantiation's memory without running it.
fn upload(exec_handle: usize) -> CUresult {
    guard(|| {
        tri!(exec::graph_kernels(exec_handle));
        tri!(graphmem::launching(exec_handle));
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphUpload(exec_handle: usize, _stream: usize) -> CUresult {
    upload(exec_handle)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphUpload_ptsz(exec_handle: usize, _stream: usize) -> CUresult {
    upload(exec_handle)
}

/// The instantiation takes the graph's kernels and memory (the simulated driver accepts any
/// topology).
fn update(exec_handle: usize, graph: usize) -> CUresult {
    guard(|| {
        tri!(exec::graph_kernels(exec_handle));
        let kernels = tri!(exec::graph_kernels(graph));
        tri!(graphmem::updated(exec_handle, graph));
        tri!(exec::graph_set(exec_handle, &kernels, true));
        CUDA_SUCCESS
    })
}

/// `CUgraphExecUpdateResultInfo`: the result, the node at fault, the node it was matched with.
#[repr(C)]
pub struct UpdateResultInfo {
    result: c_int,
    error_node: usize,
    error_from_node: usize,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecUpdate_v2(
    exec_handle: usize,
    graph: usize,
    info: *mut UpdateResultInfo,
) -> CUresult {
    let r = update(exec_handle, graph);
    // SAFETY: the caller's result slot, when given.
    if let Some(i) = unsafe { info.as_mut() } {
        i.result = if r == CUDA_SUCCESS { 0 } else { 1 };
        i.error_node = 0;
        i.error_from_node = 0;
    }
    r
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecUpdate(
    exec_handle: usize,
    graph: usize,
    err_node: *mut usize,
    result: *mut c_int,
) -> CUresult {
    let r = update(exec_handle, graph);
    // SAFETY: the caller's out-slots, when given.
    unsafe {
        if let Some(n) = err_node.as_mut() {
            *n = 0;
        }
        if let Some(res) = result.as_mut() {
            *res = if r == CUDA_SUCCESS { 0 } else { 1 };
        }
    }
    r
}

pub(crate) fn exports() -> Vec<(&'static str, usize)> {
    crate::driver::table!(
        cuGraphAddNode,
        cuGraphAddNode_v2,
        cuGraphAddChildGraphNode,
        cuGraphClone,
        cuGraphInstantiateWithParams,
        cuGraphInstantiateWithParams_ptsz,
        cuGraphUpload,
        cuGraphUpload_ptsz,
        cuGraphExecUpdate,
        cuGraphExecUpdate_v2,
    )
}
