//! The share of a DRA device a claim holds (KEP-5075 consumable capacity): kubelet's state marks
//! the device shared (`ShareID`) but does not record how much was consumed, so the share is read
//! from the CDI device the driver prepared for the claim — a root-owned spec file in the
//! engine's CDI directories ([`crate::cdi::parse::load_spec_dirs`]), never the container's env.
//!
//! Two ways a driver can write it, read in this order (both present must agree):
//! * **gpufence's contract** (any DRA driver): CDI annotations `gpufence.dev/memory` (a
//!   Kubernetes quantity) and `gpufence.dev/cores` (percent, 1–100) on the device, else on the
//!   spec (CDI ≥ 0.6.0);
//! * **HAMi's DRA driver**: the device's (else the spec's) env `CUDA_DEVICE_MEMORY_LIMIT_<i>`
//!   (or `CUDA_DEVICE_MEMORY_LIMIT`; `4096m`, `4g`, bytes) and `CUDA_DEVICE_SM_LIMIT` (percent; 0 =
//!   none), exactly one memory limit per CDI device.
//!
//! Pure: [`read`] takes the spec and the device found for the claim's CDI id.

use crate::cdi::{Device, LoadedSpec};

/// gpufence's CDI annotation for a device's memory share.
pub const ANN_MEMORY: &str = "gpufence.dev/memory";
/// gpufence's CDI annotation for a device's compute share.
pub const ANN_CORES: &str = "gpufence.dev/cores";
/// HAMi's per-device memory limit (`<prefix><i>`), and its all-devices form.
pub const HAMI_MEMORY_PREFIX: &str = "CUDA_DEVICE_MEMORY_LIMIT_";
pub const HAMI_MEMORY: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// HAMi's compute limit (percent).
pub const HAMI_CORES: &str = "CUDA_DEVICE_SM_LIMIT";

/// The share a driver wrote for one CDI device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Share {
    /// Bytes; `None`: the driver limits no memory.
    pub memory: Option<u64>,
    /// Percent 1–100; `None`: no compute limit.
    pub cores: Option<u8>,
    /// Where it was read (`<spec file>: <key>`), for messages.
    pub source: String,
}

impl Share {
    pub fn is_empty(&self) -> bool {
        self.memory.is_none() && self.cores.is_none()
    }

    /// `8 GiB`, `8 GiB, 50% compute`, `50% compute`.
    pub fn shown(&self) -> String {
        let mut parts = Vec::new();
        if let Some(m) = self.memory {
            parts.push(human_bytes(m));
        }
        if let Some(c) = self.cores {
            parts.push(format!("{c}% compute"));
        }
        parts.join(", ")
    }
}

/// `8Gi` → `8 GiB` (as `gpufence plan` names a share).
pub fn human_bytes(b: u64) -> String {
    let s = crate::quantity::format_bytes(b);
    match s.strip_suffix('i') {
        Some(num) if num.len() > 1 => {
            let (n, unit) = num.split_at(num.len() - 1);
            format!("{n} {unit}iB")
        }
        _ => format!("{s} B"),
    }
}

/// One source's reading: memory and cores, with the keys they came from.
#[derive(Default)]
struct Reading {
    memory: Option<(u64, String)>,
    cores: Option<(u8, String)>,
}

/// The share the driver wrote for `dev` of `spec` (`Ok(None)`: it wrote none), or why what it
/// wrote cannot be read.
pub fn read(spec: &LoadedSpec, dev: &Device) -> Result<Option<Share>, String> {
    let path = spec.path.display().to_string();
    let contract = annotations(spec, dev)?;
    let hami = hami_env(spec, dev)?;
    let pick = |what: &str,
                a: Option<(u64, String)>,
                b: Option<(u64, String)>|
     -> Result<Option<(u64, String)>, String> {
        match (a, b) {
            (Some(x), Some(y)) if x.0 != y.0 => Err(format!(
                "{path}: {} and {} give device {} different {what} shares",
                x.1, y.1, dev.name
            )),
            (a, b) => Ok(a.or(b)),
        }
    };
    let memory = pick("memory", contract.memory, hami.memory)?;
    let cores = pick(
        "compute",
        contract.cores.map(|(c, k)| (u64::from(c), k)),
        hami.cores.map(|(c, k)| (u64::from(c), k)),
    )?;
    if memory.is_none() && cores.is_none() {
        return Ok(None);
    }
    let keys: Vec<&str> = memory
        .iter()
        .map(|m| m.1.as_str())
        .chain(cores.iter().map(|c| c.1.as_str()))
        .collect();
    let source = format!("{path}: {}", keys.join(", "));
    Ok(Some(Share {
        memory: memory.as_ref().map(|m| m.0),
        cores: cores.as_ref().and_then(|c| u8::try_from(c.0).ok()),
        source,
    }))
}

/// gpufence's annotations: the device's, else the spec's.
fn annotations(spec: &LoadedSpec, dev: &Device) -> Result<Reading, String> {
    let path = spec.path.display();
    let get = |key: &str| {
        dev.annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(|v| (v, format!("device {} annotation {key}", dev.name)))
            .or_else(|| {
                spec.spec
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(key))
                    .map(|v| (v, format!("spec annotation {key}")))
            })
    };
    let mut out = Reading::default();
    if let Some((v, at)) = get(ANN_MEMORY) {
        let b = crate::quantity::parse_k8s_bytes(v)
            .map_err(|e| format!("{path}: {at}={:?}: {e}", crate::text::short(v)))?;
        if b == 0 {
            return Err(format!("{path}: {at}={v:?}: a share of no memory"));
        }
        out.memory = Some((b, at));
    }
    if let Some((v, at)) = get(ANN_CORES) {
        let c = percent(v).filter(|c| *c >= 1).ok_or_else(|| {
            format!(
                "{path}: {at}={:?}: not a percent 1-100",
                crate::text::short(v)
            )
        })?;
        out.cores = Some((c, at));
    }
    Ok(out)
}

/// HAMi's env: the device's edits, else the spec's common edits.
fn hami_env(spec: &LoadedSpec, dev: &Device) -> Result<Reading, String> {
    let path = spec.path.display();
    let env_of = |edits: &crate::cdi::ContainerEdits| -> Vec<(String, String)> {
        edits
            .env
            .iter()
            .filter_map(|e| e.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let device_env = env_of(&dev.container_edits);
    let common_env = env_of(&spec.spec.container_edits);
    let is_memory = |k: &str| {
        k == HAMI_MEMORY
            || k.strip_prefix(HAMI_MEMORY_PREFIX)
                .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
    };
    let mut out = Reading::default();
    for env in [&device_env, &common_env] {
        let limits: Vec<&(String, String)> = env.iter().filter(|(k, _)| is_memory(k)).collect();
        if out.memory.is_none() && !limits.is_empty() {
            let distinct: std::collections::BTreeSet<&str> =
                limits.iter().map(|(_, v)| v.as_str()).collect();
            if distinct.len() > 1 {
                return Err(format!(
                    "{path}: device {}: {} memory limits for one device ({})",
                    dev.name,
                    limits.len(),
                    limits
                        .iter()
                        .map(|(k, _)| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            let (k, v) = limits[0];
            let b = crate::quantity::parse_hami_bytes(v)
                .map_err(|e| format!("{path}: {k}={:?}: {e}", crate::text::short(v)))?;
            if b > 0 {
                out.memory = Some((b, format!("env {k}")));
            }
        }
        if out.cores.is_none()
            && let Some((k, v)) = env.iter().find(|(k, _)| k == HAMI_CORES)
        {
            let c = percent(v).ok_or_else(|| {
                format!(
                    "{path}: {k}={:?}: not a percent 0-100",
                    crate::text::short(v)
                )
            })?;
            if c > 0 && c < 100 {
                out.cores = Some((c, format!("env {k}")));
            }
        }
    }
    Ok(out)
}

/// `0`–`100` (no sign, no fraction).
fn percent(v: &str) -> Option<u8> {
    let v = v.trim();
    if v.is_empty() || v.len() > 3 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<u8>().ok().filter(|c| *c <= 100)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn spec(dev_ann: &[(&str, &str)], env: &[&str], common_env: &[&str]) -> (LoadedSpec, Device) {
        let ann = |kv: &[(&str, &str)]| -> Option<BTreeMap<String, String>> {
            (!kv.is_empty()).then(|| {
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
        };
        let dev = Device {
            name: "claim-gpu-1".into(),
            annotations: ann(dev_ann),
            container_edits: crate::cdi::ContainerEdits {
                env: env.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
        };
        let s = LoadedSpec {
            path: "/var/run/cdi/drv-claim.json".into(),
            priority: 1,
            spec: crate::cdi::Spec {
                cdi_version: "0.6.0".into(),
                kind: "example.com/gpu".into(),
                annotations: None,
                devices: vec![dev.clone()],
                container_edits: crate::cdi::ContainerEdits {
                    env: common_env.iter().map(|s| s.to_string()).collect(),
                    ..Default::default()
                },
            },
        };
        (s, dev)
    }

    #[test]
    fn gpufence_contract_and_hami_env() {
        let (s, d) = spec(
            &[("gpufence.dev/memory", "8Gi"), ("gpufence.dev/cores", "50")],
            &[],
            &[],
        );
        let sh = read(&s, &d).unwrap().unwrap();
        assert_eq!((sh.memory, sh.cores), (Some(8 << 30), Some(50)));
        assert_eq!(sh.shown(), "8 GiB, 50% compute");
        assert!(
            sh.source
                .contains("device claim-gpu-1 annotation gpufence.dev/memory"),
            "{}",
            sh.source
        );

        let (s, d) = spec(
            &[],
            &[
                "CUDA_DEVICE_MEMORY_LIMIT_0=4096m",
                "CUDA_DEVICE_SM_LIMIT=30",
            ],
            &[],
        );
        let sh = read(&s, &d).unwrap().unwrap();
        assert_eq!((sh.memory, sh.cores), (Some(4 << 30), Some(30)));
        // The spec's common env, where the device has none.
        let (s, d) = spec(&[], &[], &["CUDA_DEVICE_MEMORY_LIMIT=2g"]);
        assert_eq!(read(&s, &d).unwrap().unwrap().memory, Some(2 << 30));
        // Both, agreeing; HAMi's 0 / 100 mean no compute limit.
        let (s, d) = spec(
            &[("gpufence.dev/memory", "4Gi")],
            &["CUDA_DEVICE_MEMORY_LIMIT_0=4g", "CUDA_DEVICE_SM_LIMIT=0"],
            &[],
        );
        let sh = read(&s, &d).unwrap().unwrap();
        assert_eq!((sh.memory, sh.cores), (Some(4 << 30), None));
        // Nothing written.
        let (s, d) = spec(&[], &["OTHER=1"], &[]);
        assert_eq!(read(&s, &d).unwrap(), None);
    }

    #[test]
    fn unreadable_shares_are_errors() {
        for (ann, env) in [
            (vec![("gpufence.dev/memory", "lots")], vec![]),
            (vec![("gpufence.dev/memory", "0")], vec![]),
            (vec![("gpufence.dev/cores", "0")], vec![]),
            (vec![("gpufence.dev/cores", "101")], vec![]),
            (vec![], vec!["CUDA_DEVICE_MEMORY_LIMIT_0=4x"]),
            (
                vec![],
                vec![
                    "CUDA_DEVICE_MEMORY_LIMIT_0=4g",
                    "CUDA_DEVICE_MEMORY_LIMIT_1=8g",
                ],
            ),
            (vec![], vec!["CUDA_DEVICE_SM_LIMIT=-1"]),
            (
                vec![("gpufence.dev/memory", "8Gi")],
                vec!["CUDA_DEVICE_MEMORY_LIMIT_0=4g"],
            ),
        ] {
            let (s, d) = spec(&ann, &env, &[]);
            let e = read(&s, &d).unwrap_err();
            assert!(e.starts_with("/var/run/cdi/drv-claim.json: "), "{e}");
        }
    }

    #[test]
    fn human_bytes_reads_as_the_plan_shows_it() {
        assert_eq!(human_bytes(8 << 30), "8 GiB");
        assert_eq!(human_bytes(512 << 20), "512 MiB");
        assert_eq!(human_bytes(1000), "1000 B");
    }
}
