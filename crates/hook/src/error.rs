//! Why the hook refused or failed: [`HookError`], one line each, and the exit code it gives.

use crate::state;

/// Why the hook refused or failed. Every variant reads as one line.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("allocation: {0}")]
    Allocation(#[from] crate::allocation::AllocationError),
    #[error("inventory: {0}")]
    Inventory(String),
    #[error("plan: {0}")]
    Plan(String),
    #[error(transparent)]
    Path(#[from] crate::enter::safepath::PathError),
    #[error(transparent)]
    Mount(#[from] crate::enter::mounts::MountError),
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::CgroupError),
    #[error("{path}: {op}: {errno}")]
    Host {
        path: String,
        op: &'static str,
        errno: nix::errno::Errno,
    },
    #[error("in the container's mount namespace: {message}")]
    Namespace { code: i32, message: String },
    #[error("{message}")]
    HostFiles { code: i32, message: String },
    #[error("ld cache refresh: {0}")]
    Ldcache(String),
    #[error(transparent)]
    Caps(#[from] crate::enter::caps::CapsError),
}

impl HookError {
    /// 1: the input (state, config.json, allocation, rootfs) is at fault; 2: the host failed.
    pub fn code(&self) -> i32 {
        match self {
            HookError::State(_)
            | HookError::Config(_)
            | HookError::Allocation(_)
            | HookError::Plan(_)
            | HookError::Path(_) => 1,
            HookError::Namespace { code, .. } | HookError::HostFiles { code, .. } => *code,
            _ => 2,
        }
    }
}
