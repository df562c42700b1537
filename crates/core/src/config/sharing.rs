//! `[sharing.mps]`: where the MPS control daemons of this node keep their pipe and shm
//! directories, and which GPUs are shared through MPS by node policy.
//!
//! Layouts of the peers (set the keys accordingly):
//! * NVIDIA device plugin (`sharing.mps` in its config): one daemon per resource, root
//!   `/run/nvidia/mps`: `pipe-dir = "/run/nvidia/mps/nvidia.com/gpu/pipe"`,
//!   `shm-dir = "/run/nvidia/mps/shm"`.
//! * NVIDIA DRA driver: one daemon per claim; its pipe directory appears in containers at
//!   `/tmp/nvidia-mps` (`container-pipe-dir`, the default here) with `/dev/shm` from the daemon.
//! * one daemon per GPU: `pipe-dir = "/run/nvidia-mps/{uuid}/pipe"`, `shm-dir = "/run/nvidia-mps/{uuid}/shm"`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct SharingConfig {
    /// MPS control daemons; absent: no GPU of this node is shared through MPS.
    pub mps: Option<MpsConfig>,
    /// `sharing.replicas`: what a time-slicing replica of a GPU (`<id>::<k>` in kubelet's
    /// record) is worth.
    pub replicas: ReplicasPolicy,
    /// `sharing.replica-cores-policy`: the cores policy of replica compute shares.
    pub replica_cores_policy: CoresPolicy,
}

/// `sharing.replicas`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicasPolicy {
    /// r of a GPU's N replicas = r/N of its memory (hard) and compute.
    #[default]
    Equal,
    /// Replicas carry no limit.
    Off,
}

/// A compute share's policy (`gpufence.dev/cores-policy` has the same two values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CoresPolicy {
    /// Never above the share.
    Hard,
    /// Idle GPU time may be used; back to the share under contention.
    #[default]
    Burst,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct MpsConfig {
    /// Host directory of the control daemon's pipes for a GPU (`CUDA_MPS_PIPE_DIRECTORY` of the
    /// daemon); `{index}` and `{uuid}` are replaced by the GPU's.
    pub pipe_dir: String,
    /// Host directory of the daemon's shared memory, mounted at `/dev/shm`; same placeholders.
    pub shm_dir: String,
    /// GPUs shared through MPS by node policy (indexes, `GPU-<uuid>`, or `all`); any other GPU
    /// only when the allocation asks (`gpufence.dev/sharing: mps`).
    pub gpus: Vec<String>,
    /// Where the pipe directory appears in the container (`CUDA_MPS_PIPE_DIRECTORY`).
    pub container_pipe_dir: String,
    /// The daemon's control client under `driver-root`, run to read the daemon's defaults.
    pub control: String,
}

impl Default for MpsConfig {
    fn default() -> Self {
        MpsConfig {
            pipe_dir: "/run/nvidia/mps/nvidia.com/gpu/pipe".to_string(),
            shm_dir: "/run/nvidia/mps/shm".to_string(),
            gpus: Vec::new(),
            container_pipe_dir: "/tmp/nvidia-mps".to_string(),
            control: "/usr/bin/nvidia-cuda-mps-control".to_string(),
        }
    }
}

impl SharingConfig {
    pub(crate) fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let Some(m) = &self.mps else { return Ok(()) };
        for (key, v) in [
            ("sharing.mps.pipe-dir", &m.pipe_dir),
            ("sharing.mps.shm-dir", &m.shm_dir),
            ("sharing.mps.container-pipe-dir", &m.container_pipe_dir),
            ("sharing.mps.control", &m.control),
        ] {
            if !v.starts_with('/') || v.split('/').any(|c| c == "..") {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    key,
                    value: v.clone(),
                    why: "must be an absolute path without `..`",
                });
            }
        }
        for g in &m.gpus {
            let ok = g == "all" || g.parse::<u32>().is_ok() || g.starts_with("GPU-");
            if !ok {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    key: "sharing.mps.gpus",
                    value: g.clone(),
                    why: "not a GPU index, GPU-<uuid> or all",
                });
            }
        }
        Ok(())
    }
}
