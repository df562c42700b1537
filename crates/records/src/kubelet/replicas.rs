//! Time-slicing replicas in kubelet's record: NVIDIA's device plugin with `sharing.timeSlicing`
//! (or `sharing.mps`) advertises each shared device N times as `<id>::<k>` (its `AnnotatedID`,
//! `<id>` a GPU or MIG UUID, or an index `N` / `N:M`; `k` in `0..N`), and kubelet records which of
//! those ids each container got (`PodDeviceEntries`) and every id of every resource
//! (`RegisteredDevices`). This module reads both, per container: which replicas of which device
//! it holds, and how many replicas of that device kubelet has registered. Pure; what a share
//! means (memory, compute) is the allocation's business.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::checkpoint::Checkpoint;

/// The separator of the device plugin's annotated ids.
pub const SEPARATOR: &str = "::";
/// Largest replica number accepted (the plugin's `replicas` is a small integer).
const MAX_REPLICA: u32 = 1 << 16;

/// `<id>::<k>` → `(id, k)`; `Ok(None)` for an id without replicas, `Err` for an id that uses the
/// separator but is not a replica id (empty base, `k` not a canonical decimal).
pub fn split(id: &str) -> Result<Option<(&str, u32)>, String> {
    let Some((base, k)) = id.split_once(SEPARATOR) else {
        return Ok(None);
    };
    let canonical = !k.is_empty()
        && k.len() <= 6
        && k.bytes().all(|b| b.is_ascii_digit())
        && (k == "0" || !k.starts_with('0'));
    match k.parse::<u32>() {
        Ok(n) if canonical && !base.is_empty() && n < MAX_REPLICA => Ok(Some((base, n))),
        _ => Err(format!(
            "device id {:?} is not a replica id (<id>::<k>)",
            gpufence_ground::text::short(id)
        )),
    }
}

/// The replicas of one device that one container holds through one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaHolding {
    /// e.g. `nvidia.com/gpu`, `nvidia.com/gpu.shared`.
    pub resource: String,
    /// The device part of the ids (`GPU-…`, `MIG-…`, `1`, `1:0`).
    pub device: String,
    /// The replica numbers held, sorted.
    pub held: Vec<u32>,
    /// How many distinct replica ids of `device` kubelet has registered, over all resources.
    pub registered: u32,
    /// Held replica numbers kubelet does not (or no longer) register.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unregistered: Vec<u32>,
}

/// Every replica id registered with kubelet, per device part: the replica numbers.
fn registered(cp: &Checkpoint) -> BTreeMap<&str, Vec<u32>> {
    let mut out: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (_, ids) in cp.registered.iter().flatten() {
        for id in ids.iter().flatten() {
            // Another plugin's odd id is not this container's business.
            if let Ok(Some((base, k))) = split(id) {
                out.entry(base).or_default().push(k);
            }
        }
    }
    for ks in out.values_mut() {
        ks.sort_unstable();
        ks.dedup();
    }
    out
}

/// The replica holdings of a container whose entries are `entries` (`(resource, device ids)`),
/// sorted by resource and device. A malformed replica id, or one id held twice, is an error.
pub fn holdings(
    cp: &Checkpoint,
    entries: &[(&str, Vec<&str>)],
) -> Result<Vec<ReplicaHolding>, String> {
    let reg = registered(cp);
    let mut out: BTreeMap<(&str, &str), Vec<u32>> = BTreeMap::new();
    for (resource, ids) in entries {
        for id in ids {
            let Some((base, k)) = split(id).map_err(|e| format!("{resource}: {e}"))? else {
                continue;
            };
            let held = out.entry((resource, base)).or_default();
            if held.contains(&k) {
                return Err(format!("{resource}: device id {id:?} recorded twice"));
            }
            held.push(k);
        }
    }
    Ok(out
        .into_iter()
        .map(|((resource, device), mut held)| {
            held.sort_unstable();
            let known = reg.get(device).map(Vec::as_slice).unwrap_or_default();
            ReplicaHolding {
                resource: resource.to_string(),
                device: device.to_string(),
                unregistered: held
                    .iter()
                    .copied()
                    .filter(|k| !known.contains(k))
                    .collect(),
                held,
                registered: known.len() as u32,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cp(registered: &[(&str, &[&str])]) -> Checkpoint {
        Checkpoint {
            entries: None,
            registered: Some(
                registered
                    .iter()
                    .map(|(r, ids)| {
                        (
                            r.to_string(),
                            Some(ids.iter().map(|s| s.to_string()).collect()),
                        )
                    })
                    .collect(),
            ),
            checksum: 0,
        }
    }

    #[test]
    fn split_reads_the_annotated_id_form_strictly() {
        assert_eq!(split("GPU-a::3"), Ok(Some(("GPU-a", 3))));
        assert_eq!(split("1::0"), Ok(Some(("1", 0))));
        assert_eq!(split("1:0::2"), Ok(Some(("1:0", 2))));
        assert_eq!(split("GPU-a"), Ok(None));
        assert_eq!(split("GPU-a-3"), Ok(None));
        for bad in [
            "GPU-a::",
            "::1",
            "GPU-a::01",
            "GPU-a::-1",
            "GPU-a::x",
            "a::1::2",
        ] {
            assert!(split(bad).is_err(), "{bad}");
        }
        assert!(split("GPU-a::99999999999").is_err());
    }

    #[test]
    fn holdings_count_what_kubelet_registered() {
        let c = cp(&[
            (
                "nvidia.com/gpu",
                &["GPU-a::0", "GPU-a::1", "GPU-a::2", "GPU-a::3", "GPU-b"],
            ),
            ("nvidia.com/gpu.shared", &["GPU-c::0", "GPU-c::1"]),
        ]);
        let h = holdings(
            &c,
            &[
                ("nvidia.com/gpu", vec!["GPU-a::3", "GPU-a::1", "GPU-b"]),
                ("nvidia.com/gpu.shared", vec!["GPU-c::1", "GPU-c::7"]),
            ],
        )
        .unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(
            (h[0].device.as_str(), &h[0].held, h[0].registered),
            ("GPU-a", &vec![1, 3], 4)
        );
        assert!(h[0].unregistered.is_empty());
        assert_eq!(h[1].resource, "nvidia.com/gpu.shared");
        assert_eq!((h[1].registered, &h[1].unregistered), (2, &vec![7]));
        // The same id twice, a malformed one: errors.
        assert!(holdings(&c, &[("r", vec!["GPU-a::1", "GPU-a::1"])]).is_err());
        assert!(holdings(&c, &[("r", vec!["GPU-a::x"])]).is_err());
        // Nothing registered at all.
        let none = Checkpoint {
            entries: None,
            registered: None,
            checksum: 0,
        };
        let h = holdings(&none, &[("r", vec!["0::1"])]).unwrap();
        assert_eq!((h[0].registered, &h[0].unregistered), (0, &vec![1]));
    }
}
