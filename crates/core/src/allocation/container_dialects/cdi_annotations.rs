//! Cdi.k8s.io/* annotations.

use super::{Facet, Part};
use crate::allocation::devices::resolve_list;
use crate::allocation::input::Inputs;
use crate::allocation::{AllocationError, ForeignCdiDevice};
use crate::cdi::parse::{self, QualifiedName};
use crate::cdi::{ContainerEdits, LoadedSpec};
use crate::config::Dialect;
use crate::inventory::Inventory;

/// `cdi.k8s.io/*`: names of kind `gpufence.dev/gpu` resolve against the inventory, other kinds
/// against the loaded specs. Annotations are read in key order, names in value order.
pub fn cdi(
    inputs: &Inputs,
    inv: &Inventory,
    specs: &[LoadedSpec],
) -> Result<Part, AllocationError> {
    let mut part = Part::new(Dialect::Cdi);
    let mut gpu_tokens: Vec<(String, String, String)> = Vec::new(); // (name, key, value)
    for (key, value) in &inputs.annotations {
        if !key.starts_with(parse::ANNOTATION_PREFIX) {
            continue;
        }
        parse::validate_annotation_key(key)
            .map_err(|e| AllocationError::new(key, value, e.to_string()))?;
        let names: Vec<QualifiedName> = parse::parse_annotation_value(value)
            .map_err(|e| AllocationError::new(key, value, e.to_string()))?;
        for q in names {
            if q.kind() == crate::cdi::KIND {
                gpu_tokens.push((q.name.clone(), key.clone(), value.clone()));
                continue;
            }
            let full = q.to_string();
            if part.foreign.iter().any(|f| f.name == full) {
                continue;
            }
            let (spec, dev) = match parse::find_device(specs, &q) {
                Ok(Some(found)) => found,
                Ok(None) => {
                    return Err(AllocationError::new(
                        key,
                        value,
                        format!("no CDI spec in the CDI directories defines {full}"),
                    ));
                }
                Err((a, b)) => {
                    return Err(AllocationError::new(
                        key,
                        value,
                        format!("{full} is defined by both {a} and {b} at the same priority"),
                    ));
                }
            };
            let mut edits: ContainerEdits = dev.container_edits.clone();
            edits.append(&spec.spec.container_edits);
            parse::validate_edits(&edits).map_err(|e| {
                AllocationError::new(key, value, format!("{full} ({}): {e}", spec.path.display()))
            })?;
            part.foreign.push(ForeignCdiDevice {
                name: full,
                spec_path: spec.path.display().to_string(),
                edits,
                backing: Default::default(),
            });
        }
    }
    if !gpu_tokens.is_empty() {
        // Validate the gpufence devices as one list; errors name the first annotation involved.
        let key = gpu_tokens[0].1.clone();
        let value = if gpu_tokens.iter().all(|t| t.1 == key) {
            gpu_tokens[0].2.clone()
        } else {
            gpu_tokens
                .iter()
                .map(|t| format!("{}={}", crate::cdi::KIND, t.0))
                .collect::<Vec<_>>()
                .join(",")
        };
        let toks: Vec<&str> = gpu_tokens.iter().map(|t| t.0.as_str()).collect();
        let devs = resolve_list(&key, &value, &toks, inv)?;
        part.devices = Some(Facet::new(devs, &key, &value));
    }
    Ok(part)
}
