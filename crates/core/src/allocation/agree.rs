//! Two dialects that disagree about one container are an error, not a merge: every facet
//! (devices, per-device memory and cores, oversubscription) must be the same in every dialect
//! that expresses it, and an error names both sources.

use super::container_dialects::{Facet, Part};
use super::devices::{Resolved, describe};
use super::{AllocationError, DeviceRef, short};
use crate::config::Dialect;

/// Devices: every dialect that names gpufence devices must name the same set; the first one's
/// order is the container's device order.
pub(super) fn devices(parts: &[Part]) -> Result<Vec<Resolved>, AllocationError> {
    let mut base: Option<(Dialect, &Facet<Vec<Resolved>>)> = None;
    for p in parts {
        let Some(d) = &p.devices else { continue };
        match base {
            None => base = Some((p.dialect, d)),
            Some((bd, b)) => {
                let mut x: Vec<DeviceRef> = b.values.iter().map(|r| r.device).collect();
                let mut y: Vec<DeviceRef> = d.values.iter().map(|r| r.device).collect();
                x.sort();
                y.sort();
                if x != y {
                    let shown = |f: &Facet<Vec<Resolved>>| {
                        let v: Vec<String> = f
                            .values
                            .iter()
                            .map(|r| describe(&r.device, &r.uuid))
                            .collect();
                        v.join(", ")
                    };
                    return Err(disagree(
                        p.dialect,
                        d,
                        bd,
                        &b.key,
                        &b.value,
                        &format!("devices differ ({} here, {} there)", shown(d), shown(b)),
                    ));
                }
            }
        }
    }
    Ok(base.map(|(_, b)| b.values.clone()).unwrap_or_default())
}

/// Oversubscription: every dialect that expresses it says the same.
pub(super) fn oversubscribe(parts: &[Part]) -> Result<bool, AllocationError> {
    let mut first: Option<(Dialect, &Facet<bool>)> = None;
    for p in parts {
        let Some(o) = &p.oversubscribe else { continue };
        match first {
            None => first = Some((p.dialect, o)),
            Some((bd, b)) if b.values != o.values => {
                return Err(disagree(
                    p.dialect,
                    o,
                    bd,
                    &b.key,
                    &b.value,
                    "oversubscription differs",
                ));
            }
            Some(_) => {}
        }
    }
    Ok(first.is_some_and(|(_, o)| o.values))
}

fn disagree<T>(
    d: Dialect,
    f: &Facet<T>,
    base: Dialect,
    base_key: &str,
    base_value: &str,
    what: &str,
) -> AllocationError {
    // Two parts of one dialect (Koordinator's annotation and koordlet's env) name the other
    // input rather than the dialect twice.
    let other = if d == base {
        format!("{base_key}={:?} (both {d})", short(base_value))
    } else {
        format!("the {base} dialect ({base_key}={:?})", short(base_value))
    };
    AllocationError::new(
        &f.key,
        &f.value,
        format!("the {d} dialect disagrees with {other}: {what}"),
    )
}

/// Per-device values every dialect that expresses the facet agrees on, with the source of the
/// first expressing it (`(value, key, value)` per device, or an empty list when none does).
pub(super) fn per_device<'a, T: Copy + PartialEq + std::fmt::Debug + 'a>(
    parts: &'a [Part],
    devices: &[Resolved],
    facet: impl Fn(&'a Part) -> Option<&'a Facet<Vec<Option<T>>>>,
) -> Result<Vec<(Option<T>, String, String)>, AllocationError> {
    let mut out: Vec<(Option<T>, String, String)> = Vec::new();
    let mut base: Option<Dialect> = None;
    for p in parts {
        let Some(f) = facet(p) else { continue };
        // Map the dialect's own order onto the combined order.
        let own: Vec<DeviceRef> = match &p.devices {
            Some(d) => d.values.iter().map(|r| r.device).collect(),
            None => devices.iter().map(|r| r.device).collect(),
        };
        let mut mapped = Vec::with_capacity(devices.len());
        for r in devices {
            let v = own
                .iter()
                .position(|d| *d == r.device)
                .and_then(|i| f.values.get(i).copied())
                .flatten();
            mapped.push(v);
        }
        match base {
            None => {
                base = Some(p.dialect);
                out = mapped
                    .into_iter()
                    .map(|v| (v, f.key.clone(), f.value.clone()))
                    .collect();
            }
            Some(bd) => {
                for (i, v) in mapped.iter().enumerate() {
                    if out[i].0 != *v {
                        return Err(disagree(
                            p.dialect,
                            f,
                            bd,
                            &out[i].1,
                            &out[i].2,
                            &format!(
                                "{} gets {v:?} here but {:?} there",
                                describe(&devices[i].device, &devices[i].uuid),
                                out[i].0
                            ),
                        ));
                    }
                }
            }
        }
    }
    Ok(out)
}
