//! HAMi's `hami.io/vgpu-devices-allocated` pod annotation, written by its scheduler extender at
//! bind time: one group per container of the pod (init containers first, then the others), each
//! terminated by `;`; in a group one `UUID,Type,MiB,cores` per device, each terminated by `:`
//! (`GPU-a,NVIDIA,3000,30:;;` — the first container 3000 MiB and 30 % of GPU-a, the second
//! nothing). cores `0` means no limit, as HAMi-core reads it.
//!
//! The annotation does not say which group is which container. A pod with one container has one
//! group; otherwise kubelet's record of this container (the env HAMi's device plugin returned
//! for it) picks the group, and without that record the container is refused rather than given
//! another container's slice.

use super::super::container_dialects::{Facet, Part};
use super::super::devices::resolve_list;
use super::super::input::Inputs;
use super::super::{AllocationError, short};
use super::hami_mig;
use super::number::parse_uint;
use crate::config::Dialect;
use crate::inventory::Inventory;
use crate::kubelet::{ContainerRecord, PodIdentity};

pub const ALLOCATED: &str = "hami.io/vgpu-devices-allocated";
/// Volcano vGPU's allocation, in HAMi's format.
pub const VOLCANO_ALLOCATED: &str = "volcano.sh/vgpu-ids-new";
/// Most containers (groups) and devices per container read.
const MAX_GROUPS: usize = 64;
const MAX_DEVICES: usize = 16;

/// One device of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub uuid: String,
    pub kind: String,
    pub memory_mib: u32,
    pub cores: u32,
}

/// The groups of the annotation, in container order.
pub fn parse(value: &str) -> Result<Vec<Vec<Device>>, String> {
    let v = value.strip_suffix(';').unwrap_or(value);
    let groups: Vec<&str> = v.split(';').collect();
    if groups.len() > MAX_GROUPS {
        return Err(format!("more than {MAX_GROUPS} containers"));
    }
    groups
        .iter()
        .map(|g| {
            if g.is_empty() {
                return Ok(Vec::new());
            }
            let g = g.strip_suffix(':').unwrap_or(g);
            let devs: Vec<&str> = g.split(':').collect();
            if devs.len() > MAX_DEVICES {
                return Err(format!("more than {MAX_DEVICES} devices for one container"));
            }
            devs.iter().map(|d| device(d)).collect()
        })
        .collect()
}

fn device(d: &str) -> Result<Device, String> {
    let f: Vec<&str> = d.split(',').collect();
    let [uuid, kind, mem, cores] = f[..] else {
        return Err(format!("{:?} is not UUID,type,memory-MiB,cores", short(d)));
    };
    let is_uuid = uuid
        .get(..4)
        .is_some_and(|p| p.eq_ignore_ascii_case("GPU-") || p.eq_ignore_ascii_case("MIG-"));
    if !is_uuid {
        return Err(format!("{:?} is not a GPU or MIG UUID", short(uuid)));
    }
    if kind.is_empty() || kind.bytes().any(|b| b.is_ascii_control()) {
        return Err(format!("device type {:?}", short(kind)));
    }
    let memory_mib = parse_uint(mem)
        .and_then(|m| u32::try_from(m).ok())
        .ok_or_else(|| format!("memory {:?} is not a whole number of MiB", short(mem)))?;
    let cores = parse_uint(cores)
        .and_then(|c| u32::try_from(c).ok())
        .filter(|c| *c <= 100)
        .ok_or_else(|| format!("cores {:?} is not a percentage 0–100", short(cores)))?;
    Ok(Device {
        uuid: uuid.to_string(),
        kind: kind.to_string(),
        memory_mib,
        cores,
    })
}

/// The group of this container: the one matching kubelet's record when there is one (a
/// container kubelet recorded no GPU for gets none, even from a single-group annotation — it
/// is the pod's other container's), else the only one.
fn select<'a>(
    groups: &'a [Vec<Device>],
    identity: Option<&PodIdentity>,
    record: Option<&ContainerRecord>,
) -> Result<Option<&'a Vec<Device>>, String> {
    if groups.len() == 1 {
        return match record {
            None => Ok(groups.first()),
            // The record's values are compared with the annotation's later (agree.rs).
            Some(r) => Ok(r
                .env()?
                .contains_key(super::super::container_dialects::NVIDIA_VISIBLE_DEVICES)
                .then(|| &groups[0])),
        };
    }
    let name = identity.map_or("this container", |i| i.container_name.as_str());
    let Some(record) = record else {
        return Err(format!(
            "describes {} containers, and which one is {name} needs kubelet's record of it \
             (allocation.trust-env = \"kubelet\")",
            groups.len()
        ));
    };
    let env = record.env()?;
    let Some((nvd, _)) = env.get(super::super::container_dialects::NVIDIA_VISIBLE_DEVICES) else {
        // kubelet recorded no GPU for this container: it is one of the empty groups.
        return Ok(None);
    };
    let uuids: Vec<&str> = nvd.split(',').map(str::trim).collect();
    let memory = |i: usize| {
        env.get(format!("{}_{i}", super::super::container_dialects::HAMI_MEMORY).as_str())
            .and_then(|(v, _)| crate::quantity::parse_hami_bytes(v).ok())
    };
    let matches: Vec<&Vec<Device>> = groups
        .iter()
        .filter(|g| {
            g.len() == uuids.len()
                && g.iter().enumerate().all(|(i, d)| {
                    d.uuid.eq_ignore_ascii_case(uuids[i])
                        && memory(i).is_none_or(|m| m == u64::from(d.memory_mib) << 20)
                })
        })
        .collect();
    match matches.first() {
        None => Err(format!(
            "no container entry matches what kubelet recorded for {name} \
             (NVIDIA_VISIBLE_DEVICES={:?})",
            short(nvd)
        )),
        Some(first) if matches.iter().all(|m| m == first) => Ok(Some(first)),
        Some(_) => Err(format!(
            "several container entries match what kubelet recorded for {name}"
        )),
    }
}

/// HAMi's annotation for this container.
pub fn read(
    inputs: &Inputs,
    inv: &Inventory,
    identity: Option<&PodIdentity>,
    record: Option<&ContainerRecord>,
) -> Result<Part, AllocationError> {
    read_key(inputs, inv, identity, record, ALLOCATED, Dialect::Hami)
}

/// Volcano vGPU's `volcano.sh/vgpu-ids-new` for this container: HAMi's format under Volcano's
/// prefix (its scheduler writes it; its device plugin, a fork of HAMi's, returns the same env).
pub fn read_volcano(
    inputs: &Inputs,
    inv: &Inventory,
    identity: Option<&PodIdentity>,
    record: Option<&ContainerRecord>,
) -> Result<Part, AllocationError> {
    read_key(
        inputs,
        inv,
        identity,
        record,
        VOLCANO_ALLOCATED,
        Dialect::Volcano,
    )
}

/// The annotation `key` in HAMi's format, read for this container as `dialect`.
fn read_key(
    inputs: &Inputs,
    inv: &Inventory,
    identity: Option<&PodIdentity>,
    record: Option<&ContainerRecord>,
    key: &str,
    dialect: Dialect,
) -> Result<Part, AllocationError> {
    let mut part = Part::new(dialect);
    let Some(v) = inputs.annotations.get(key) else {
        return Ok(part);
    };
    let err = |why: String| AllocationError::new(key, v, why);
    let mut groups = parse(v).map_err(err)?;
    let mig = match dialect {
        Dialect::Hami => apply_mig(&mut groups, inputs, inv, record)?,
        _ => None,
    };
    let chosen = select(&groups, identity, record);
    // A MIG reservation of this container's group that names no MIG device here refuses it.
    let unresolved = |i: Option<usize>| {
        let m = mig.as_ref()?;
        let why = match i {
            Some(i) => m.unresolved.get(i)?.clone()?,
            None => m.unresolved.iter().flatten().next()?.clone(),
        };
        Some(AllocationError::new(
            hami_mig::MIG_ALLOCATIONS,
            &m.value,
            why,
        ))
    };
    let group = match chosen {
        Err(why) => return Err(unresolved(None).unwrap_or_else(|| err(why))),
        Ok(None) => return Ok(part),
        Ok(Some(g)) => g,
    };
    if let Some(e) = unresolved(groups.iter().position(|g| std::ptr::eq(g, group))) {
        return Err(e);
    }
    if group.is_empty() {
        return Ok(part);
    }
    let toks: Vec<&str> = group.iter().map(|d| d.uuid.as_str()).collect();
    let devs = resolve_list(key, v, &toks, inv)?;
    part.memory = Some(Facet::new(
        group
            .iter()
            .map(|d| (d.memory_mib > 0).then(|| u64::from(d.memory_mib) << 20))
            .collect(),
        key,
        v,
    ));
    part.cores = Some(Facet::new(
        group
            .iter()
            .map(|d| u8::try_from(d.cores).ok().filter(|c| (1..100).contains(c)))
            .collect(),
        key,
        v,
    ));
    // Devices a MIG reservation named are named by it, in a disagreement too.
    let (dk, dv) = match &mig {
        Some(m)
            if devs
                .iter()
                .any(|r| matches!(r.device, crate::allocation::DeviceRef::Mig { .. })) =>
        {
            (hami_mig::MIG_ALLOCATIONS, m.value.as_str())
        }
        _ => (key, v.as_str()),
    };
    part.devices = Some(Facet::new(devs, dk, dv));
    Ok(part)
}

/// HAMi v2.10's MIG reservations, applied.
struct MigApplied {
    /// The annotation's value.
    value: String,
    /// Per group: why one of its reservations names no MIG device here (only this container's
    /// group's matters: the others may name MIG devices its record does not).
    unresolved: Vec<Option<String>>,
}

/// Apply `hami.io/vgpu-mig-allocations` to the groups: each reserved device (which names the
/// parent GPU) becomes the MIG device its reservation names, with no memory or core limit of
/// its own (the MIG device is the limit). A reservation of a device the groups do not have, or
/// of another GPU than the one they name there, refuses the container.
fn apply_mig(
    groups: &mut [Vec<Device>],
    inputs: &Inputs,
    inv: &Inventory,
    record: Option<&ContainerRecord>,
) -> Result<Option<MigApplied>, AllocationError> {
    let Some(v) = inputs.annotations.get(hami_mig::MIG_ALLOCATIONS) else {
        return Ok(None);
    };
    let err = |why: String| AllocationError::new(hami_mig::MIG_ALLOCATIONS, v, why);
    let reservations = hami_mig::parse(v).map_err(err)?;
    let env = match record {
        Some(r) => r.env().map_err(err)?,
        None => Default::default(),
    };
    let recorded: Vec<&str> = env
        .get(super::super::container_dialects::NVIDIA_VISIBLE_DEVICES)
        .map(|(nvd, _)| nvd.split(',').map(str::trim).collect())
        .unwrap_or_default();
    let mut unresolved: Vec<Option<String>> = vec![None; groups.len()];
    for r in &reservations {
        let Some(d) = groups
            .get_mut(r.container)
            .and_then(|g| g.get_mut(r.device))
        else {
            return Err(err(format!(
                "reserves container {} device {}, which {ALLOCATED} does not have",
                r.container, r.device
            )));
        };
        if !d.uuid.eq_ignore_ascii_case(&r.gpu_uuid) {
            return Err(err(format!(
                "reserves {} for container {} device {}, where {ALLOCATED} names {}",
                short(&r.gpu_uuid),
                r.container,
                r.device,
                short(&d.uuid)
            )));
        }
        match hami_mig::resolve(r, inv, &recorded) {
            Ok(uuid) => {
                d.uuid = uuid;
                d.memory_mib = 0;
                d.cores = 0;
            }
            Err(why) => {
                unresolved[r.container].get_or_insert(format!(
                    "container {} device {} ({} on {}): {why}",
                    r.container,
                    r.device,
                    r.profile,
                    short(&r.gpu_uuid)
                ));
            }
        }
    }
    Ok(Some(MigApplied {
        value: v.clone(),
        unresolved,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_protocol_example_and_real_forms() {
        let g =
            parse("GPU-0fc3eda5-e98b,NVIDIA,3000,0:;GPU-0fc3eda5-e98b,NVIDIA,5000,0:;").unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!(g[1][0].memory_mib, 5000);
        let g = parse("GPU-a,NVIDIA,3000,30:GPU-b,NVIDIA,3000,30:;;").unwrap();
        assert_eq!((g.len(), g[0].len(), g[1].len()), (2, 2, 0));
        // The older join form without the trailing separators.
        assert_eq!(parse("GPU-a,NVIDIA,1,2").unwrap()[0][0].cores, 2);
        for bad in [
            "GPU-a,NVIDIA:;",
            "GPU-a,NVIDIA,3000,30,extra:;",
            "gpu0,NVIDIA,1,1:;",
            "GPU-a,NVIDIA,-1,1:;",
            "GPU-a,NVIDIA,1,101:;",
            "GPU-a,,1,1:;",
            "GPU-a,NVIDIA,99999999999,1:;",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse(&";".repeat(100)).is_err());
    }
}
