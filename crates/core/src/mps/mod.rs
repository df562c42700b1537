//! MPS sharing: a container whose GPUs are shared through an MPS control daemon (node policy
//! `sharing.mps.gpus`, or the allocation's `gpufence.dev/sharing: mps`) gets the daemon's pipe
//! directory (at `CUDA_MPS_PIPE_DIRECTORY`) and shared memory (at `/dev/shm`) and its per-client
//! limits as MPS reads them from the client's environment:
//!
//! * `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` from `cores` (one value per client: the smallest share
//!   of its devices). NVIDIA documents that a client's value only further constrains the
//!   daemon's default, so a container cannot raise its share by editing its env.
//! * `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` from `memory`, as `<ordinal>=<MiB>M,…` (the documented
//!   `<device>=<size>` list, device = the client's CUDA ordinal, MiB rounded down). NVIDIA does not
//!   document the client value as bounded by the daemon's default
//!   (`set_default_device_pinned_mem_limit`), so a process in the container can set a larger
//!   one before it starts CUDA: this limit is advisory. The container's quota stays with the
//!   backend `quota.backend` picked (the shim, reading the read-only quota file, or the driver),
//!   so the smaller of the two always holds.
//!
//! MPS is refused on MIG devices (MPS does not support them) and when the daemon is not running
//! ([`probe`], the only I/O here: the daemon's control client answers
//! `get_default_active_thread_percentage` and `get_default_device_pinned_mem_limit <dev>`).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::allocation::input::Inputs;
use crate::allocation::{Allocation, AllocationError, DeviceRef};
use crate::cdi::MountEdit;
use crate::config::Config;
use crate::inventory::Inventory;

pub use crate::allocation::container_dialects::ANN_SHARING;

/// What the daemon reported (filled by [`probe`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Defaults {
    pub active_thread_percentage: String,
    /// Per daemon device (same order as `daemon_devices`): the default pinned memory limit.
    pub pinned_mem_limits: Vec<String>,
}

/// MPS for one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsPlan {
    /// What asked for MPS (`gpufence.dev/sharing` or `sharing.mps.gpus`).
    pub requested_by: String,
    /// Host directory of the daemon's pipes.
    pub pipe_dir: String,
    /// Host directory of the daemon's shared memory.
    pub shm_dir: String,
    /// `CUDA_MPS_PIPE_DIRECTORY` inside the container.
    pub container_pipe_dir: String,
    /// The daemon's index of each device, in container order.
    pub daemon_devices: Vec<u32>,
    pub active_thread_percentage: Option<u8>,
    pub pinned_mem_limit: Option<String>,
    /// The daemon's defaults (absent from a plan that has not been probed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<Defaults>,
}

fn requested(request: &Inputs, cfg: &Config) -> Result<bool, AllocationError> {
    if !cfg.allocation.honours(crate::config::Dialect::Gpufence) {
        return Ok(false);
    }
    match request.annotations.get(ANN_SHARING).map(String::as_str) {
        None => Ok(false),
        Some(v) if v.trim() == "mps" => Ok(true),
        Some(v) => Err(AllocationError::new(ANN_SHARING, v, "expected mps")),
    }
}

fn render(template: &str, index: u32, uuid: &str) -> String {
    template
        .replace("{index}", &index.to_string())
        .replace("{uuid}", uuid)
}

/// The MPS part of the plan, or `None` when the container's GPUs are not shared through MPS.
/// Pure.
pub fn plan(
    request: &Inputs,
    alloc: &Allocation,
    inv: &Inventory,
    cfg: &Config,
) -> Result<Option<MpsPlan>, AllocationError> {
    let asked = requested(request, cfg)?;
    let Some(m) = &cfg.sharing.mps else {
        if asked {
            return Err(AllocationError::new(
                ANN_SHARING,
                "mps",
                "no MPS control daemon on this node (sharing.mps is not configured)",
            ));
        }
        return Ok(None);
    };
    let policy = |index: u32, uuid: &str| {
        m.gpus
            .iter()
            .any(|g| g == "all" || g.parse::<u32>() == Ok(index) || g.eq_ignore_ascii_case(uuid))
    };
    let by_policy = alloc.devices.iter().any(|d| match d.device {
        DeviceRef::Gpu { index } => policy(index, &d.uuid),
        DeviceRef::Mig { gpu, .. } => inv.gpu_by_index(gpu).is_some_and(|g| policy(gpu, &g.uuid)),
    });
    if !asked && !by_policy {
        return Ok(None);
    }
    let (key, value) = if asked {
        (ANN_SHARING, "mps".to_string())
    } else {
        ("sharing.mps.gpus", m.gpus.join(","))
    };
    let refuse = |why: String| Err(AllocationError::new(key, &value, why));
    let mut dirs: Option<(String, String)> = None;
    let mut daemon_devices = Vec::new();
    for (i, d) in alloc.devices.iter().enumerate() {
        let DeviceRef::Gpu { index } = d.device else {
            return refuse(format!(
                "device {i} ({}) is a MIG device: MPS does not share MIG devices",
                d.uuid
            ));
        };
        let pd = (
            render(&m.pipe_dir, index, &d.uuid),
            render(&m.shm_dir, index, &d.uuid),
        );
        match &dirs {
            None => dirs = Some(pd),
            Some(x) if *x == pd => {}
            Some(x) => {
                return refuse(format!(
                    "device {i} ({}) is served by another MPS daemon ({}) than device 0 ({}): one client talks to one daemon",
                    d.uuid, pd.0, x.0
                ));
            }
        }
        daemon_devices.push(index);
    }
    let Some((pipe_dir, shm_dir)) = dirs else {
        return Ok(None);
    };
    let active_thread_percentage = alloc.devices.iter().filter_map(|d| d.cores).min();
    let limits: Vec<String> = alloc
        .devices
        .iter()
        .enumerate()
        .filter_map(|(i, d)| d.memory_limit.map(|b| format!("{i}={}M", (b >> 20).max(1))))
        .collect();
    Ok(Some(MpsPlan {
        requested_by: key.to_string(),
        pipe_dir,
        shm_dir,
        container_pipe_dir: m.container_pipe_dir.clone(),
        daemon_devices,
        active_thread_percentage,
        pinned_mem_limit: (!limits.is_empty()).then(|| limits.join(",")),
        defaults: None,
    }))
}

/// The mounts and env of an MPS plan.
pub fn edits(m: &MpsPlan) -> (Vec<MountEdit>, Vec<String>) {
    let opts = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mounts = vec![
        MountEdit {
            host_path: m.pipe_dir.clone(),
            container_path: m.container_pipe_dir.clone(),
            kind: None,
            options: opts(&["rw", "nosuid", "nodev", "noexec", "bind"]),
        },
        MountEdit {
            host_path: m.shm_dir.clone(),
            container_path: "/dev/shm".to_string(),
            kind: None,
            options: opts(&["rw", "nosuid", "nodev", "noexec", "bind"]),
        },
    ];
    let mut env = vec![format!("CUDA_MPS_PIPE_DIRECTORY={}", m.container_pipe_dir)];
    if let Some(p) = m.active_thread_percentage {
        env.push(format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={p}"));
    }
    if let Some(l) = &m.pinned_mem_limit {
        env.push(format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={l}"));
    }
    (mounts, env)
}

#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("no MPS control daemon is running for this container's GPUs: {0}")]
    Absent(String),
    #[error("MPS control client {path}: {message}")]
    Client { path: String, message: String },
}

/// Ask the daemon for its defaults through its control client (driver-root
/// `sharing.mps.control`, env `CUDA_MPS_PIPE_DIRECTORY` only, never the container's). Fails
/// when the daemon is not running.
pub fn probe(cfg: &Config, m: &mut MpsPlan) -> Result<Vec<String>, MpsError> {
    let control = std::path::Path::new(&m.pipe_dir).join("control");
    if std::fs::symlink_metadata(&control).is_err() {
        return Err(MpsError::Absent(format!(
            "{} does not exist",
            control.display()
        )));
    }
    let client = cfg.driver_path(
        &cfg.sharing
            .mps
            .as_ref()
            .map(|c| c.control.clone())
            .unwrap_or_default(),
    );
    let mut input = String::from("get_default_active_thread_percentage\n");
    for d in &m.daemon_devices {
        input.push_str(&format!("get_default_device_pinned_mem_limit {d}\n"));
    }
    let out = run_client(&client, &m.pipe_dir, &input)?;
    let lines: Vec<&str> = out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.len() != 1 + m.daemon_devices.len() {
        return Err(MpsError::Absent(format!(
            "{}: {}",
            client.display(),
            lines.first().copied().unwrap_or("no answer")
        )));
    }
    let defaults = Defaults {
        active_thread_percentage: lines[0].to_string(),
        pinned_mem_limits: lines[1..].iter().map(|s| s.to_string()).collect(),
    };
    let mut notes = Vec::new();
    if let (Some(ours), Ok(theirs)) = (
        m.active_thread_percentage,
        defaults.active_thread_percentage.parse::<f64>(),
    ) && f64::from(ours) > theirs
    {
        notes.push(format!(
            "MPS: cores {ours}% exceeds the daemon's default active thread percentage {theirs}%: the daemon's value holds (a client can only lower it)"
        ));
    }
    if m.pinned_mem_limit.is_some() {
        notes.push(
            "MPS: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT can be raised from inside the container; the memory quota stays enforced by the quota backend"
                .to_string(),
        );
    }
    m.defaults = Some(defaults);
    Ok(notes)
}

fn run_client(client: &std::path::Path, pipe_dir: &str, input: &str) -> Result<String, MpsError> {
    let err = |message: String| MpsError::Client {
        path: client.display().to_string(),
        message,
    };
    let mut child = Command::new(client)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| err(e.to_string()))?;
    if let Some(mut s) = child.stdin.take() {
        s.write_all(input.as_bytes())
            .map_err(|e| err(e.to_string()))?;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match child.try_wait().map_err(|e| err(e.to_string()))? {
            Some(_) => break,
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(err("no answer within 5 s".into()));
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    let out = child.wait_with_output().map_err(|e| err(e.to_string()))?;
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        return Err(MpsError::Absent(format!(
            "{}: {}",
            client.display(),
            text.lines().next().unwrap_or("failed").trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tests::alloc;

    fn cfg(gpus: &[&str], pipe: &str) -> Config {
        let mut c = Config::default();
        c.sharing.mps = Some(crate::config::MpsConfig {
            pipe_dir: pipe.into(),
            shm_dir: "/run/mps/shm".into(),
            gpus: gpus.iter().map(|s| s.to_string()).collect(),
            ..crate::config::MpsConfig::default()
        });
        c
    }

    fn inv() -> Inventory {
        serde_json::from_value(
            serde_json::json!({"driverVersion": "x", "cudaDriverVersion": 1,
            "gpus": [], "controlNodes": [], "driverFiles": []}),
        )
        .unwrap()
    }

    const G0: DeviceRef = DeviceRef::Gpu { index: 0 };
    const G1: DeviceRef = DeviceRef::Gpu { index: 1 };

    fn spec(sharing: Option<&str>) -> Inputs {
        let mut r = Inputs::default();
        if let Some(v) = sharing {
            r.annotations.insert(ANN_SHARING.to_string(), v.to_string());
        }
        r
    }

    #[test]
    fn policy_or_request_gives_pipe_shm_and_client_limits() {
        let a = alloc(&[
            (G0, "GPU-a", Some(3 << 30), Some(40)),
            (G1, "GPU-b", Some((1 << 30) + 5), Some(25)),
        ]);
        let m = plan(&spec(None), &a, &inv(), &cfg(&["all"], "/run/mps/pipe"))
            .unwrap()
            .unwrap();
        assert_eq!(m.requested_by, "sharing.mps.gpus");
        assert_eq!(m.active_thread_percentage, Some(25));
        assert_eq!(m.pinned_mem_limit.as_deref(), Some("0=3072M,1=1024M"));
        let (mounts, env) = edits(&m);
        assert_eq!(mounts[0].container_path, "/tmp/nvidia-mps");
        assert_eq!(mounts[1].container_path, "/dev/shm");
        assert_eq!(
            env,
            [
                "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3072M,1=1024M"
            ]
        );
        // not in the policy list and not asked: no MPS
        assert!(
            plan(&spec(None), &a, &inv(), &cfg(&["5"], "/p"))
                .unwrap()
                .is_none()
        );
        let m = plan(&spec(Some("mps")), &a, &inv(), &cfg(&[], "/p"))
            .unwrap()
            .unwrap();
        assert_eq!(m.requested_by, ANN_SHARING);
        let one = alloc(&[(G1, "GPU-b", None, None)]);
        let m = plan(
            &spec(None),
            &one,
            &inv(),
            &cfg(&["GPU-B"], "/p/{index}/{uuid}"),
        )
        .unwrap()
        .unwrap();
        assert_eq!(m.pipe_dir, "/p/1/GPU-b");
        assert_eq!(edits(&m).1, ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]);
    }

    #[test]
    fn refusals_name_the_reason() {
        let a = alloc(&[(G0, "GPU-a", None, None)]);
        let e = plan(&spec(Some("mps")), &a, &inv(), &Config::default()).unwrap_err();
        assert!(e.why.contains("no MPS control daemon"), "{e}");
        let e = plan(&spec(Some("timeslice")), &a, &inv(), &cfg(&[], "/p")).unwrap_err();
        assert_eq!(e.key, ANN_SHARING);
        let mig = alloc(&[(DeviceRef::Mig { gpu: 0, mig: 0 }, "MIG-a", None, None)]);
        let e = plan(&spec(Some("mps")), &mig, &inv(), &cfg(&[], "/p")).unwrap_err();
        assert!(e.why.contains("MIG"), "{e}");
        let two = alloc(&[(G0, "GPU-a", None, None), (G1, "GPU-b", None, None)]);
        let e = plan(&spec(Some("mps")), &two, &inv(), &cfg(&[], "/p/{index}")).unwrap_err();
        assert!(e.why.contains("another MPS daemon"), "{e}");
    }

    #[test]
    fn absent_daemon_is_refused_before_anything_runs() {
        let d = tempfile::tempdir().unwrap();
        let a = alloc(&[(G0, "GPU-a", None, None)]);
        let c = cfg(&["all"], &d.path().display().to_string());
        let mut m = plan(&spec(None), &a, &inv(), &c).unwrap().unwrap();
        let e = probe(&c, &mut m).unwrap_err();
        assert!(
            e.to_string().contains("no MPS control daemon is running"),
            "{e}"
        );
        assert!(e.to_string().contains("control does not exist"), "{e}");
    }
}
