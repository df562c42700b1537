//! Every other way memory enters a CUDA graph, besides stream capture and
//! `cuGraphAddMemAllocNode` (`cuda_launch`): the generic `cuGraphAddNode(_v2)` with a
//! memory-allocation or child-graph node, `cuGraphAddChildGraphNode`, `cuGraphClone`,
//! `cuGraphExecUpdate(_v2)`, and the two ways an instantiation takes its memory before its first
//! launch: `cuGraphUpload` and `cuGraphInstantiateWithParams` with
//! `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`. Each follows the graph's memory (`graphmem`).
//! `cuGraphNodeSetParams`, `cuGraphExecNodeSetParams` and `cuGraphExecChildGraphNodeSetParams`
//! may not change a graph's memory afterwards: under a quota, parameters of a memory-allocation
//! node, or of a child graph with memory nodes, are refused with `CUDA_ERROR_NOT_SUPPORTED` before
//! the driver runs (the driver refuses them too; a driver that took them would let the graph's
//! memory change where the shim cannot see by how much).

use std::ffi::{c_int, c_void};

use super::{guard, real_or};
use crate::ffi::{
    CUDA_ERROR_NOT_SUPPORTED, CUDA_SUCCESS, CUresult, GraphNodeParams, INSTANTIATE_FLAG_UPLOAD,
    MemAllocNodeParams, NODE_GRAPH, NODE_MEM_ALLOC, OWNERSHIP_MOVE,
};
use crate::{graphmem, state};

/// A node `params` added to `graph` succeeded: follow the memory it brings.
fn node_added(graph: usize, params: *const GraphNodeParams) {
    // SAFETY: the caller's node parameters, read after the driver accepted them (null: none).
    let Some(p) = (unsafe { params.as_ref() }) else {
        return;
    };
    let body = p.body.as_ptr().cast::<u8>();
    match p.node_type {
        NODE_MEM_ALLOC => {
            // SAFETY: a memory-allocation node's parameters are CUDA_MEM_ALLOC_NODE_PARAMS_v2,
            // laid out as v1, inside the 232-byte union.
            let m = unsafe { &*body.cast::<MemAllocNodeParams>() };
            graphmem::added_to_graph(graph, m.head.location_id, m.bytesize as u64);
        }
        NODE_GRAPH => {
            // SAFETY: a child-graph node's parameters: the CUgraph, then the ownership (c_int).
            let (child, ownership) = unsafe {
                (
                    body.cast::<usize>().read(),
                    body.add(8).cast::<c_int>().read(),
                )
            };
            graphmem::child_added(graph, child, ownership == OWNERSHIP_MOVE);
        }
        _ => {}
    }
}

/// Whether new parameters `params` for an existing node would change a graph's memory.
fn brings_memory(params: *const GraphNodeParams) -> bool {
    // SAFETY: the caller's node parameters (null: none).
    let Some(p) = (unsafe { params.as_ref() }) else {
        return false;
    };
    match p.node_type {
        NODE_MEM_ALLOC => true,
        // SAFETY: a child-graph node's parameters start with the CUgraph.
        NODE_GRAPH => graphmem::has_memory(unsafe { p.body.as_ptr().cast::<usize>().read() }),
        _ => false,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode(
    node: *mut usize,
    graph: usize,
    deps: *const usize,
    n: usize,
    params: *mut GraphNodeParams,
) -> CUresult {
    guard(|| {
        let real = real_or!(cuGraphAddNode);
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        let r = unsafe { real(node, graph, deps, n, params) };
        if r == CUDA_SUCCESS {
            node_added(graph, params);
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    node: *mut usize,
    graph: usize,
    deps: *const usize,
    edges: *const c_void,
    n: usize,
    params: *mut GraphNodeParams,
) -> CUresult {
    guard(|| {
        let real = real_or!(cuGraphAddNode_v2);
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        let r = unsafe { real(node, graph, deps, edges, n, params) };
        if r == CUDA_SUCCESS {
            node_added(graph, params);
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeSetParams(
    node: usize,
    params: *mut GraphNodeParams,
) -> CUresult {
    guard(|| {
        let real = real_or!(cuGraphNodeSetParams);
        if state::config().is_some() && brings_memory(params) {
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        unsafe { real(node, params) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecNodeSetParams(
    exec: usize,
    node: usize,
    params: *mut GraphNodeParams,
) -> CUresult {
    guard(|| {
        let real = real_or!(cuGraphExecNodeSetParams);
        if state::config().is_some() && brings_memory(params) {
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        unsafe { real(exec, node, params) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecChildGraphNodeSetParams(
    exec: usize,
    node: usize,
    child: usize,
) -> CUresult {
    guard(|| {
        let real = real_or!(cuGraphExecChildGraphNodeSetParams);
        if state::config().is_some() && graphmem::has_memory(child) {
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        unsafe { real(exec, node, child) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    node: *mut usize,
    graph: usize,
    deps: *const usize,
    n: usize,
    child: usize,
) -> CUresult {
    guard(|| {
        let real = real_or!(cuGraphAddChildGraphNode);
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        let r = unsafe { real(node, graph, deps, n, child) };
        if r == CUDA_SUCCESS {
            graphmem::child_added(graph, child, false);
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphClone(clone: *mut usize, original: usize) -> CUresult {
    guard(|| {
        let real = real_or!(cuGraphClone);
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        let r = unsafe { real(clone, original) };
        if r == CUDA_SUCCESS && !clone.is_null() {
            // SAFETY: the driver succeeded, so it wrote the caller's clone slot.
            graphmem::cloned(unsafe { clone.read() }, original);
        }
        r
    })
}

macro_rules! upload {
    ($name:ident) => {
        /// An upload takes the instantiation's memory as its first launch would.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(exec: usize, stream: usize) -> CUresult {
            guard(|| {
                let real = real_or!($name);
                if let Err(e) = graphmem::launching(exec, "cuGraphUpload (graph memory)") {
                    return e;
                }
                // SAFETY: the caller's arguments, unchanged, to the driver's own function.
                let r = unsafe { real(exec, stream) };
                if r != CUDA_SUCCESS {
                    graphmem::launch_failed(exec);
                }
                r
            })
        }
    };
}
upload!(cuGraphUpload);
upload!(cuGraphUpload_ptsz);

macro_rules! instantiate_with_params {
    ($name:ident) => {
        /// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` uploads at instantiation: the graph's memory is
        /// charged before the driver runs.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            exec: *mut usize,
            graph: usize,
            params: *mut c_void,
        ) -> CUresult {
            guard(|| {
                let real = real_or!($name);
                // SAFETY: CUDA_GRAPH_INSTANTIATE_PARAMS starts with its cuuint64_t flags (null:
                // none, the driver answers).
                let upload = unsafe { params.cast::<u64>().as_ref() }
                    .is_some_and(|f| f & INSTANTIATE_FLAG_UPLOAD != 0);
                let charged = if upload {
                    match graphmem::instantiating_uploaded(graph) {
                        Ok(c) => c,
                        Err(e) => return e,
                    }
                } else {
                    None
                };
                // SAFETY: the caller's arguments, unchanged, to the driver's own function.
                let r = unsafe { real(exec, graph, params) };
                if r != CUDA_SUCCESS || exec.is_null() {
                    graphmem::instantiated_uploaded(charged, None);
                    return r;
                }
                // SAFETY: the driver succeeded, so it wrote the caller's exec slot.
                let x = unsafe { exec.read() };
                graphmem::instantiated(x, graph);
                graphmem::instantiated_uploaded(charged, Some(x));
                r
            })
        }
    };
}
instantiate_with_params!(cuGraphInstantiateWithParams);
instantiate_with_params!(cuGraphInstantiateWithParams_ptsz);

/// `cuGraphExecUpdate(_v2)`: the instantiation holds the new graph's memory (at least what it
/// held); a resident one is charged the growth before the driver runs.
fn exec_update(exec: usize, graph: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    let grown = match graphmem::updating(exec, graph) {
        Ok(g) => g,
        Err(e) => return e,
    };
    let r = call();
    graphmem::updated(exec, graph, grown, r == CUDA_SUCCESS);
    r
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecUpdate_v2(
    exec: usize,
    graph: usize,
    info: *mut c_void,
) -> CUresult {
    guard(|| {
        let real = real_or!(cuGraphExecUpdate_v2);
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        exec_update(exec, graph, || unsafe { real(exec, graph, info) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecUpdate(
    exec: usize,
    graph: usize,
    err_node: *mut usize,
    result: *mut c_int,
) -> CUresult {
    guard(|| {
        let real = real_or!(cuGraphExecUpdate);
        // SAFETY: the caller's arguments, unchanged, to the driver's own function.
        exec_update(exec, graph, || unsafe {
            real(exec, graph, err_node, result)
        })
    })
}
