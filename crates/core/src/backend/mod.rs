//! Where each device's memory quota is enforced: in every process by the preloaded shim, by the
//! driver (NVML R615 memory limits on the container's cgroup, `nvmlDeviceSetMemoryLimits_v1`), or
//! both. The driver backend holds every process of the container, including one that escaped the
//! preload (a static binary, a custom loader, `LD_PRELOAD` cleared before exec).
//!
//! Data flow: the inventory records what the node supports ([`DriverSupport`], taken once with
//! NVML and cached); [`decide`] (pure) picks a backend per device from `quota.backend`; the plan
//! carries the decision and, for driver devices, a createRuntime hook (`gpufence hook
//! memory-limits`) that applies the limits once runc has created the container's cgroup
//! ([`crate::driverlimits`]); `gpufence-runtime delete` and the poststop hook clear them.

use serde::{Deserialize, Serialize};

use crate::allocation::{AllocatedDevice, Allocation, AllocationError, DeviceRef};
use crate::config::{Config, QuotaBackend};
use crate::inventory::Inventory;

pub use crate::inventory::limits::{CgroupMode, DriverSupport};

/// The backend of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// No memory quota on this device: nothing to enforce.
    None,
    Shim,
    Driver,
    Both,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::None => "none",
            Backend::Shim => "shim",
            Backend::Driver => "driver",
            Backend::Both => "both",
        }
    }
    pub fn uses_driver(self) -> bool {
        matches!(self, Backend::Driver | Backend::Both)
    }
    pub fn uses_shim(self) -> bool {
        matches!(self, Backend::Shim | Backend::Both)
    }
}

/// The decision for one device (container ordinal `i`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceBackend {
    pub ordinal: u32,
    pub uuid: String,
    pub backend: Backend,
    /// Why (the configured value and what the node supports).
    pub why: String,
}

/// One driver limit the createRuntime hook sets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DriverLimit {
    /// `GPU-…` of the physical GPU.
    pub uuid: String,
    /// Hard limit in bytes (the soft limit is left at 0: no guarantee is promised).
    pub hard: u64,
}

/// The plan's `isolation` statement when the driver enforces a memory quota of the container.
pub const DRIVER_ISOLATION: &str = "the driver enforces the memory quota of every device whose \
    backend is driver or both on the container's cgroup, for every process of the container \
    (including one that bypasses the preloaded shim); devices left to the shim are held only \
    against mistakes and honest overuse";

/// Why the driver cannot enforce a quota on this device (`None`: it can).
fn driver_unsupported(d: &AllocatedDevice, inv: &Inventory, forced: bool) -> Option<String> {
    if matches!(d.device, DeviceRef::Mig { .. }) {
        return Some("a MIG device (NVML memory limits do not apply to MIG)".into());
    }
    let s = &inv.memory_limits;
    if !s.nvml_exports {
        return Some(
            "the node's NVML has no nvmlDeviceSetMemoryLimits_v1 (driver older than R615)".into(),
        );
    }
    if !s.gpus.iter().any(|u| u.eq_ignore_ascii_case(&d.uuid)) {
        return Some("NVML does not accept memory limits for this GPU".into());
    }
    match (s.cgroup, forced) {
        (CgroupMode::Unified, _) | (CgroupMode::Hybrid, true) => None,
        (CgroupMode::Hybrid, false) => Some(
            "cgroup v1 hybrid host (auto needs cgroup v2 at /sys/fs/cgroup; driver or both use the unified hierarchy)"
                .into(),
        ),
        (m, _) => Some(format!("no cgroup v2 hierarchy ({})", m.name())),
    }
}

/// The backend of every device, from `quota.backend` and what the inventory says the node
/// supports. Pure. `driver` or `both` on a device the driver cannot hold is an error (fail
/// closed), naming the device and why.
pub fn decide(
    alloc: &Allocation,
    inv: &Inventory,
    cfg: &Config,
) -> Result<Vec<DeviceBackend>, AllocationError> {
    let configured = cfg.quota.backend;
    let mut out = Vec::with_capacity(alloc.devices.len());
    for (i, d) in alloc.devices.iter().enumerate() {
        let (backend, why) = if d.memory_limit.is_none() {
            (Backend::None, "no memory quota".to_string())
        } else {
            match configured {
                QuotaBackend::Shim => (Backend::Shim, "quota.backend = shim".to_string()),
                QuotaBackend::Auto => match driver_unsupported(d, inv, false) {
                    None => (
                        Backend::Driver,
                        "quota.backend = auto: NVML memory limits on cgroup v2".to_string(),
                    ),
                    Some(why) => (Backend::Shim, format!("quota.backend = auto: {why}")),
                },
                QuotaBackend::Driver | QuotaBackend::Both => {
                    if let Some(why) = driver_unsupported(d, inv, true) {
                        return Err(AllocationError::new(
                            "quota.backend",
                            configured.name(),
                            format!(
                                "device {i} ({}): the driver cannot enforce its memory quota: {why}",
                                d.uuid
                            ),
                        ));
                    }
                    let b = if configured == QuotaBackend::Both {
                        Backend::Both
                    } else {
                        Backend::Driver
                    };
                    (b, format!("quota.backend = {}", configured.name()))
                }
            }
        };
        out.push(DeviceBackend {
            ordinal: i as u32,
            uuid: d.uuid.clone(),
            backend,
            why,
        });
    }
    Ok(out)
}

/// The limits the driver enforces, one per device whose backend uses the driver.
pub fn driver_limits(alloc: &Allocation, backends: &[DeviceBackend]) -> Vec<DriverLimit> {
    alloc
        .devices
        .iter()
        .zip(backends)
        .filter(|(_, b)| b.backend.uses_driver())
        .filter_map(|(d, _)| {
            d.memory_limit.map(|hard| DriverLimit {
                uuid: d.uuid.clone(),
                hard,
            })
        })
        .collect()
}

/// Leave to the driver alone what it alone enforces: the shim's quota keeps no memory limit for
/// a `driver` device (it still carries the device and its compute share).
pub fn shim_quota(quota: &mut crate::quota::Quota, backends: &[DeviceBackend]) {
    for (q, b) in quota.devices.iter_mut().zip(backends) {
        if b.backend == Backend::Driver {
            q.memory = None;
        }
    }
}

/// The createRuntime hook that sets the driver limits once runc has made the container's
/// cgroup: `gpufence hook memory-limits --limit <uuid>=<bytes>…` with an explicit env.
pub fn limits_hook(cfg: &Config, limits: &[DriverLimit]) -> crate::cdi::HookEdit {
    let mut args = vec!["gpufence".to_string()];
    if let Some(src) = &cfg.source {
        args.push("--config".to_string());
        args.push(src.display().to_string());
    }
    args.extend(["hook".to_string(), "memory-limits".to_string()]);
    for l in limits {
        args.push("--limit".to_string());
        args.push(format!("{}={}", l.uuid, l.hard));
    }
    crate::cdi::HookEdit {
        hook_name: "createRuntime".to_string(),
        path: cfg.gpufence_binary.display().to_string(),
        args,
        env: vec!["PATH=/usr/sbin:/usr/bin:/sbin:/bin".to_string()],
        timeout: Some(10),
    }
}

/// Parse one `--limit <uuid>=<bytes>` argument of the hook.
pub fn parse_limit(arg: &str) -> Result<DriverLimit, String> {
    let (uuid, bytes) = arg
        .split_once('=')
        .ok_or_else(|| format!("--limit {arg:?}: expected <GPU-uuid>=<bytes>"))?;
    let ok_uuid = uuid.len() <= 64
        && uuid.starts_with("GPU-")
        && uuid[4..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !ok_uuid || uuid.len() == 4 {
        return Err(format!("--limit {arg:?}: not a GPU-<uuid>"));
    }
    let hard: u64 = bytes
        .parse()
        .ok()
        .filter(|b| *b > 0 && bytes.bytes().all(|c| c.is_ascii_digit()))
        .ok_or_else(|| format!("--limit {arg:?}: not a positive number of bytes"))?;
    Ok(DriverLimit {
        uuid: uuid.to_string(),
        hard,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::allocation::AllocatedDevice;

    pub(crate) fn alloc(devs: &[(DeviceRef, &str, Option<u64>, Option<u8>)]) -> Allocation {
        Allocation {
            dialects: vec![crate::config::Dialect::Gpufence],
            devices: devs
                .iter()
                .map(|(d, u, m, c)| AllocatedDevice {
                    device: *d,
                    uuid: u.to_string(),
                    memory_limit: *m,
                    cores: *c,
                    backing: Default::default(),
                    replica: None,
                })
                .collect(),
            oversubscribe: false,
            capabilities: vec![],
            foreign_cdi: vec![],
            sources: vec![],
            cores_burst: false,
        }
    }

    fn inv(cgroup: CgroupMode, gpus: &[&str]) -> Inventory {
        Inventory {
            driver_version: "615.1".into(),
            cuda_driver_version: 13040,
            gpus: vec![],
            control_nodes: vec![],
            driver_files: vec![],
            memory_limits: DriverSupport {
                cgroup,
                nvml_exports: true,
                gpus: gpus.iter().map(|s| s.to_string()).collect(),
            },
        }
    }

    fn cfg(b: QuotaBackend) -> Config {
        let mut c = Config::default();
        c.quota.backend = b;
        c
    }

    const G0: DeviceRef = DeviceRef::Gpu { index: 0 };
    const M0: DeviceRef = DeviceRef::Mig { gpu: 0, mig: 0 };

    #[test]
    fn auto_picks_driver_only_on_cgroup_v2_with_nvml_support() {
        let a = alloc(&[
            (G0, "GPU-a", Some(1 << 30), None),
            (DeviceRef::Gpu { index: 1 }, "GPU-b", Some(1 << 30), None),
        ]);
        let b = decide(
            &a,
            &inv(CgroupMode::Unified, &["GPU-a"]),
            &cfg(QuotaBackend::Auto),
        )
        .unwrap();
        assert_eq!(b[0].backend, Backend::Driver);
        assert_eq!(b[1].backend, Backend::Shim);
        assert!(b[1].why.contains("does not accept"), "{}", b[1].why);
        let b = decide(
            &a,
            &inv(CgroupMode::Hybrid, &["GPU-a", "GPU-b"]),
            &cfg(QuotaBackend::Auto),
        )
        .unwrap();
        assert!(b.iter().all(|d| d.backend == Backend::Shim), "{b:?}");
        assert!(b[0].why.contains("hybrid"));
        let mut i = inv(CgroupMode::Unified, &["GPU-a"]);
        i.memory_limits.nvml_exports = false;
        assert_eq!(
            decide(&a, &i, &cfg(QuotaBackend::Auto)).unwrap()[0].backend,
            Backend::Shim
        );
        let none = alloc(&[(G0, "GPU-a", None, Some(50))]);
        assert_eq!(
            decide(&none, &i, &cfg(QuotaBackend::Driver)).unwrap()[0].backend,
            Backend::None
        );
    }

    #[test]
    fn forced_driver_uses_the_unified_hierarchy_of_a_hybrid_host_and_refuses_what_it_cannot_hold() {
        let a = alloc(&[(G0, "GPU-a", Some(1 << 30), None)]);
        let i = inv(CgroupMode::Hybrid, &["GPU-a"]);
        assert_eq!(
            decide(&a, &i, &cfg(QuotaBackend::Driver)).unwrap()[0].backend,
            Backend::Driver
        );
        assert_eq!(
            decide(&a, &i, &cfg(QuotaBackend::Both)).unwrap()[0].backend,
            Backend::Both
        );
        let e = decide(
            &a,
            &inv(CgroupMode::Legacy, &["GPU-a"]),
            &cfg(QuotaBackend::Driver),
        )
        .unwrap_err();
        assert_eq!(e.key, "quota.backend");
        assert!(e.why.contains("cgroup v2"), "{e}");
        let e = decide(&a, &inv(CgroupMode::Unified, &[]), &cfg(QuotaBackend::Both)).unwrap_err();
        assert!(e.why.contains("GPU-a"), "{e}");
        let mig = alloc(&[(M0, "MIG-x", Some(1 << 30), None)]);
        let e = decide(
            &mig,
            &inv(CgroupMode::Unified, &["MIG-x"]),
            &cfg(QuotaBackend::Driver),
        )
        .unwrap_err();
        assert!(e.why.contains("MIG"), "{e}");
        assert_eq!(
            decide(
                &mig,
                &inv(CgroupMode::Unified, &["MIG-x"]),
                &cfg(QuotaBackend::Auto)
            )
            .unwrap()[0]
                .backend,
            Backend::Shim
        );
        assert_eq!(
            decide(&a, &i, &cfg(QuotaBackend::Shim)).unwrap()[0].backend,
            Backend::Shim
        );
    }

    #[test]
    fn driver_only_devices_leave_the_shim_no_memory_limit() {
        let a = alloc(&[
            (G0, "GPU-a", Some(100), Some(30)),
            (DeviceRef::Gpu { index: 1 }, "GPU-b", Some(200), None),
        ]);
        let i = inv(CgroupMode::Unified, &["GPU-a", "GPU-b"]);
        for (b, shim_mem) in [
            (QuotaBackend::Driver, None),
            (QuotaBackend::Both, Some(100)),
            (QuotaBackend::Shim, Some(100)),
        ] {
            let backends = decide(&a, &i, &cfg(b)).unwrap();
            let mut q = crate::quota::Quota {
                oversubscribe: false,
                cores_burst: false,
                quiet_refusals: false,
                devices: a
                    .devices
                    .iter()
                    .enumerate()
                    .map(|(n, d)| crate::quota::DeviceQuota {
                        ordinal: n as u32,
                        uuid: d.uuid.clone(),
                        memory: d.memory_limit,
                        cores: d.cores,
                    })
                    .collect(),
            };
            shim_quota(&mut q, &backends);
            assert_eq!(q.devices[0].memory, shim_mem, "{b:?}");
            assert_eq!(q.devices[0].cores, Some(30));
            let lim = driver_limits(&a, &backends);
            let want = if b == QuotaBackend::Shim { 0 } else { 2 };
            assert_eq!(lim.len(), want, "{b:?}");
        }
        let h = limits_hook(
            &Config::default(),
            &[DriverLimit {
                uuid: "GPU-a".into(),
                hard: 100,
            }],
        );
        assert_eq!(h.hook_name, "createRuntime");
        assert_eq!(
            h.args[1..],
            ["hook", "memory-limits", "--limit", "GPU-a=100"]
        );
    }

    #[test]
    fn limit_args() {
        let l = parse_limit("GPU-ab-12=4096").unwrap();
        assert_eq!((l.uuid.as_str(), l.hard), ("GPU-ab-12", 4096));
        for bad in [
            "GPU-a",
            "GPU-=1",
            "MIG-a=1",
            "GPU-a=0",
            "GPU-a=-1",
            "GPU-a=+1",
            "GPU-a/b=1",
            "GPU-a=1k",
            "",
        ] {
            assert!(parse_limit(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn limit_args_never_panic(s in ".{0,120}") {
            if let Ok(l) = parse_limit(&s) {
                let again = parse_limit(&format!("{}={}", l.uuid, l.hard));
                proptest::prop_assert_eq!(again, Ok(l));
            }
        }
    }
}
