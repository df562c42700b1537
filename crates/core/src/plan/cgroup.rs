//! Plan step: one cgroup allow rule per device node (gpufence's and foreign CDI devices').

use crate::allocation::AllocationError;
use crate::cdi::DeviceNodeEdit;

use super::CgroupRule;

/// The rules, each once, in device-node order. A node without a type or numbers is refused:
/// a device the cgroup cannot name must not be mounted.
pub fn rules(nodes: &[DeviceNodeEdit]) -> Result<Vec<CgroupRule>, AllocationError> {
    let mut rules: Vec<CgroupRule> = Vec::new();
    for d in nodes {
        let kind = match d.kind.as_deref() {
            Some("c") | Some("u") => 'c',
            Some("b") => 'b',
            Some("p") => continue,
            _ => {
                return Err(AllocationError::new(
                    "deviceNodes",
                    &d.path,
                    "device node has no type (c or b), and none was found on the host",
                ));
            }
        };
        if d.permissions.as_deref() == Some("none") {
            continue;
        }
        let (Some(major), Some(minor)) = (d.major, d.minor) else {
            return Err(AllocationError::new(
                "deviceNodes",
                &d.path,
                "device node has no major/minor, and none was found on the host",
            ));
        };
        let (Ok(major), Ok(minor)) = (u32::try_from(major), u32::try_from(minor)) else {
            return Err(AllocationError::new(
                "deviceNodes",
                &d.path,
                "major/minor out of range",
            ));
        };
        let access = match d.permissions.as_deref() {
            None | Some("") => "rwm".to_string(),
            Some(p) => p.to_string(),
        };
        let rule = CgroupRule {
            kind,
            major,
            minor,
            access,
        };
        if !rules.contains(&rule) {
            rules.push(rule);
        }
    }
    Ok(rules)
}
