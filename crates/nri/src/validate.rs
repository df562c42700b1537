//! The last word over NRI: the adjustment every plugin's answers merged into (NRI's
//! `ValidateContainerAdjustment`, NRI ≥ v0.10), checked against what gpufence decided for the
//! container. Pure: the request, what gpufence decided ([`Decided`]) and the node's facts
//! ([`Node`]) in, a verdict out.
//!
//! Refused, naming the plugin NRI records as its owner and what it added:
//! * a GPU, MIG or control device node (a GPU-class major, or a `/dev/nvidia*` path), or a CDI
//!   device resolving to one (or to anything below) through `cdi.spec-dirs`;
//! * a device cgroup rule opening a GPU-class major (NRI records no owner for these: the other
//!   plugins consulted are named);
//! * a driver library mount, a mount at a destination gpufence reserves, or over
//!   `/etc/ld.so.preload`;
//! * `LD_PRELOAD` (HAMi-core's `libvgpu.so` named as what gpufence's shim replaces), GPU
//!   visibility env (`NVIDIA_VISIBLE_DEVICES`, `CUDA_VISIBLE_DEVICES`, …) and gpufence's own
//!   variables;
//! * an OCI hook that injects GPUs (NVIDIA's legacy `nvidia-container-runtime-hook`);
//! * a device-cgroup update of another container opening a GPU-class major;
//! * anything of gpufence's own answer removed or changed by another plugin.
//!
//! What another plugin adds that agrees with the decision passes: a node or rule gpufence
//! planned, gpufence's value of a variable, a visibility variable naming exactly the granted
//! devices (koordlet's `NVIDIA_VISIBLE_DEVICES=<minor>`), or what a dialect vouches for
//! ([`Node::env_agrees`]).
//!
//! Bounded: one pass over each list of the request (at most 4 MiB on the wire), lookups in
//! maps; at most [`MAX_CDI_DEVICES`] CDI devices resolved.

use std::collections::{BTreeMap, BTreeSet};

use super::api::{
    ContainerAdjustment, Field, Hook, Hooks, LinuxDevice, LinuxDeviceCgroup, Mount,
    ValidateContainerAdjustmentRequest,
};
use crate::cdi::ContainerEdits;

/// Most CDI devices other plugins may add to one container before it is refused unchecked.
pub const MAX_CDI_DEVICES: usize = 64;

/// Variables that say which GPUs a container's tools and CUDA see.
pub const VISIBILITY_ENV: [&str; 5] = [
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "GPU_DEVICE_ORDINAL",
];

/// What an operator turns off where koordlet injects HAMi-core beside gpufence.
pub const KOORDINATOR_HAMI_CORE: &str = "turn off Koordinator's HAMi-core isolation for this pod \
     (remove its label koordinator.sh/gpu-isolation-provider=HAMi-core): gpufence's shim \
     enforces the quota in its place";

/// Under NRI, for a container whose plan sets `LD_PRELOAD` (to replace HAMi-core's preload in its
/// env, or `shim.inject = "env"`) while its env preloads HAMi-core: where the pod carries
/// Koordinator's HAMi-core label, koordlet's plugin set that variable, and gpufence's adjustment
/// setting it again would only make the runtime refuse the container naming two plugins (NRI
/// lets no plugin rewrite another's variable). The refusal, at CreateContainer, names the setting
/// to turn off, as the validation would. Without the label the preload is taken for the image's
/// own, which gpufence's value replaces (another plugin's: the runtime refuses the collision).
pub fn koordlet_hami_core(
    labels: &BTreeMap<String, String>,
    env: &[String],
    plan_sets_ld_preload: bool,
) -> Option<Refusal> {
    use crate::allocation::koordinator::{
        HAMI_CORE_PROVIDER, ISOLATION_PROVIDER, without_hami_core,
    };
    if !plan_sets_ld_preload
        || labels.get(ISOLATION_PROVIDER).map(String::as_str) != Some(HAMI_CORE_PROVIDER)
    {
        return None;
    }
    let value = env
        .iter()
        .filter_map(|e| e.strip_prefix("LD_PRELOAD="))
        .find(|v| without_hami_core(v).is_some())?;
    Some(Refusal::Replaced {
        by: format!("koordlet (pod label {ISOLATION_PROVIDER}={HAMI_CORE_PROVIDER})"),
        what: format!("env LD_PRELOAD={} (HAMi-core)", shown(value)),
        turn_off: KOORDINATOR_HAMI_CORE,
    })
}

/// What gpufence decided for one container, kept from its CreateContainer to its validation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decided {
    /// The adjustment gpufence answered.
    pub answer: ContainerAdjustment,
    /// Every variable the plan sets, with its value — also those the answer leaves out because
    /// the container (as earlier plugins left it) already had them so.
    pub env: BTreeMap<String, String>,
    /// The devices the plan grants (`GPU-…`, `MIG-…`), in container order.
    pub devices: Vec<String>,
    /// The plan's allocation (`None`: no GPU), for the dialects that vouch for other plugins'
    /// variables ([`Node::env_agrees`]).
    pub allocation: Option<crate::allocation::Allocation>,
}

/// What the validator needs of the node.
pub trait Node {
    /// The GPU-class majors: 195, every `nvidia*` of `/proc/devices`, the inventory's.
    fn gpu_majors(&self) -> &[u32];
    /// Whether a mount source is one of the driver's files or gpufence's driver folders.
    fn is_driver_path(&self, source: &str) -> bool;
    /// The devices (UUIDs) `NVIDIA_VISIBLE_DEVICES`-style `value` names on this node (indexes,
    /// UUIDs, MIG UUIDs); `None` when it names anything this node cannot resolve.
    fn visible_devices(&self, value: &str) -> Option<BTreeSet<String>>;
    /// The edits CDI device `name` resolves to through `cdi.spec-dirs` (with its spec's own),
    /// or why it cannot be resolved.
    fn cdi_edits(&self, name: &str) -> Result<ContainerEdits, String>;
    /// A scheduler dialect's word on another plugin's variable (e.g. koordlet's env for the
    /// devices Koordinator granted): `Some(true)` agrees, `Some(false)` does not, `None` no
    /// opinion (the generic rules decide).
    fn env_agrees(&self, _key: &str, _value: &str, _decided: &Decided) -> Option<bool> {
        None
    }
}

/// Why the merged adjustment is refused. One line each (the container and `gpufence nri` are
/// prefixed by the handler).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{by} added {what}, which gpufence did not plan for this container")]
    Added { by: String, what: String },
    #[error("{by} added {what}, which gpufence replaces: {turn_off}")]
    Replaced {
        by: String,
        what: String,
        turn_off: &'static str,
    },
    #[error("{by} added {what}, which cannot be checked ({why}): refused")]
    Unchecked {
        by: String,
        what: String,
        why: String,
    },
    #[error("{by} removed or changed gpufence's {what}")]
    Removed { by: String, what: String },
    #[error(
        "no decision of this gpufence for the container (the plugin restarted between its \
         creation and this validation): refused, the runtime creates it again"
    )]
    Undecided,
    #[error("the validation request names no container")]
    NoContainer,
}

/// Whether `key` is GPU visibility env.
pub fn is_visibility(key: &str) -> bool {
    VISIBILITY_ENV.contains(&key)
}

/// The verdict on `req` for the container gpufence decided as `decided` (`None`: this process
/// never decided it). `me`: gpufence as NRI names owners (`<index>-<name>`).
pub fn validate(
    req: &ValidateContainerAdjustmentRequest,
    me: &str,
    decided: Option<&Decided>,
    node: &dyn Node,
) -> Result<(), Refusal> {
    let Some(ctr) = req.container.as_ref() else {
        return Err(Refusal::NoContainer);
    };
    let Some(decided) = decided else {
        return Err(Refusal::Undecided);
    };
    let merged = req.adjust.clone().unwrap_or_default();
    let owners = Owners::of(req, &ctr.id, me);
    survived(&decided.answer, &merged, &owners)?;
    env(&merged, decided, &owners, node)?;
    devices(&merged, decided, &owners, node)?;
    mounts(&merged, decided, &owners, node)?;
    cdi_devices(&merged, decided, &owners, node)?;
    cgroup_rules(&merged, decided, &owners, node)?;
    hooks(&merged, decided, &owners)?;
    updates(req, &owners, node)
}

/// Who owns what of the container's adjustment (NRI's `OwningPlugins`).
struct Owners<'a> {
    me: &'a str,
    by_field: Option<&'a super::api::FieldOwners>,
    /// The plugins NRI consulted other than gpufence (`<index>-<name>`).
    others: Vec<String>,
}

impl<'a> Owners<'a> {
    fn of(req: &'a ValidateContainerAdjustmentRequest, id: &str, me: &'a str) -> Owners<'a> {
        let others = req
            .plugins
            .iter()
            .map(|p| format!("{}-{}", p.index, p.name))
            .filter(|p| p != me)
            .take(16)
            .collect();
        Owners {
            me,
            by_field: req.owners.as_ref().and_then(|o| o.owners.get(id)),
            others,
        }
    }

    /// The plugin that set entry `key` of compound `field`, if NRI recorded one.
    fn owner(&self, field: Field, key: &str) -> Option<&'a str> {
        self.by_field?
            .compound
            .get(&(field as i32))?
            .owners
            .get(key)
            .map(String::as_str)
    }

    /// Whether entry `key` of `field` is gpufence's: NRI says so, or (no owner recorded) it is
    /// what gpufence answered.
    fn mine(&self, field: Field, key: &str, as_answered: bool) -> bool {
        match self.owner(field, key) {
            Some(o) => o == self.me,
            None => as_answered,
        }
    }

    /// `plugin "10-x"` for entry `key` of `field`, else the other plugins consulted.
    fn by(&self, field: Field, key: &str) -> String {
        match self.owner(field, key) {
            Some(o) => named(o.strip_prefix('-').unwrap_or(o)),
            None => self.unrecorded(),
        }
    }

    /// For what NRI records no owner of (device cgroup rules, updates): the plugins consulted.
    fn unrecorded(&self) -> String {
        match self.others.as_slice() {
            [one] => named(one),
            [] => "a plugin other than gpufence".to_string(),
            many => format!(
                "one of the plugins {} (NRI records no owner for it)",
                many.iter()
                    .map(|p| format!("{p:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

fn named(plugin: &str) -> String {
    format!("plugin {:?}", crate::text::short(plugin))
}

/// `s` shortened, control characters shown as `?` (the refusal stays one line).
fn shown(s: &str) -> String {
    crate::text::short(s)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Every entry of gpufence's answer is in the merged adjustment as gpufence gave it.
fn survived(
    answer: &ContainerAdjustment,
    merged: &ContainerAdjustment,
    owners: &Owners,
) -> Result<(), Refusal> {
    let env: BTreeMap<&str, &str> = merged
        .env
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    for e in &answer.env {
        if env.get(e.key.as_str()) != Some(&e.value.as_str())
            || !owners.mine(Field::Env, &e.key, true)
        {
            return Err(Refusal::Removed {
                by: owners.by(Field::Env, &e.key),
                what: format!("env {}", e.key),
            });
        }
    }
    let mounts: BTreeMap<&str, &Mount> = merged
        .mounts
        .iter()
        .map(|m| (m.destination.as_str(), m))
        .collect();
    for m in answer
        .mounts
        .iter()
        .filter(|m| !m.destination.starts_with('-'))
    {
        if mounts.get(m.destination.as_str()) != Some(&m) {
            return Err(Refusal::Removed {
                by: owners.by(Field::Mounts, &m.destination),
                what: format!("mount {}", m.destination),
            });
        }
    }
    let devices = merged.linux.as_ref().map_or(&[][..], |l| &l.devices[..]);
    for d in answer.linux.as_ref().map_or(&[][..], |l| &l.devices[..]) {
        if !devices.contains(d) {
            return Err(Refusal::Removed {
                by: owners.by(Field::Devices, &d.path),
                what: format!("device node {}", d.path),
            });
        }
    }
    let rules = rules_of(merged);
    for r in rules_of(answer) {
        if !rules.contains(r) {
            return Err(Refusal::Removed {
                by: owners.unrecorded(),
                what: format!("device cgroup rule {}", rule_text(r)),
            });
        }
    }
    let merged_hooks = hook_list(merged.hooks.as_ref());
    for h in hook_list(answer.hooks.as_ref()) {
        if !merged_hooks.contains(&h) {
            return Err(Refusal::Removed {
                by: owners.unrecorded(),
                what: format!("{} hook {}", h.0, h.1.path),
            });
        }
    }
    Ok(())
}

/// Whether another plugin's `key=value` agrees with the decision (`Ok`), or the refusal.
fn env_entry(
    key: &str,
    value: &str,
    decided: &Decided,
    node: &dyn Node,
    by: impl Fn() -> String,
) -> Result<(), Refusal> {
    let planned = decided.env.get(key).map(String::as_str);
    let what = || format!("env {}={}", shown(key), shown(value));
    if key == "LD_PRELOAD" {
        if planned == Some(value) {
            return Ok(());
        }
        if crate::allocation::koordinator::without_hami_core(value).is_some() {
            return Err(Refusal::Replaced {
                by: by(),
                what: format!("{} (HAMi-core)", what()),
                turn_off: KOORDINATOR_HAMI_CORE,
            });
        }
        return Err(Refusal::Added {
            by: by(),
            what: what(),
        });
    }
    let gpufence_own = key.starts_with("GPUFENCE_");
    if !is_visibility(key) && !gpufence_own {
        return Ok(());
    }
    let agrees = match node.env_agrees(key, value, decided) {
        Some(verdict) => verdict,
        None if planned == Some(value) => true,
        None if gpufence_own => false,
        None => visibility_agrees(key, value, decided, node),
    };
    if agrees {
        Ok(())
    } else {
        Err(Refusal::Added {
            by: by(),
            what: what(),
        })
    }
}

/// Whether visibility variable `key=value` names nothing, or exactly the granted devices.
pub fn visibility_agrees(key: &str, value: &str, decided: &Decided, node: &dyn Node) -> bool {
    let v = value.trim();
    if v.is_empty() || v == "void" || v == "none" || v == "NoDevFiles" {
        return true;
    }
    if decided.devices.is_empty() {
        return false;
    }
    let granted: BTreeSet<String> = decided.devices.iter().cloned().collect();
    if key == "CUDA_VISIBLE_DEVICES" || key == "GPU_DEVICE_ORDINAL" {
        // Ordinals count the devices the container sees (the granted ones, in order).
        let tokens: Vec<&str> = v.split(',').map(str::trim).take(1025).collect();
        if tokens.len() > 1024 {
            return false;
        }
        let mut named = BTreeSet::new();
        for t in tokens {
            match t.parse::<usize>() {
                Ok(i) => match decided.devices.get(i) {
                    Some(u) => named.insert(u.clone()),
                    None => return false,
                },
                Err(_) if granted.contains(t) => named.insert(t.to_string()),
                Err(_) => return false,
            };
        }
        return named == granted;
    }
    node.visible_devices(v)
        .is_some_and(|named| named == granted)
}

fn env(
    merged: &ContainerAdjustment,
    decided: &Decided,
    owners: &Owners,
    node: &dyn Node,
) -> Result<(), Refusal> {
    let answered: BTreeMap<&str, &str> = decided
        .answer
        .env
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    for e in &merged.env {
        if e.key.starts_with('-') {
            continue; // a removal: of gpufence's own, caught by `survived`
        }
        let as_answered = answered.get(e.key.as_str()) == Some(&e.value.as_str());
        if owners.mine(Field::Env, &e.key, as_answered) {
            continue;
        }
        env_entry(&e.key, &e.value, decided, node, || {
            owners.by(Field::Env, &e.key)
        })?;
    }
    Ok(())
}

/// Whether a device node is GPU-class: a GPU-class major, or NVIDIA's path.
fn gpu_class(path: &str, major: Option<i64>, node: &dyn Node) -> bool {
    path.starts_with("/dev/nvidia")
        || major.is_some_and(|m| u32::try_from(m).is_ok_and(|m| node.gpu_majors().contains(&m)))
}

fn node_text(d: &LinuxDevice) -> String {
    format!(
        "device node {} ({} {}:{})",
        shown(&d.path),
        shown(&d.r#type),
        d.major,
        d.minor
    )
}

/// Whether gpufence planned the node `path` `major:minor`.
fn planned_node(decided: &Decided, path: &str, major: i64, minor: i64) -> bool {
    decided.answer.linux.as_ref().is_some_and(|l| {
        l.devices
            .iter()
            .any(|d| d.path == path && d.major == major && d.minor == minor)
    })
}

fn devices(
    merged: &ContainerAdjustment,
    decided: &Decided,
    owners: &Owners,
    node: &dyn Node,
) -> Result<(), Refusal> {
    for d in merged.linux.as_ref().map_or(&[][..], |l| &l.devices[..]) {
        let planned = planned_node(decided, &d.path, d.major, d.minor);
        if owners.mine(Field::Devices, &d.path, planned)
            || planned
            || !gpu_class(&d.path, Some(d.major), node)
        {
            continue;
        }
        return Err(Refusal::Added {
            by: owners.by(Field::Devices, &d.path),
            what: node_text(d),
        });
    }
    Ok(())
}

/// Library file names of the driver (and of HAMi-core, and gpufence's shim).
fn driver_library_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    [
        "libcuda.so",
        "libcudadebugger.so",
        "libnvidia-",
        "libnvcuvid.so",
        "libnvoptix.so",
        "libvgpu.so",
        "libgpufence.so",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// What a mount another plugin adds is, when gpufence must refuse it: a driver library, a
/// destination gpufence reserves, or one over `/etc/ld.so.preload`.
fn sensitive_mount(destination: &str, source: &str, node: &dyn Node) -> Option<&'static str> {
    let dest = destination.trim_end_matches('/');
    if dest == "/etc/ld.so.preload" || dest == "/etc" || dest.is_empty() {
        return Some("over /etc/ld.so.preload");
    }
    if crate::plan::is_reserved_destination(destination) {
        return Some("at a destination gpufence reserves");
    }
    if node.is_driver_path(source)
        || driver_library_name(source)
        || driver_library_name(destination)
    {
        return Some("of a driver library");
    }
    None
}

fn mounts(
    merged: &ContainerAdjustment,
    decided: &Decided,
    owners: &Owners,
    node: &dyn Node,
) -> Result<(), Refusal> {
    for m in &merged.mounts {
        if m.destination.starts_with('-') {
            continue;
        }
        let planned = decided.answer.mounts.contains(m);
        if owners.mine(Field::Mounts, &m.destination, planned) || planned {
            continue;
        }
        if let Some(kind) = sensitive_mount(&m.destination, &m.source, node) {
            return Err(Refusal::Added {
                by: owners.by(Field::Mounts, &m.destination),
                what: format!(
                    "a mount {kind} ({} from {})",
                    shown(&m.destination),
                    shown(&m.source)
                ),
            });
        }
    }
    Ok(())
}

/// What of CDI device `name`'s edits gpufence must refuse, if anything.
fn cdi_device(
    name: &str,
    edits: &ContainerEdits,
    decided: &Decided,
    node: &dyn Node,
) -> Option<String> {
    let what = |part: String| format!("CDI device {} ({part})", shown(name));
    for d in &edits.device_nodes {
        let (major, minor) = (d.major.unwrap_or(-1), d.minor.unwrap_or(-1));
        if gpu_class(&d.path, d.major, node) && !planned_node(decided, &d.path, major, minor) {
            return Some(what(format!(
                "device node {} {major}:{minor}",
                shown(&d.path)
            )));
        }
    }
    for m in &edits.mounts {
        if let Some(kind) = sensitive_mount(&m.container_path, &m.host_path, node) {
            return Some(what(format!(
                "a mount {kind}: {}",
                shown(&m.container_path)
            )));
        }
    }
    for e in &edits.env {
        let (k, v) = e.split_once('=').unwrap_or((e.as_str(), ""));
        if env_entry(k, v, decided, node, String::new).is_err() {
            return Some(what(format!("env {}={}", shown(k), shown(v))));
        }
    }
    edits
        .hooks
        .iter()
        .find(|h| gpu_injecting_hook(&h.path))
        .map(|h| what(format!("hook {}", shown(&h.path))))
}

fn cdi_devices(
    merged: &ContainerAdjustment,
    decided: &Decided,
    owners: &Owners,
    node: &dyn Node,
) -> Result<(), Refusal> {
    let added: Vec<&str> = merged
        .cdi_devices
        .iter()
        .map(|d| d.name.as_str())
        .filter(|n| !owners.mine(Field::CdiDevices, n, false))
        .collect();
    if added.len() > MAX_CDI_DEVICES {
        return Err(Refusal::Unchecked {
            by: owners.by(Field::CdiDevices, added[0]),
            what: format!("{} CDI devices", added.len()),
            why: format!("more than {MAX_CDI_DEVICES}"),
        });
    }
    for name in added {
        let by = || owners.by(Field::CdiDevices, name);
        match node.cdi_edits(name) {
            Err(why) => {
                return Err(Refusal::Unchecked {
                    by: by(),
                    what: format!("CDI device {}", shown(name)),
                    why,
                });
            }
            Ok(edits) => {
                if let Some(what) = cdi_device(name, &edits, decided, node) {
                    return Err(Refusal::Added { by: by(), what });
                }
            }
        }
    }
    Ok(())
}

fn rules_of(a: &ContainerAdjustment) -> &[LinuxDeviceCgroup] {
    a.linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .map_or(&[][..], |r| &r.devices[..])
}

fn rule_text(r: &LinuxDeviceCgroup) -> String {
    let n = |v: &Option<super::api::OptionalInt64>| {
        v.as_ref().map_or("*".to_string(), |v| v.value.to_string())
    };
    format!(
        "\"{} {} {}:{} {}\"",
        if r.allow { "allow" } else { "deny" },
        shown(if r.r#type.is_empty() { "a" } else { &r.r#type }),
        n(&r.major),
        n(&r.minor),
        shown(&r.access)
    )
}

/// Whether an allow rule opens a GPU-class major for reading or writing.
fn opens_gpu(r: &LinuxDeviceCgroup, node: &dyn Node) -> bool {
    let char_or_all = matches!(r.r#type.as_str(), "" | "a" | "c");
    let access = r.access.is_empty() || r.access.contains('r') || r.access.contains('w');
    let major = match &r.major {
        None => true,
        Some(m) => {
            u32::try_from(m.value).is_ok_and(|m| node.gpu_majors().contains(&m)) || m.value < 0
        }
    };
    r.allow && char_or_all && access && major
}

/// Whether gpufence planned access to `major:minor` (a rule or a node of its answer).
fn planned_rule(decided: &Decided, r: &LinuxDeviceCgroup) -> bool {
    let (Some(major), Some(minor)) = (&r.major, &r.minor) else {
        return false;
    };
    let same = |p: &LinuxDeviceCgroup| {
        p.major.as_ref() == Some(major)
            && p.minor.as_ref() == Some(minor)
            && r.access.chars().all(|c| p.access.contains(c))
            && !r.access.is_empty()
    };
    rules_of(&decided.answer).iter().any(same)
        || planned_node_numbers(decided, major.value, minor.value)
}

fn planned_node_numbers(decided: &Decided, major: i64, minor: i64) -> bool {
    decided.answer.linux.as_ref().is_some_and(|l| {
        l.devices
            .iter()
            .any(|d| d.major == major && d.minor == minor)
    })
}

fn cgroup_rules(
    merged: &ContainerAdjustment,
    decided: &Decided,
    owners: &Owners,
    node: &dyn Node,
) -> Result<(), Refusal> {
    // gpufence's own rules, each taken once from the merged list (NRI appends every plugin's).
    let mut own: Vec<&LinuxDeviceCgroup> = rules_of(&decided.answer).iter().collect();
    for r in rules_of(merged) {
        if let Some(i) = own.iter().position(|o| *o == r) {
            own.swap_remove(i);
            continue;
        }
        if opens_gpu(r, node) && !planned_rule(decided, r) {
            return Err(Refusal::Added {
                by: owners.unrecorded(),
                what: format!("device cgroup rule {}", rule_text(r)),
            });
        }
    }
    Ok(())
}

/// NVIDIA's legacy prestart hook, which injects the GPUs `NVIDIA_VISIBLE_DEVICES` names.
fn gpu_injecting_hook(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("nvidia-container-runtime-hook")
        || name.starts_with("nvidia-container-toolkit")
}

/// Every hook of an adjustment with its stage.
fn hook_list(h: Option<&Hooks>) -> Vec<(&'static str, &Hook)> {
    let Some(h) = h else {
        return Vec::new();
    };
    let stages: [(&'static str, &Vec<Hook>); 6] = [
        ("prestart", &h.prestart),
        ("createRuntime", &h.create_runtime),
        ("createContainer", &h.create_container),
        ("startContainer", &h.start_container),
        ("poststart", &h.poststart),
        ("poststop", &h.poststop),
    ];
    stages
        .into_iter()
        .flat_map(|(s, l)| l.iter().map(move |h| (s, h)))
        .collect()
}

fn hooks(merged: &ContainerAdjustment, decided: &Decided, owners: &Owners) -> Result<(), Refusal> {
    let own = hook_list(decided.answer.hooks.as_ref());
    for (stage, h) in hook_list(merged.hooks.as_ref()) {
        if own.contains(&(stage, h)) || !gpu_injecting_hook(&h.path) {
            continue;
        }
        return Err(Refusal::Added {
            by: owners.unrecorded(),
            what: format!("a GPU-injecting {stage} hook {}", shown(&h.path)),
        });
    }
    Ok(())
}

/// Updates of other containers asked during this creation: none may open a GPU-class major.
fn updates(
    req: &ValidateContainerAdjustmentRequest,
    owners: &Owners,
    node: &dyn Node,
) -> Result<(), Refusal> {
    for u in &req.update {
        let rules = u
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .map_or(&[][..], |r| &r.devices[..]);
        if let Some(r) = rules.iter().find(|r| opens_gpu(r, node)) {
            return Err(Refusal::Added {
                by: owners.unrecorded(),
                what: format!(
                    "an update of container {} with device cgroup rule {}",
                    shown(&u.container_id),
                    rule_text(r)
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{
        CdiDevice, CompoundFieldOwners, Container, ContainerUpdate, FieldOwners, KeyValue,
        LinuxContainerAdjustment, LinuxContainerUpdate, LinuxResources, OptionalInt64,
        OwningPlugins, PluginInstance,
    };
    use crate::cdi::{DeviceNodeEdit, MountEdit};

    const ME: &str = "90-gpufence";
    const OTHER: &str = "10-injector";

    /// Two GPUs (GPU-0 at index/minor 0, GPU-1 at 1), majors 195 and 511 (nvidia-uvm), the
    /// driver under /drv, three CDI devices.
    struct TestNode;

    impl Node for TestNode {
        fn gpu_majors(&self) -> &[u32] {
            &[195, 511]
        }
        fn is_driver_path(&self, source: &str) -> bool {
            source.starts_with("/drv/")
        }
        fn visible_devices(&self, value: &str) -> Option<BTreeSet<String>> {
            value
                .split(',')
                .map(|t| match t.trim() {
                    "0" | "GPU-0" => Some("GPU-0".to_string()),
                    "1" | "GPU-1" => Some("GPU-1".to_string()),
                    _ => None,
                })
                .collect()
        }
        fn cdi_edits(&self, name: &str) -> Result<ContainerEdits, String> {
            let node = |path: &str, major, minor| DeviceNodeEdit {
                path: path.into(),
                major: Some(major),
                minor: Some(minor),
                ..Default::default()
            };
            match name {
                "nvidia.com/gpu=0" => Ok(ContainerEdits {
                    device_nodes: vec![node("/dev/nvidia0", 195, 0)],
                    ..Default::default()
                }),
                "nvidia.com/gpu=libs" => Ok(ContainerEdits {
                    mounts: vec![MountEdit {
                        host_path: "/drv/libcuda.so.1".into(),
                        container_path: "/usr/lib/libcuda.so.1".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                "vendor.com/net=x" => Ok(ContainerEdits {
                    device_nodes: vec![node("/dev/net/tun", 10, 200)],
                    env: vec!["NET=1".into()],
                    ..Default::default()
                }),
                _ => Err("no spec in cdi.spec-dirs defines it".into()),
            }
        }
    }

    fn kv(k: &str, v: &str) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: v.into(),
        }
    }

    pub(crate) fn dev(path: &str, major: i64, minor: i64) -> LinuxDevice {
        LinuxDevice {
            path: path.into(),
            r#type: "c".into(),
            major,
            minor,
            ..Default::default()
        }
    }

    fn rule(major: Option<i64>, minor: Option<i64>, access: &str) -> LinuxDeviceCgroup {
        LinuxDeviceCgroup {
            allow: true,
            r#type: "c".into(),
            major: major.map(|value| OptionalInt64 { value }),
            minor: minor.map(|value| OptionalInt64 { value }),
            access: access.into(),
        }
    }

    fn mount(dest: &str, src: &str) -> Mount {
        Mount {
            destination: dest.into(),
            r#type: "bind".into(),
            source: src.into(),
            options: vec!["bind".into(), "ro".into()],
        }
    }

    /// gpufence's decision for a pod granted GPU 1: its node and rule, the shim, the quota
    /// env; `NVIDIA_VISIBLE_DEVICES` planned but left to the container (an earlier plugin set
    /// it as planned).
    fn granted() -> Decided {
        let answer = ContainerAdjustment {
            env: vec![kv("GPUFENCE_MEMORY_LIMIT_0", "1073741824")],
            mounts: vec![
                mount("/usr/lib/gpufence/libgpufence.so", "/shim/libgpufence.so"),
                mount("/etc/ld.so.preload", "/state/c1/ld.so.preload"),
            ],
            linux: Some(LinuxContainerAdjustment {
                devices: vec![dev("/dev/nvidia1", 195, 1)],
                resources: Some(LinuxResources {
                    devices: vec![rule(Some(195), Some(1), "rw")],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        Decided {
            env: [
                ("GPUFENCE_MEMORY_LIMIT_0", "1073741824"),
                ("NVIDIA_VISIBLE_DEVICES", "GPU-1"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            devices: vec!["GPU-1".into()],
            answer,
            allocation: None,
        }
    }

    /// The request NRI sends: gpufence's answer merged with `other`'s additions, owners
    /// recorded as NRI does (`owned`: (field, key, plugin) of the other plugin's entries).
    fn request(
        decided: &Decided,
        other: ContainerAdjustment,
        owned: &[(Field, &str, &str)],
    ) -> ValidateContainerAdjustmentRequest {
        request_for("c1", decided, other, owned)
    }

    /// [`request`] for container `id`.
    pub(crate) fn request_for(
        id: &str,
        decided: &Decided,
        other: ContainerAdjustment,
        owned: &[(Field, &str, &str)],
    ) -> ValidateContainerAdjustmentRequest {
        let mut merged = decided.answer.clone();
        merged.env.extend(other.env);
        merged.mounts.extend(other.mounts);
        merged.cdi_devices.extend(other.cdi_devices);
        if let Some(l) = other.linux {
            let m = merged.linux.get_or_insert_with(Default::default);
            m.devices.extend(l.devices);
            if let Some(r) = l.resources {
                let mr = m.resources.get_or_insert_with(Default::default);
                mr.devices.extend(r.devices);
            }
        }
        if let Some(h) = other.hooks {
            merged.hooks = Some(h);
        }
        let mut fo = FieldOwners::default();
        let mut own = |field: Field, key: &str, plugin: &str| {
            fo.compound
                .entry(field as i32)
                .or_insert_with(CompoundFieldOwners::default)
                .owners
                .insert(key.to_string(), plugin.to_string());
        };
        for e in &decided.answer.env {
            own(Field::Env, &e.key, ME);
        }
        for m in &decided.answer.mounts {
            own(Field::Mounts, &m.destination, ME);
        }
        for d in decided.answer.linux.iter().flat_map(|l| &l.devices) {
            own(Field::Devices, &d.path, ME);
        }
        for (f, k, p) in owned {
            own(*f, k, p);
        }
        ValidateContainerAdjustmentRequest {
            container: Some(Container {
                id: id.into(),
                ..Default::default()
            }),
            adjust: Some(merged),
            owners: Some(OwningPlugins {
                owners: [(id.to_string(), fo)].into_iter().collect(),
            }),
            plugins: [("10", "injector"), ("90", "gpufence")]
                .iter()
                .map(|(i, n)| PluginInstance {
                    name: n.to_string(),
                    index: i.to_string(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn check(
        decided: &Decided,
        other: ContainerAdjustment,
        owned: &[(Field, &str, &str)],
    ) -> Result<(), String> {
        validate(
            &request(decided, other, owned),
            ME,
            Some(decided),
            &TestNode,
        )
        .map_err(|e| e.to_string())
    }

    pub(crate) fn with_devices(devices: Vec<LinuxDevice>) -> ContainerAdjustment {
        ContainerAdjustment {
            linux: Some(LinuxContainerAdjustment {
                devices,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub(crate) fn with_env(env: &[(&str, &str)]) -> ContainerAdjustment {
        ContainerAdjustment {
            env: env.iter().map(|(k, v)| kv(k, v)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn gpufence_s_own_adjustment_passes_and_so_does_what_touches_no_gpu() {
        check(&granted(), ContainerAdjustment::default(), &[]).unwrap();
        check(&Decided::default(), ContainerAdjustment::default(), &[]).unwrap();
        let harmless = ContainerAdjustment {
            env: vec![kv("OTEL_SERVICE", "x")],
            mounts: vec![mount("/etc/app.conf", "/srv/app.conf")],
            cdi_devices: vec![CdiDevice {
                name: "vendor.com/net=x".into(),
            }],
            linux: Some(LinuxContainerAdjustment {
                devices: vec![dev("/dev/fuse", 10, 229)],
                resources: Some(LinuxResources {
                    devices: vec![rule(Some(10), Some(229), "rwm")],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let owned = [
            (Field::Env, "OTEL_SERVICE", OTHER),
            (Field::Mounts, "/etc/app.conf", OTHER),
            (Field::Devices, "/dev/fuse", OTHER),
            (Field::CdiDevices, "vendor.com/net=x", OTHER),
        ];
        check(&Decided::default(), harmless.clone(), &owned).unwrap();
        check(&granted(), harmless, &owned).unwrap();
    }

    #[test]
    fn a_gpu_node_or_cdi_device_another_plugin_adds_is_refused_naming_it() {
        let e = check(
            &Decided::default(),
            with_devices(vec![dev("/dev/nvidia0", 195, 0)]),
            &[(Field::Devices, "/dev/nvidia0", OTHER)],
        )
        .unwrap_err();
        assert_eq!(
            e,
            "plugin \"10-injector\" added device node /dev/nvidia0 (c 195:0), which gpufence \
             did not plan for this container"
        );
        // A granted pod: another GPU, or the control node nvidia-uvm by its major.
        for d in [dev("/dev/nvidia0", 195, 0), dev("/dev/gpu-uvm", 511, 0)] {
            let path = d.path.clone();
            let e = check(
                &granted(),
                with_devices(vec![d]),
                &[(Field::Devices, &path, OTHER)],
            );
            assert!(
                e.unwrap_err()
                    .contains(&format!("added device node {path}"))
            );
        }
        // A CDI device resolving to a GPU node, or to a driver library.
        for (name, part) in [
            ("nvidia.com/gpu=0", "device node /dev/nvidia0 195:0"),
            (
                "nvidia.com/gpu=libs",
                "a mount of a driver library: /usr/lib/libcuda.so.1",
            ),
        ] {
            let cdi = ContainerAdjustment {
                cdi_devices: vec![CdiDevice { name: name.into() }],
                ..Default::default()
            };
            let e = check(
                &Decided::default(),
                cdi,
                &[(Field::CdiDevices, name, OTHER)],
            );
            assert_eq!(
                e.unwrap_err(),
                format!(
                    "plugin \"10-injector\" added CDI device {name} ({part}), which gpufence did \
                     not plan for this container"
                )
            );
        }
        // One that cannot be resolved is refused too (fail closed).
        let cdi = ContainerAdjustment {
            cdi_devices: vec![CdiDevice {
                name: "example.com/gpu=9".into(),
            }],
            ..Default::default()
        };
        let e = check(
            &granted(),
            cdi,
            &[(Field::CdiDevices, "example.com/gpu=9", OTHER)],
        );
        assert!(
            e.unwrap_err()
                .contains("CDI device example.com/gpu=9, which cannot be checked (no spec")
        );
    }

    #[test]
    fn visibility_env_must_name_exactly_the_granted_devices() {
        let nvd = |v: &str| {
            check(
                &granted(),
                with_env(&[("NVIDIA_VISIBLE_DEVICES", v)]),
                &[(Field::Env, "NVIDIA_VISIBLE_DEVICES", "00-koordlet")],
            )
        };
        // koordlet's minor, or the UUID, for the granted GPU: agrees.
        nvd("1").unwrap();
        nvd("GPU-1").unwrap();
        nvd("void").unwrap();
        for bad in ["0", "0,1", "all", "GPU-9"] {
            let e = nvd(bad).unwrap_err();
            assert_eq!(
                e,
                format!(
                    "plugin \"00-koordlet\" added env NVIDIA_VISIBLE_DEVICES={bad}, which \
                     gpufence did not plan for this container"
                )
            );
        }
        // No grant: any device named is refused.
        let e = check(
            &Decided::default(),
            with_env(&[("NVIDIA_VISIBLE_DEVICES", "1")]),
            &[(Field::Env, "NVIDIA_VISIBLE_DEVICES", OTHER)],
        );
        assert!(e.is_err());
        // CUDA's ordinals count the container's devices.
        let cvd = |v: &str| {
            check(
                &granted(),
                with_env(&[("CUDA_VISIBLE_DEVICES", v)]),
                &[(Field::Env, "CUDA_VISIBLE_DEVICES", OTHER)],
            )
        };
        cvd("0").unwrap();
        cvd("GPU-1").unwrap();
        assert!(cvd("1").is_err() && cvd("0,0").is_ok() && cvd("GPU-0").is_err());
        // gpufence's own variables, set by another plugin to another value.
        let e = check(
            &granted(),
            with_env(&[("GPUFENCE_OVERSUBSCRIBE", "1")]),
            &[(Field::Env, "GPUFENCE_OVERSUBSCRIBE", OTHER)],
        );
        assert!(
            e.unwrap_err()
                .contains("added env GPUFENCE_OVERSUBSCRIBE=1")
        );
    }

    #[test]
    fn a_dialect_can_vouch_for_a_variable() {
        struct Vouching;
        impl Node for Vouching {
            fn gpu_majors(&self) -> &[u32] {
                &[195]
            }
            fn is_driver_path(&self, _: &str) -> bool {
                false
            }
            fn visible_devices(&self, _: &str) -> Option<BTreeSet<String>> {
                None
            }
            fn cdi_edits(&self, _: &str) -> Result<ContainerEdits, String> {
                Err("none".into())
            }
            fn env_agrees(&self, key: &str, value: &str, d: &Decided) -> Option<bool> {
                (key == "NVIDIA_VISIBLE_DEVICES")
                    .then(|| value == "minor-1" && d.devices == ["GPU-1"])
            }
        }
        let d = granted();
        let r = |v: &str| {
            request(
                &d,
                with_env(&[("NVIDIA_VISIBLE_DEVICES", v)]),
                &[(Field::Env, "NVIDIA_VISIBLE_DEVICES", "00-koordlet")],
            )
        };
        validate(&r("minor-1"), ME, Some(&d), &Vouching).unwrap();
        // The dialect's "no" wins over the generic rule.
        assert!(validate(&r("GPU-1"), ME, Some(&d), &Vouching).is_err());
    }

    #[test]
    fn a_preload_is_refused_and_hami_core_s_names_what_to_turn_off() {
        let e = check(
            &granted(),
            with_env(&[("LD_PRELOAD", "/usr/local/vgpu/libvgpu.so")]),
            &[(Field::Env, "LD_PRELOAD", "00-koordlet")],
        )
        .unwrap_err();
        assert!(
            e.starts_with(
                "plugin \"00-koordlet\" added env LD_PRELOAD=/usr/local/vgpu/libvgpu.so \
                 (HAMi-core), which gpufence replaces: turn off Koordinator's HAMi-core isolation"
            ),
            "{e}"
        );
        assert!(
            e.contains("koordinator.sh/gpu-isolation-provider=HAMi-core"),
            "{e}"
        );
        let e = check(
            &Decided::default(),
            with_env(&[("LD_PRELOAD", "/opt/evil.so")]),
            &[(Field::Env, "LD_PRELOAD", OTHER)],
        );
        assert!(e.unwrap_err().contains("added env LD_PRELOAD=/opt/evil.so"));
        // The preload file, a driver library, a reserved destination.
        for (dest, src) in [
            ("/etc/ld.so.preload", "/tmp/preload"),
            ("/etc", "/srv/etc"),
            (
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "/srv/libcuda.so.1",
            ),
            ("/opt/lib/libx.so", "/drv/libnvidia-ml.so.1"),
            ("/run/gpufence", "/srv/fake-state"),
        ] {
            let m = ContainerAdjustment {
                mounts: vec![mount(dest, src)],
                ..Default::default()
            };
            let e = check(&Decided::default(), m, &[(Field::Mounts, dest, OTHER)]);
            assert!(
                e.unwrap_err().contains(&format!("({dest} from {src})")),
                "{dest}"
            );
        }
    }

    #[test]
    fn cgroup_rules_opening_gpu_majors_are_refused_naming_the_other_plugins() {
        let rules = |r: Vec<LinuxDeviceCgroup>| ContainerAdjustment {
            linux: Some(LinuxContainerAdjustment {
                resources: Some(LinuxResources {
                    devices: r,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = check(&granted(), rules(vec![rule(Some(195), None, "rwm")]), &[]).unwrap_err();
        assert_eq!(
            e,
            "plugin \"10-injector\" added device cgroup rule \"allow c 195:* rwm\", which \
             gpufence did not plan for this container"
        );
        assert!(check(&granted(), rules(vec![rule(None, None, "rw")]), &[]).is_err());
        // What gpufence planned (again), a denial, an mknod-only rule: pass.
        check(&granted(), rules(vec![rule(Some(195), Some(1), "r")]), &[]).unwrap();
        let mut deny = rule(Some(195), None, "rwm");
        deny.allow = false;
        check(
            &granted(),
            rules(vec![deny, rule(Some(195), None, "m")]),
            &[],
        )
        .unwrap();
        // Several plugins consulted: all named.
        let mut r = request(&granted(), rules(vec![rule(Some(195), Some(0), "rw")]), &[]);
        r.plugins.push(PluginInstance {
            name: "other".into(),
            index: "20".into(),
        });
        let e = validate(&r, ME, Some(&granted()), &TestNode).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("one of the plugins \"10-injector\", \"20-other\" (NRI records")
        );
        // An update of another container opening a GPU.
        let mut r = request(&granted(), ContainerAdjustment::default(), &[]);
        r.update.push(ContainerUpdate {
            container_id: "c0".into(),
            linux: Some(LinuxContainerUpdate {
                resources: Some(LinuxResources {
                    devices: vec![rule(Some(195), Some(0), "rw")],
                    ..Default::default()
                }),
            }),
            ..Default::default()
        });
        let e = validate(&r, ME, Some(&granted()), &TestNode).unwrap_err();
        assert!(e.to_string().contains("an update of container c0"), "{e}");
    }

    #[test]
    fn gpufence_s_answer_taken_back_is_refused() {
        let d = granted();
        let mut r = request(&d, ContainerAdjustment::default(), &[]);
        // A later plugin removed gpufence's preload file and set the memory variable its way.
        let merged = r.adjust.as_mut().unwrap();
        merged
            .mounts
            .retain(|m| m.destination != "/etc/ld.so.preload");
        r.owners
            .as_mut()
            .unwrap()
            .owners
            .get_mut("c1")
            .unwrap()
            .compound
            .get_mut(&(Field::Mounts as i32))
            .unwrap()
            .owners
            .insert("/etc/ld.so.preload".into(), "-95-late".into());
        let e = validate(&r, ME, Some(&d), &TestNode).unwrap_err();
        assert_eq!(
            e.to_string(),
            "plugin \"95-late\" removed or changed gpufence's mount /etc/ld.so.preload"
        );
        let mut r = request(&d, ContainerAdjustment::default(), &[]);
        r.adjust.as_mut().unwrap().env[0].value = "0".into();
        assert!(validate(&r, ME, Some(&d), &TestNode).is_err());
        let mut r = request(&d, ContainerAdjustment::default(), &[]);
        r.adjust.as_mut().unwrap().linux = None;
        let e = validate(&r, ME, Some(&d), &TestNode).unwrap_err();
        assert!(
            e.to_string()
                .contains("gpufence's device node /dev/nvidia1"),
            "{e}"
        );
    }

    #[test]
    fn an_injecting_hook_and_an_unknown_decision_are_refused() {
        let hook = ContainerAdjustment {
            hooks: Some(Hooks {
                prestart: vec![Hook {
                    path: "/usr/bin/nvidia-container-runtime-hook".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = check(&Decided::default(), hook, &[]).unwrap_err();
        assert!(e.contains("a GPU-injecting prestart hook /usr/bin/nvidia-container-runtime-hook"));
        let r = request(&granted(), ContainerAdjustment::default(), &[]);
        assert_eq!(validate(&r, ME, None, &TestNode), Err(Refusal::Undecided));
        let r = ValidateContainerAdjustmentRequest::default();
        assert_eq!(
            validate(&r, ME, Some(&granted()), &TestNode),
            Err(Refusal::NoContainer)
        );
    }

    #[test]
    fn without_owner_records_gpufence_s_entries_are_recognised_by_value() {
        let d = granted();
        let mut r = request(&d, with_devices(vec![dev("/dev/nvidia0", 195, 0)]), &[]);
        r.owners = None;
        let e = validate(&r, ME, Some(&d), &TestNode).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("plugin \"10-injector\" added device node /dev/nvidia0")
        );
        let mut r = request(&d, ContainerAdjustment::default(), &[]);
        r.owners = None;
        validate(&r, ME, Some(&d), &TestNode).unwrap();
    }

    proptest::proptest! {
        /// Whatever other plugins add, the verdict is one line and never a panic; a GPU node
        /// another plugin adds is always refused.
        #[test]
        fn any_merge_is_judged_and_a_gpu_node_never_passes(
            env in proptest::collection::vec(
                (proptest::sample::select(vec![
                    "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "A",
                    "GPUFENCE_STATE", "-LD_PRELOAD", "GPU_DEVICE_ORDINAL",
                ]), "[ -~\n]{0,12}"),
                0..6,
            ),
            devs in proptest::collection::vec(("/dev/[a-z0-9]{1,8}", 0i64..600, -1i64..4), 0..4),
            rules in proptest::collection::vec(
                (proptest::option::of(-2i64..600), proptest::option::of(-1i64..3), "[rwmx]{0,3}", "[abcz]?"),
                0..4,
            ),
            mounts in proptest::collection::vec(("/[a-z./]{0,20}", "/[a-z./]{0,20}"), 0..4),
            cdi in proptest::collection::vec("[a-z.]{1,8}/[a-z]{1,4}=[a-z0-9]{1,3}", 0..3),
            owner_is_me in proptest::bool::ANY,
            gpu_minor in 0i64..4,
        ) {
            let other = ContainerAdjustment {
                env: env.iter().map(|(k, v)| kv(k, v)).collect(),
                mounts: mounts.iter().map(|(d, s)| mount(d, s)).collect(),
                cdi_devices: cdi.iter().map(|n| CdiDevice { name: n.clone() }).collect(),
                linux: Some(LinuxContainerAdjustment {
                    devices: devs.iter().map(|(p, ma, mi)| dev(p, *ma, *mi)).collect(),
                    resources: Some(LinuxResources {
                        devices: rules.iter().map(|(ma, mi, a, t)| {
                            let mut r = rule(*ma, *mi, a);
                            r.r#type = t.clone();
                            r
                        }).collect(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let owner = if owner_is_me { ME } else { OTHER };
            let mut owned: Vec<(Field, &str, &str)> = Vec::new();
            owned.extend(env.iter().map(|(k, _)| (Field::Env, *k, owner)));
            owned.extend(devs.iter().map(|(p, _, _)| (Field::Devices, p.as_str(), OTHER)));
            owned.extend(mounts.iter().map(|(d, _)| (Field::Mounts, d.as_str(), OTHER)));
            for d in [Decided::default(), granted()] {
                let r = request(&d, other.clone(), &owned);
                if let Err(e) = validate(&r, ME, Some(&d), &TestNode) {
                    let line = e.to_string();
                    proptest::prop_assert!(!line.contains('\n'), "{line}");
                }
                // The same, plus a GPU node (not the planned one) from another plugin.
                let mut with_gpu = other.clone();
                with_gpu.linux.as_mut().unwrap().devices.push(dev("/dev/nvidia0", 195, gpu_minor + 2));
                let mut owned = owned.clone();
                owned.push((Field::Devices, "/dev/nvidia0", OTHER));
                let r = request(&d, with_gpu, &owned);
                proptest::prop_assert!(validate(&r, ME, Some(&d), &TestNode).is_err());
            }
        }
    }
}
