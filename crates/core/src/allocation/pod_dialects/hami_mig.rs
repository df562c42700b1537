//! HAMi v2.10's dynamic MIG reservations, `hami.io/vgpu-mig-allocations`
//! (`pkg/device/nvidia/mig_allocations.go`): a JSON list, one entry per MIG device of the pod,
//!
//! ```json
//! [{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-…","profile":"2g.10gb",
//!   "placement":{"start":2,"size":2},"migUUID":"MIG-…","gpuInstanceID":4,"computeInstanceID":0}]
//! ```
//!
//! HAMi's scheduler writes the reservation (container and device index into
//! `hami.io/vgpu-devices-allocated`, which names the parent GPU there, the profile, the
//! placement); its device plugin creates the GPU and compute instance at Allocate and adds their
//! runtime identity (the MIG UUID, GI and CI ids — all three or none). Here each reserved device
//! of `hami.io/vgpu-devices-allocated` becomes the MIG device the reservation names, so the
//! container is fenced to that MIG device (its caps, its UUID) and nothing else of the GPU; as
//! every grant it must be within kubelet's record (the device plugin's `NVIDIA_VISIBLE_DEVICES`,
//! the MIG UUIDs) under `"kubelet"`.
//!
//! A reservation without runtime identity (kubelet may create the container before the device
//! plugin's annotation update reaches it) names the MIG device kubelet recorded for this
//! container on that GPU with that profile — exactly one, or it is refused.

use super::super::short;
use crate::inventory::Inventory;

pub const MIG_ALLOCATIONS: &str = "hami.io/vgpu-mig-allocations";
/// Most reservations read (containers × devices).
const MAX_ENTRIES: usize = 1024;
/// Longest value read.
const MAX_LEN: usize = 256 * 1024;
/// Fields of one reservation, and of its placement.
const FIELDS: [&str; 8] = [
    "containerIndex",
    "deviceIndex",
    "gpuUUID",
    "profile",
    "placement",
    "migUUID",
    "gpuInstanceID",
    "computeInstanceID",
];
const PLACEMENT_FIELDS: [&str; 2] = ["start", "size"];

/// What the device plugin adds once the instance exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigRuntime {
    pub mig_uuid: String,
    pub gpu_instance: u32,
    pub compute_instance: u32,
}

/// One reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigReservation {
    /// Index into the containers of `hami.io/vgpu-devices-allocated` (init containers first).
    pub container: usize,
    /// Index into that container's devices.
    pub device: usize,
    pub gpu_uuid: String,
    pub profile: String,
    /// `placement.start`, `placement.size` (size ≥ 1).
    pub placement: (u32, u32),
    pub runtime: Option<MigRuntime>,
}

/// The reservations, strictly: every field typed, none unknown, runtime identity whole or
/// absent, no (container, device) twice — as HAMi's `DecodeMigAllocations` checks, and stricter.
pub fn parse(value: &str) -> Result<Vec<MigReservation>, String> {
    if value.len() > MAX_LEN {
        return Err(format!("longer than {MAX_LEN} bytes"));
    }
    let v: serde_json::Value = serde_json::from_str(value).map_err(|e| format!("not JSON: {e}"))?;
    let list = match v {
        serde_json::Value::Null => return Ok(Vec::new()),
        serde_json::Value::Array(l) => l,
        _ => return Err("not a JSON list of MIG reservations".to_string()),
    };
    if list.len() > MAX_ENTRIES {
        return Err(format!("more than {MAX_ENTRIES} reservations"));
    }
    let mut out: Vec<MigReservation> = Vec::with_capacity(list.len());
    for (i, e) in list.iter().enumerate() {
        let r = reservation(e).map_err(|why| format!("reservation {i}: {why}"))?;
        if out
            .iter()
            .any(|p| (p.container, p.device) == (r.container, r.device))
        {
            return Err(format!(
                "reservation {i}: container {} device {} reserved twice",
                r.container, r.device
            ));
        }
        out.push(r);
    }
    Ok(out)
}

fn object<'a>(
    v: &'a serde_json::Value,
    known: &[&str],
) -> Result<&'a serde_json::Map<String, serde_json::Value>, String> {
    let serde_json::Value::Object(m) = v else {
        return Err("not an object".to_string());
    };
    if let Some(k) = m.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(format!("unknown field {:?}", short(k)));
    }
    Ok(m)
}

fn uint(m: &serde_json::Map<String, serde_json::Value>, k: &str) -> Result<Option<u32>, String> {
    match m.get(k) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| format!("{k} is not a whole number")),
    }
}

fn text<'a>(m: &'a serde_json::Map<String, serde_json::Value>, k: &str) -> Result<&'a str, String> {
    match m.get(k) {
        None | Some(serde_json::Value::Null) => Ok(""),
        Some(serde_json::Value::String(s)) => Ok(s),
        Some(_) => Err(format!("{k} is not a string")),
    }
}

fn reservation(e: &serde_json::Value) -> Result<MigReservation, String> {
    let m = object(e, &FIELDS)?;
    let index = |k: &str| -> Result<usize, String> {
        uint(m, k)?
            .map(|n| n as usize)
            .ok_or_else(|| format!("no {k}"))
    };
    let (container, device) = (index("containerIndex")?, index("deviceIndex")?);
    let gpu_uuid = text(m, "gpuUUID")?;
    if !gpu_uuid
        .get(..4)
        .is_some_and(|p| p.eq_ignore_ascii_case("GPU-"))
    {
        return Err(format!("gpuUUID {:?} is not a GPU UUID", short(gpu_uuid)));
    }
    let profile = text(m, "profile")?;
    if profile.is_empty() || profile.len() > 64 || profile.bytes().any(|b| b.is_ascii_control()) {
        return Err(format!("profile {:?}", short(profile)));
    }
    let p = object(m.get("placement").ok_or("no placement")?, &PLACEMENT_FIELDS)
        .map_err(|why| format!("placement: {why}"))?;
    let start = uint(p, "start")?.unwrap_or(0);
    let size = uint(p, "size")?
        .filter(|s| *s > 0)
        .ok_or("placement size 0")?;
    let mig_uuid = text(m, "migUUID")?;
    let gi = uint(m, "gpuInstanceID")?;
    let ci = uint(m, "computeInstanceID")?;
    let runtime = match (mig_uuid.is_empty(), gi, ci) {
        (true, None, None) => None,
        (false, Some(gpu_instance), Some(compute_instance)) => {
            if !mig_uuid
                .get(..4)
                .is_some_and(|p| p.eq_ignore_ascii_case("MIG-"))
            {
                return Err(format!("migUUID {:?} is not a MIG UUID", short(mig_uuid)));
            }
            Some(MigRuntime {
                mig_uuid: mig_uuid.to_string(),
                gpu_instance,
                compute_instance,
            })
        }
        _ => {
            return Err(
                "partial runtime identity (migUUID, gpuInstanceID, computeInstanceID)".into(),
            );
        }
    };
    Ok(MigReservation {
        container,
        device,
        gpu_uuid: gpu_uuid.to_string(),
        profile: profile.to_string(),
        placement: (start, size),
        runtime,
    })
}

/// The UUID of the MIG device `r` names on this node. `recorded`: the device tokens kubelet
/// recorded for this container (its `NVIDIA_VISIBLE_DEVICES`), for a reservation without runtime
/// identity.
pub fn resolve(r: &MigReservation, inv: &Inventory, recorded: &[&str]) -> Result<String, String> {
    let gpu = inv
        .gpu_by_uuid(&r.gpu_uuid)
        .ok_or_else(|| format!("no GPU with UUID {} on this node", short(&r.gpu_uuid)))?;
    if !gpu.mig_enabled {
        return Err(format!("GPU {} has MIG disabled", gpu.index));
    }
    let profile_ok = |p: &str| p.is_empty() || p == r.profile;
    match &r.runtime {
        Some(rt) => {
            let m = gpu
                .mig_devices
                .iter()
                .find(|m| m.uuid.eq_ignore_ascii_case(&rt.mig_uuid))
                .ok_or_else(|| {
                    format!(
                        "{} is not a MIG device of GPU {} on this node",
                        short(&rt.mig_uuid),
                        gpu.index
                    )
                })?;
            if (m.gi, m.ci) != (rt.gpu_instance, rt.compute_instance) || !profile_ok(&m.profile) {
                return Err(format!(
                    "{} is {} GPU instance {} compute instance {} on this node, not {} {}/{}",
                    m.uuid, m.profile, m.gi, m.ci, r.profile, rt.gpu_instance, rt.compute_instance
                ));
            }
            Ok(m.uuid.clone())
        }
        None => {
            let found: Vec<&str> = gpu
                .mig_devices
                .iter()
                .filter(|m| profile_ok(&m.profile))
                .filter(|m| recorded.iter().any(|t| t.eq_ignore_ascii_case(&m.uuid)))
                .map(|m| m.uuid.as_str())
                .collect();
            match found[..] {
                [one] => Ok(one.to_string()),
                [] => Err(format!(
                    "has no runtime identity yet (migUUID, gpuInstanceID, computeInstanceID: \
                     HAMi's device plugin writes them at Allocate) and kubelet's record of this \
                     container names no {} MIG device of GPU {}",
                    r.profile, gpu.index
                )),
                _ => Err(format!(
                    "has no runtime identity yet and kubelet's record names several {} MIG \
                     devices of GPU {}",
                    r.profile, gpu.index
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hamis_reservations_with_and_without_runtime_identity() {
        let v = r#"[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",
            "placement":{"start":2,"size":2},"migUUID":"MIG-b","gpuInstanceID":4,
            "computeInstanceID":0},
            {"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",
            "placement":{"start":0,"size":1}}]"#;
        let r = parse(v).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0].runtime,
            Some(MigRuntime {
                mig_uuid: "MIG-b".into(),
                gpu_instance: 4,
                compute_instance: 0
            })
        );
        assert_eq!(
            (r[1].container, r[1].placement, r[1].runtime.is_none()),
            (1, (0, 1), true)
        );
        assert!(parse("[]").unwrap().is_empty());
        assert!(parse("null").unwrap().is_empty());
    }

    #[test]
    fn refuses_what_hami_refuses_and_more() {
        let ok = r#""containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":0,"size":1}"#;
        let one = |fields: String| format!("[{{{fields}}}]");
        for bad in [
            "{}".to_string(),
            "[1]".to_string(),
            format!("[{{{ok}}},{{{ok}}}]"),
            one(format!(r#"{ok},"migUUID":"MIG-b""#)),
            one(format!(r#"{ok},"migUUID":"MIG-b","gpuInstanceID":1"#)),
            one(format!(
                r#"{ok},"migUUID":"GPU-b","gpuInstanceID":1,"computeInstanceID":0"#
            )),
            one(format!(r#"{ok},"extra":1"#)),
            one(ok.replace(r#""size":1"#, r#""size":0"#)),
            one(ok.replace("GPU-a", "MIG-a")),
            one(ok.replace(r#""profile":"1g.5gb","#, "")),
            one(ok.replace(r#""containerIndex":0"#, r#""containerIndex":-1"#)),
            one(ok.replace(r#"{"start":0,"size":1}"#, r#"{"start":0,"size":1,"x":2}"#)),
        ] {
            assert!(parse(&bad).is_err(), "{bad}");
        }
    }
}
