//! A final [`Plan`] rendered as NRI's [`ContainerAdjustment`] — the NRI counterpart of
//! the runtime handler's spec edits (`runtime::apply`). Pure: the plan, the container as NRI describes it (for what must be
//! removed) and the configuration (the ld-cache hook's command line) in, the adjustment out.
//!
//! What the runtime writes into `config.json`, and how NRI (v0.12.0's spec generator) gets the
//! same result:
//! * device nodes → `linux.devices` (type, major, minor, file mode, uid, gid); NRI also adds an
//!   allow rule for each, and the plan's cgroup rules go in `linux.resources.devices`;
//! * mounts → `mounts` (a bind gets the `bind` option); the container's own mounts at or below a
//!   destination gpufence reserves (`/run/gpufence`, the shim, `/etc/ld.so.preload`) are removed
//!   with NRI's removal marker (a destination prefixed `-`), as the runtime drops them;
//! * env → `env`: the plan's, then its overrides (the later value of a key wins), one entry per
//!   key. NRI replaces a variable's first occurrence only — a later duplicate in the container's
//!   env would win back — and forwards no env removal to the runtime, so a container whose env
//!   repeats a key the plan sets is refused, unless the last occurrence (the one runc keeps)
//!   needs no change: the plan's value, or an `NVIDIA_VISIBLE_DEVICES` that requests no device
//!   (a CUDA image's `all` then the `void` of a DRA driver's CDI spec);
//! * hooks → `hooks` by stage: the plan's own (e.g. the driver memory-limits createRuntime hook),
//!   after the ld-cache refresh where one is needed (below);
//! * the driver folders (`runtime.driver-layout = "folders"`, the default, where the node made
//!   them: [`crate::plan::folders::DriverFolders`]) in place of the per-file driver binds: their
//!   mounts, `PATH` naming the binaries' folder, and `LD_LIBRARY_PATH` naming the library folder
//!   after the container's own entries — how the driver is found by soname without a process per
//!   container (CreateContainer comes before the rootfs is mounted, so the plugin cannot write
//!   the ld cache as `gpufence-runtime` does). With the `files` layout (or where the folders
//!   could not be made) the per-file binds and the createContainer hook
//!   ([`crate::plan::ldcache_hook`] for `plan.ld_cache`) that refreshes the ld cache, first.
//!
//! A plan NRI cannot express (supplementary groups) is refused, never half applied.

use std::collections::BTreeMap;

use super::api::{
    Container, ContainerAdjustment, Hook, Hooks, KeyValue, LinuxContainerAdjustment, LinuxDevice,
    LinuxDeviceCgroup, LinuxResources, Mount, OptionalFileMode, OptionalInt, OptionalInt64,
    OptionalUInt32,
};
use crate::cdi::{DeviceNodeEdit, HookEdit, MountEdit};
use crate::config::Config;
use crate::plan::{CgroupRule, Plan};

/// NRI's marker for "remove this" in a mount destination or env key.
pub const REMOVAL_MARKER: &str = "-";

/// Why a plan cannot be rendered as an adjustment. One line each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdjustError {
    #[error("device node {0}: major/minor not resolved")]
    Device(String),
    #[error("hook stage {0:?} is not an OCI hook stage")]
    HookStage(String),
    #[error(
        "env {0} is set more than once in the container; NRI replaces only the first and the \
         plan sets it"
    )]
    DuplicateEnv(String),
    #[error(
        "mount destination {0} appears more than once in the container; NRI removes only one \
         and it is reserved for gpufence"
    )]
    DuplicateMount(String),
    #[error("the plan adds supplementary groups {0:?}, which NRI cannot add")]
    Groups(Vec<u32>),
}

/// The adjustment for `plan` on container `ctr` (a variable the container already has, once,
/// with the plan's value is left as it is: [`render_decided`]).
pub fn render(
    cfg: &Config,
    plan: &Plan,
    ctr: &Container,
) -> Result<ContainerAdjustment, AdjustError> {
    render_decided(cfg, plan, ctr, &|_, planned, present| planned == present).map(|(a, _)| a)
}

/// Whether the container's `key=present` may stay in place of the plan's `key=planned`.
pub type Agrees<'a> = dyn Fn(&str, &str, &str) -> bool + 'a;

/// [`render`], with the plan's whole env (every key, also those left out of the adjustment).
/// A variable the container sets once (as it came, or as an earlier plugin left it) to a value
/// `agrees` accepts for the plan's (equal, or — `NVIDIA_VISIBLE_DEVICES` — naming the same
/// devices) is not set again: NRI refuses two plugins setting one key, and the container gets
/// the same.
pub fn render_decided(
    cfg: &Config,
    plan: &Plan,
    ctr: &Container,
    agrees: &Agrees,
) -> Result<(ContainerAdjustment, BTreeMap<String, String>), AdjustError> {
    if !plan.edits.additional_gids.is_empty() {
        return Err(AdjustError::Groups(plan.edits.additional_gids.clone()));
    }
    let mut linux = LinuxContainerAdjustment::default();
    for d in &plan.edits.device_nodes {
        linux.devices.push(device(d)?);
    }
    if !plan.cgroup_rules.is_empty() {
        linux.resources = Some(LinuxResources {
            devices: plan.cgroup_rules.iter().map(rule).collect(),
            ..Default::default()
        });
    }
    let (folder_env, library_path_set) = folder_env(plan, ctr);
    // The folders layout names the library folder in LD_LIBRARY_PATH instead (env below), unless
    // the container repeats LD_LIBRARY_PATH (NRI cannot change a repeated variable): the hook.
    let ld_hook = match &plan.driver_folders {
        Some(_) if library_path_set => None,
        _ => plan
            .layout_ld_cache()
            .map(|l| crate::plan::ldcache_hook(cfg, &l.folders)),
    };
    let (env, planned_env) = env(plan, &folder_env, ctr, agrees)?;
    let adjustment = ContainerAdjustment {
        env,
        mounts: mounts(plan, ctr)?,
        hooks: hooks(ld_hook.iter().chain(&plan.edits.hooks))?,
        linux: (linux != LinuxContainerAdjustment::default()).then_some(linux),
        ..Default::default()
    };
    Ok((adjustment, planned_env))
}

fn device(d: &DeviceNodeEdit) -> Result<LinuxDevice, AdjustError> {
    let (Some(major), Some(minor)) = (d.major, d.minor) else {
        return Err(AdjustError::Device(d.path.clone()));
    };
    Ok(LinuxDevice {
        path: d.path.clone(),
        r#type: d.kind.clone().unwrap_or_else(|| "c".to_string()),
        major,
        minor,
        file_mode: d.file_mode.map(|value| OptionalFileMode { value }),
        uid: d.uid.map(|value| OptionalUInt32 { value }),
        gid: d.gid.map(|value| OptionalUInt32 { value }),
    })
}

fn rule(r: &CgroupRule) -> LinuxDeviceCgroup {
    LinuxDeviceCgroup {
        allow: true,
        r#type: r.kind.to_string(),
        major: Some(OptionalInt64 {
            value: i64::from(r.major),
        }),
        minor: Some(OptionalInt64 {
            value: i64::from(r.minor),
        }),
        access: r.access.clone(),
    }
}

/// The driver folders' env (`PATH`, `LD_LIBRARY_PATH`) the adjustment can set: a variable the
/// container sets more than once is left alone (NRI replaces only its first occurrence and runc
/// keeps the last; CRI-O repeats `PATH`) — a convenience, not a fence: `PATH` then lacks the
/// binaries' folder, and the ld cache hook stands in for `LD_LIBRARY_PATH`. Returns the entries
/// and whether `LD_LIBRARY_PATH` is among them (or needed none).
fn folder_env<'p>(plan: &'p Plan, ctr: &Container) -> (Vec<&'p String>, bool) {
    let Some(f) = &plan.driver_folders else {
        return (Vec::new(), false);
    };
    let repeated = |entry: &str| {
        let key = entry.split_once('=').map_or(entry, |(k, _)| k);
        let n = ctr
            .env
            .iter()
            .filter(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k) == key)
            .count();
        if n > 1 {
            tracing::info!(
                container = %ctr.id,
                key,
                "env repeated in the container: the driver folders leave it alone"
            );
        }
        n > 1
    };
    let out: Vec<&String> = f
        .env
        .iter()
        .chain(&f.library_path)
        .filter(|e| !repeated(e))
        .collect();
    let library = f.library_path.as_ref().is_none_or(|l| out.contains(&l));
    (out, library)
}

/// The plan's env, the driver folders' (`folder_env`), then the plan's overrides, one entry per
/// key (the last value), in first-seen order; and every key the plan sets with its value.
fn env(
    plan: &Plan,
    folder_env: &[&String],
    ctr: &Container,
    agrees: &Agrees,
) -> Result<(Vec<KeyValue>, BTreeMap<String, String>), AdjustError> {
    let mut order: Vec<&str> = Vec::new();
    let mut values: BTreeMap<&str, &str> = BTreeMap::new();
    for e in plan
        .edits
        .env
        .iter()
        .chain(folder_env.iter().copied())
        .chain(&plan.env_overrides)
    {
        let (k, v) = e.split_once('=').unwrap_or((e.as_str(), ""));
        if values.insert(k, v).is_none() {
            order.push(k);
        }
    }
    // Per key of the container's env: how often it is set and its last value (the one the
    // container gets: runc keeps the last of a repeated variable).
    let mut seen: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
    for e in &ctr.env {
        let (k, v) = e.split_once('=').unwrap_or((e.as_str(), ""));
        let s = seen.entry(k).or_default();
        *s = (s.0 + 1, v);
    }
    let mut kept: Vec<&str> = Vec::with_capacity(order.len());
    for k in order {
        match seen.get(k) {
            Some((n, last)) if *n > 1 => {
                if !repeated_is_settled(k, values[k], last) {
                    return Err(AdjustError::DuplicateEnv(k.to_string()));
                }
                tracing::info!(
                    key = k,
                    last = *last,
                    plan = values[k],
                    "env repeated in the container, its last value needs no change: left as is"
                );
            }
            Some((1, present)) if agrees(k, values[k], present) => {
                tracing::info!(
                    container = %ctr.id,
                    key = k,
                    present = *present,
                    plan = values[k],
                    "env already as planned in the container (or an earlier plugin): left as is"
                );
            }
            _ => kept.push(k),
        }
    }
    let set = kept
        .into_iter()
        .map(|k| KeyValue {
            key: k.to_string(),
            value: values[k].to_string(),
        })
        .collect();
    let planned = values
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok((set, planned))
}

/// Whether a variable the container sets more than once (NRI would let its last occurrence win
/// back over the adjustment) can be left as the container has it: its last value is the plan's,
/// or — `NVIDIA_VISIBLE_DEVICES` — it requests no device, so no GPU tooling can act on it (the
/// fence is the device nodes and cgroup rules, not this variable). A CUDA image's `all` followed
/// by the `void` a DRA driver's or device plugin's CDI spec sets is such a case.
fn repeated_is_settled(key: &str, plan: &str, last: &str) -> bool {
    use crate::allocation::container_dialects::{NVIDIA_VISIBLE_DEVICES, nvd_requests_nothing};
    last == plan || (key == NVIDIA_VISIBLE_DEVICES && nvd_requests_nothing(last))
}

/// Removals of the container's mounts at reserved destinations (when the plan mounts its
/// state), then the plan's mounts in its order (the driver folders' where settled).
fn mounts(plan: &Plan, ctr: &Container) -> Result<Vec<Mount>, AdjustError> {
    let mut out = Vec::new();
    if plan.state_dir.is_some() {
        let mut removed: Vec<&str> = Vec::new();
        for m in &ctr.mounts {
            let d = m.destination.as_str();
            if !crate::plan::is_reserved_destination(d) {
                continue;
            }
            if removed.contains(&d) {
                return Err(AdjustError::DuplicateMount(d.to_string()));
            }
            removed.push(d);
            // A destination the plan mounts is replaced by NRI anyway; the marker stays harmless.
            out.push(Mount {
                destination: format!("{REMOVAL_MARKER}{d}"),
                ..Default::default()
            });
        }
    }
    out.extend(plan.layout_mounts().iter().map(mount));
    Ok(out)
}

fn mount(m: &MountEdit) -> Mount {
    let kind = m.kind.clone().unwrap_or_else(|| "bind".to_string());
    let mut options = m.options.clone();
    if kind == "bind" && !options.iter().any(|o| o == "bind" || o == "rbind") {
        options.push("bind".to_string());
    }
    Mount {
        destination: m.container_path.clone(),
        r#type: kind,
        source: m.host_path.clone(),
        options,
    }
}

fn hooks<'a>(list: impl Iterator<Item = &'a HookEdit>) -> Result<Option<Hooks>, AdjustError> {
    let mut out = Hooks::default();
    for h in list {
        let stage = match h.hook_name.as_str() {
            "prestart" => &mut out.prestart,
            "createRuntime" => &mut out.create_runtime,
            "createContainer" => &mut out.create_container,
            "startContainer" => &mut out.start_container,
            "poststart" => &mut out.poststart,
            "poststop" => &mut out.poststop,
            other => return Err(AdjustError::HookStage(other.to_string())),
        };
        let hook = Hook {
            path: h.path.clone(),
            args: h.args.clone(),
            env: h.env.clone(),
            timeout: h.timeout.map(|value| OptionalInt { value }),
        };
        if !stage.contains(&hook) {
            stage.push(hook);
        }
    }
    Ok((out != Hooks::default()).then_some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::ContainerEdits;
    use crate::plan::{CONTAINER_SHIM_PATH, CONTAINER_STATE_DIR, LdCache};

    fn gpu_plan() -> Plan {
        Plan {
            container_id: "c1".into(),
            edits: ContainerEdits {
                env: vec![
                    "GPUFENCE_MEMORY_LIMIT_0=1073741824".into(),
                    "GPUFENCE_STATE=/run/gpufence".into(),
                    "NVIDIA_VISIBLE_DEVICES=GPU-1".into(),
                ],
                device_nodes: vec![DeviceNodeEdit {
                    path: "/dev/nvidia1".into(),
                    kind: Some("c".into()),
                    major: Some(195),
                    minor: Some(1),
                    file_mode: Some(0o666),
                    gid: Some(44),
                    ..Default::default()
                }],
                mounts: vec![
                    MountEdit {
                        host_path: "/drv/libnvidia-ml.so.1".into(),
                        container_path: "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1".into(),
                        kind: None,
                        options: vec!["ro".into(), "nosuid".into(), "nodev".into()],
                    },
                    MountEdit {
                        host_path: "tmpfs".into(),
                        container_path: CONTAINER_STATE_DIR.into(),
                        kind: Some("tmpfs".into()),
                        options: vec!["size=1m".into()],
                    },
                    MountEdit {
                        host_path: "/state/c1/quota".into(),
                        container_path: "/run/gpufence/quota".into(),
                        kind: Some("bind".into()),
                        options: vec!["rbind".into(), "ro".into()],
                    },
                ],
                hooks: vec![HookEdit {
                    hook_name: "createRuntime".into(),
                    path: "/usr/bin/gpufence".into(),
                    args: vec!["gpufence".into(), "hook".into(), "memory-limits".into()],
                    env: vec![],
                    timeout: Some(5),
                }],
                ..Default::default()
            },
            cgroup_rules: vec![CgroupRule {
                kind: 'c',
                major: 195,
                minor: 1,
                access: "rw".into(),
            }],
            state_dir: Some("/state/c1".into()),
            env_overrides: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
            ld_cache: Some(LdCache {
                folders: vec!["/usr/lib/x86_64-linux-gnu".into()],
            }),
            ..Default::default()
        }
    }

    fn ctr(env: &[&str], mounts: &[&str]) -> Container {
        Container {
            id: "c1".into(),
            env: env.iter().map(|e| e.to_string()).collect(),
            mounts: mounts
                .iter()
                .map(|d| Mount {
                    destination: d.to_string(),
                    source: "/x".into(),
                    r#type: "bind".into(),
                    options: vec![],
                })
                .collect(),
            ..Default::default()
        }
    }

    fn cfg() -> Config {
        Config {
            gpufence_binary: "/usr/bin/gpufence".into(),
            ..Config::default()
        }
    }

    #[test]
    fn an_empty_plan_is_an_empty_adjustment() {
        let a = render(&cfg(), &Plan::default(), &ctr(&["PATH=/bin"], &["/proc"])).unwrap();
        assert_eq!(a, ContainerAdjustment::default());
    }

    #[test]
    fn devices_and_cgroup_rules() {
        let a = render(&cfg(), &gpu_plan(), &ctr(&[], &[])).unwrap();
        let linux = a.linux.unwrap();
        assert_eq!(
            linux.devices,
            vec![LinuxDevice {
                path: "/dev/nvidia1".into(),
                r#type: "c".into(),
                major: 195,
                minor: 1,
                file_mode: Some(OptionalFileMode { value: 0o666 }),
                uid: None,
                gid: Some(OptionalUInt32 { value: 44 }),
            }]
        );
        let rules = linux.resources.unwrap().devices;
        assert_eq!(rules.len(), 1);
        assert!(rules[0].allow);
        assert_eq!(
            (rules[0].r#type.as_str(), rules[0].access.as_str()),
            ("c", "rw")
        );
        assert_eq!(rules[0].major, Some(OptionalInt64 { value: 195 }));
        assert_eq!(rules[0].minor, Some(OptionalInt64 { value: 1 }));
        // Unresolved numbers: refused, not a device with 0:0.
        let mut p = gpu_plan();
        p.edits.device_nodes[0].minor = None;
        assert_eq!(
            render(&cfg(), &p, &ctr(&[], &[])).unwrap_err(),
            AdjustError::Device("/dev/nvidia1".into())
        );
    }

    #[test]
    fn env_is_the_plan_s_then_its_overrides_one_entry_per_key() {
        let a = render(&cfg(), &gpu_plan(), &ctr(&["PATH=/bin", "A=1"], &[])).unwrap();
        let kv: Vec<(String, String)> = a.env.into_iter().map(|e| (e.key, e.value)).collect();
        assert_eq!(
            kv,
            vec![
                ("GPUFENCE_MEMORY_LIMIT_0".into(), "1073741824".into()),
                ("GPUFENCE_STATE".into(), "/run/gpufence".into()),
                ("NVIDIA_VISIBLE_DEVICES".into(), "void".into()),
            ]
        );
        // A key the plan sets, repeated in the container's env: refused (NRI would let the
        // later duplicate win back); a repeated key the plan does not set is left alone.
        for env in [
            ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all"],
            ["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=0"],
            ["GPUFENCE_STATE=/run/gpufence", "GPUFENCE_STATE=/x"],
        ] {
            let e = render(&cfg(), &gpu_plan(), &ctr(&env, &[])).unwrap_err();
            let key = env[0].split_once('=').unwrap().0;
            assert_eq!(e, AdjustError::DuplicateEnv(key.into()), "{env:?}");
        }
        render(&cfg(), &gpu_plan(), &ctr(&["A=1", "A=2"], &[])).unwrap();
    }

    #[test]
    fn a_variable_set_once_to_an_agreeing_value_is_left_to_whoever_set_it() {
        // As the handler asks: koordlet's minors for the granted GPU (minor 1) agree with the
        // plan's UUID.
        let agrees = |k: &str, planned: &str, present: &str| {
            planned == present || (k == "NVIDIA_VISIBLE_DEVICES" && present == "1")
        };
        let mut p = gpu_plan();
        p.env_overrides.clear();
        let keys = |env: &[&str]| -> Vec<String> {
            let (a, planned) = render_decided(&cfg(), &p, &ctr(env, &[]), &agrees).unwrap();
            // The plan's whole env is kept for the validation, also what the answer leaves out.
            assert_eq!(planned["NVIDIA_VISIBLE_DEVICES"], "GPU-1");
            a.env.into_iter().map(|e| e.key).collect()
        };
        // koordlet's plugin set it before gpufence's: setting it again, NRI refuses the container.
        assert!(!keys(&["NVIDIA_VISIBLE_DEVICES=1"]).contains(&"NVIDIA_VISIBLE_DEVICES".into()));
        assert!(!keys(&["GPUFENCE_STATE=/run/gpufence"]).contains(&"GPUFENCE_STATE".into()));
        // Any other value (the image's `all`), none, or a repeated one is the plan's to set.
        for other in [&["NVIDIA_VISIBLE_DEVICES=all"][..], &[]] {
            assert!(
                keys(other).contains(&"NVIDIA_VISIBLE_DEVICES".into()),
                "{other:?}"
            );
        }
        let e = render_decided(
            &cfg(),
            &p,
            &ctr(
                &["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES=2"],
                &[],
            ),
            &agrees,
        )
        .unwrap_err();
        assert_eq!(
            e,
            AdjustError::DuplicateEnv("NVIDIA_VISIBLE_DEVICES".into())
        );
    }

    #[test]
    fn a_repeated_variable_whose_last_value_needs_no_change_is_left_as_is() {
        let keys = |env: &[&str]| -> Vec<String> {
            let a = render(&cfg(), &gpu_plan(), &ctr(env, &[])).unwrap();
            a.env.into_iter().map(|e| e.key).collect()
        };
        // A CUDA image's `all`, then the `void` of a DRA driver's CDI spec: the container keeps
        // `void` (it requests no device), the rest of the plan's env is set.
        for last in ["void", "none", ""] {
            let nvd = format!("NVIDIA_VISIBLE_DEVICES={last}");
            assert_eq!(
                keys(&["NVIDIA_VISIBLE_DEVICES=all", &nvd]),
                ["GPUFENCE_MEMORY_LIMIT_0", "GPUFENCE_STATE"],
                "{last:?}"
            );
        }
        // Repeated with the plan's own value last: nothing to set.
        assert_eq!(
            keys(&["GPUFENCE_STATE=/x", "GPUFENCE_STATE=/run/gpufence"]),
            ["GPUFENCE_MEMORY_LIMIT_0", "NVIDIA_VISIBLE_DEVICES"]
        );
    }

    #[test]
    fn mounts_replace_the_reserved_destinations() {
        let c = ctr(
            &[],
            &[
                "/proc",
                "/run/gpufence",
                "/run/gpufence/planted",
                "/etc/ld.so.preload",
                CONTAINER_SHIM_PATH,
                "/run/gpufencex",
            ],
        );
        let a = render(&cfg(), &gpu_plan(), &c).unwrap();
        let dests: Vec<&str> = a.mounts.iter().map(|m| m.destination.as_str()).collect();
        assert_eq!(
            dests,
            vec![
                "-/run/gpufence",
                "-/run/gpufence/planted",
                "-/etc/ld.so.preload",
                "-/usr/lib/gpufence/libgpufence.so",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                "/run/gpufence",
                "/run/gpufence/quota",
            ]
        );
        let lib = &a.mounts[4];
        assert_eq!(lib.r#type, "bind");
        assert_eq!(lib.options, vec!["ro", "nosuid", "nodev", "bind"]);
        assert_eq!(a.mounts[6].options, vec!["rbind", "ro"]);
        assert_eq!(
            (a.mounts[5].r#type.as_str(), a.mounts[5].source.as_str()),
            ("tmpfs", "tmpfs")
        );
        // Two mounts at one reserved destination: NRI would remove only one.
        let c = ctr(&[], &["/run/gpufence", "/run/gpufence"]);
        assert_eq!(
            render(&cfg(), &gpu_plan(), &c).unwrap_err(),
            AdjustError::DuplicateMount("/run/gpufence".into())
        );
        // A plan without state (no GPU) removes nothing.
        let p = Plan {
            env_overrides: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
            ..Default::default()
        };
        let a = render(&cfg(), &p, &ctr(&[], &["/run/gpufence"])).unwrap();
        assert!(a.mounts.is_empty());
        assert_eq!(a.env.len(), 1);
        assert_eq!(a.linux, None);
        assert_eq!(a.hooks, None);
    }

    /// Attack: a pod volume at `/run/x/../gpufence` (runc resolves `..` inside the rootfs) was
    /// not taken for a reserved destination: not removed, and NRI's parent-first sort put it
    /// after gpufence's state tmpfs — the pod's own files in place of the quota.
    #[test]
    fn dot_dot_destinations_are_reserved_too() {
        let sneaky = [
            "/run/x/../gpufence",
            "/../run/gpufence/quota",
            "/etc/./x/../ld.so.preload",
            "/usr/lib/gpufence/../gpufence/libgpufence.so",
        ];
        let a = render(&cfg(), &gpu_plan(), &ctr(&[], &sneaky)).unwrap();
        for d in sneaky {
            let removal = format!("{REMOVAL_MARKER}{d}");
            assert!(
                a.mounts.iter().any(|m| m.destination == removal),
                "{d} not removed"
            );
        }
        // `..` above a reserved path leaves it.
        assert!(!crate::plan::is_reserved_destination("/run/gpufence/.."));
        assert!(!crate::plan::is_reserved_destination("/run/gpufence/../x"));
    }

    #[test]
    fn hooks_ld_cache_first_then_the_plan_s() {
        let a = render(&cfg(), &gpu_plan(), &ctr(&[], &[])).unwrap();
        let h = a.hooks.unwrap();
        assert_eq!(h.create_container.len(), 1);
        let ld = &h.create_container[0];
        assert_eq!(ld.path, "/usr/bin/gpufence");
        assert_eq!(
            ld.args,
            vec![
                "gpufence",
                "hook",
                "update-ldcache",
                "--folder",
                "/usr/lib/x86_64-linux-gnu"
            ]
        );
        assert_eq!(ld.env, vec!["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]);
        assert_eq!(ld.timeout, Some(OptionalInt { value: 10 }));
        assert_eq!(h.create_runtime.len(), 1);
        assert_eq!(h.create_runtime[0].args[2], "memory-limits");
        assert_eq!(h.create_runtime[0].timeout, Some(OptionalInt { value: 5 }));
        // No ld cache in the plan: no refresh hook.
        let mut p = gpu_plan();
        p.ld_cache = None;
        let h = render(&cfg(), &p, &ctr(&[], &[])).unwrap().hooks.unwrap();
        assert!(h.create_container.is_empty());
        p.edits.hooks[0].hook_name = "bogus".into();
        assert_eq!(
            render(&cfg(), &p, &ctr(&[], &[])).unwrap_err(),
            AdjustError::HookStage("bogus".into())
        );
    }

    /// The folders layout: folder binds in place of the per-file ones, `PATH` and
    /// `LD_LIBRARY_PATH` naming the folders, and no ld cache hook (no process per container).
    #[test]
    fn driver_folders_replace_the_file_binds_and_the_ld_cache_hook() {
        let mut p = gpu_plan();
        let folder = MountEdit {
            host_path: "/var/lib/gpufence/driver-folders/580-0123/lib".into(),
            container_path: crate::plan::folders::LIB_FOLDER.into(),
            kind: None,
            options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
        };
        let mut mounts = vec![folder];
        mounts.extend(p.edits.mounts[1..].iter().cloned());
        p.driver_folders = Some(crate::plan::folders::DriverFolders {
            mounts,
            env: vec!["PATH=/bin:/usr/local/nvidia/bin".into()],
            library_path: Some("LD_LIBRARY_PATH=/opt/lib:/usr/local/nvidia/lib64".into()),
            ld_cache: Some(LdCache {
                folders: vec![crate::plan::folders::LIB_FOLDER.into()],
            }),
            ..Default::default()
        });
        let a = render(
            &cfg(),
            &p,
            &ctr(&["PATH=/bin", "LD_LIBRARY_PATH=/opt/lib"], &[]),
        )
        .unwrap();
        let dests: Vec<&str> = a.mounts.iter().map(|m| m.destination.as_str()).collect();
        assert_eq!(
            dests,
            [
                "/usr/local/nvidia/lib64",
                "/run/gpufence",
                "/run/gpufence/quota"
            ]
        );
        let kv: Vec<(&str, &str)> = a
            .env
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(
            kv[3..],
            [
                ("PATH", "/bin:/usr/local/nvidia/bin"),
                ("LD_LIBRARY_PATH", "/opt/lib:/usr/local/nvidia/lib64"),
            ]
        );
        let h = a.hooks.unwrap();
        assert!(h.create_container.is_empty(), "no ld cache hook: {h:?}");
        assert_eq!(h.create_runtime.len(), 1, "the plan's own hooks stay");
        // A container repeating PATH (CRI-O does) or LD_LIBRARY_PATH: NRI cannot change the
        // variable, so the folders leave it alone — PATH without the binaries' folder, the ld
        // cache hook in place of LD_LIBRARY_PATH.
        let c = ctr(&["PATH=/bin", "PATH=/usr/bin:/bin"], &[]);
        let a = render(&cfg(), &p, &c).unwrap();
        assert!(a.env.iter().all(|e| e.key != "PATH"), "{:?}", a.env);
        assert!(a.env.iter().any(|e| e.key == "LD_LIBRARY_PATH"));
        assert!(a.hooks.unwrap().create_container.is_empty());
        let c = ctr(&["LD_LIBRARY_PATH=/a", "LD_LIBRARY_PATH=/b"], &[]);
        let a = render(&cfg(), &p, &c).unwrap();
        assert!(
            a.env.iter().all(|e| e.key != "LD_LIBRARY_PATH"),
            "{:?}",
            a.env
        );
        assert_eq!(
            a.hooks.unwrap().create_container.len(),
            1,
            "the ld cache hook"
        );
    }

    #[test]
    fn supplementary_groups_are_refused() {
        let mut p = gpu_plan();
        p.edits.additional_gids = vec![44];
        assert_eq!(
            render(&cfg(), &p, &ctr(&[], &[])).unwrap_err(),
            AdjustError::Groups(vec![44])
        );
    }
}
