//! What every export of the mock library stands on: NVML's return codes, the state `nvmlInit`
//! reads from the node file (reference-counted until `nvmlShutdown`), and the device handles,
//! opaque values encoding (visible GPU position, MIG slot), resolved against it.

use std::sync::Mutex;

use gpufence_mock_node::{MigMode, Node};
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

const HANDLE_BASE: usize = 0x6770_0000_0000;
const HANDLE_MASK: usize = !0xFFFF_FFFF;

pub(crate) struct State {
    pub(crate) node: Node,
    /// Indices into `node.gpus` of the visible GPUs, in NVML order.
    pub(crate) visible: Vec<usize>,
    pub(crate) refs: u32,
}

pub(crate) static STATE: Mutex<Option<State>> = Mutex::new(None);

#[derive(Clone, Copy)]
pub(crate) enum Handle {
    Gpu(usize),
    Mig(usize, usize),
}

pub(crate) fn encode(h: Handle) -> nvmlDevice_t {
    let v = match h {
        Handle::Gpu(p) => HANDLE_BASE | (p << 8),
        Handle::Mig(p, m) => HANDLE_BASE | (p << 8) | (m + 1),
    };
    v as nvmlDevice_t
}

pub(crate) fn decode(d: nvmlDevice_t) -> Option<Handle> {
    let v = d as usize;
    if v & HANDLE_MASK != HANDLE_BASE {
        return None;
    }
    let p = (v >> 8) & 0xFFFF;
    match v & 0xFF {
        0 => Some(Handle::Gpu(p)),
        m => Some(Handle::Mig(p, m - 1)),
    }
}

/// Run `f` with the initialised state and the resolved handle.
pub(crate) fn with_device(
    d: nvmlDevice_t,
    f: impl FnOnce(&State, &gpufence_mock_node::Gpu, Option<&gpufence_mock_node::Mig>) -> nvmlReturn_t,
) -> nvmlReturn_t {
    let st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(s) = st.as_ref() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    let Some(h) = decode(d) else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    let (p, m) = match h {
        Handle::Gpu(p) => (p, None),
        Handle::Mig(p, m) => (p, Some(m)),
    };
    let Some(gpu) = s.visible.get(p).map(|&i| &s.node.gpus[i]) else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    let mig = match m {
        None => None,
        Some(m) => match gpu.mig.get(m) {
            Some(x) if gpu.mig_mode() == MigMode::Enabled => Some(x),
            _ => return NVML_ERROR_INVALID_ARGUMENT,
        },
    };
    f(s, gpu, mig)
}

pub(crate) fn with_state(f: impl FnOnce(&State) -> nvmlReturn_t) -> nvmlReturn_t {
    let st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    match st.as_ref() {
        Some(s) => f(s),
        None => NVML_ERROR_UNINITIALIZED,
    }
}
