//! Apply a [`Plan`] to an OCI `config.json`, edited as JSON so that fields gpufence does not
//! know survive untouched. Pure and idempotent: applying the same plan twice gives the same
//! document (device nodes are keyed by path, cgroup rules by content, mounts by destination, env
//! by key, hooks by content).

use serde_json::{Map, Value, json};

use crate::cdi::{DeviceNodeEdit, HookEdit, MountEdit};
use crate::plan::{CgroupRule, Plan};

/// Why a plan could not be applied to a spec (the spec is malformed where the edit goes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("config.json: {field} is not {expected}")]
    Shape {
        field: &'static str,
        expected: &'static str,
    },
    #[error("config.json: hook stage {0:?} is not an OCI hook stage")]
    HookStage(String),
    #[error("device node {path}: {why}")]
    Device { path: String, why: &'static str },
}

const HOOK_STAGES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// What the runtime renders besides the plan's edits — its own rendering choices for the
/// plan's typed parts, never a change to the plan.
#[derive(Debug, Default)]
pub struct Render<'a> {
    /// Mounts written in place of `plan.edits.mounts` (the plan's driver folders layout, where
    /// the runtime prepared it).
    pub mounts: Option<&'a [MountEdit]>,
    /// Env set after the plan's and before its overrides (the folders layout's `PATH`).
    pub env: &'a [String],
    /// Hooks before the plan's (the ld cache hook, where runc must run it).
    pub hooks: Vec<HookEdit>,
}

/// Edit `spec` (a parsed `config.json`) by `plan`, rendered as-is. On error the spec may be
/// partly edited; the caller works on a copy and writes nothing.
pub fn apply_to_spec(spec: &mut Value, plan: &Plan) -> Result<(), ApplyError> {
    render_spec(spec, plan, &Render::default())
}

/// Edit `spec` by `plan` with the runtime's `render` choices ([`Render`]).
pub fn render_spec(spec: &mut Value, plan: &Plan, render: &Render) -> Result<(), ApplyError> {
    let root = obj(spec, "config.json")?;

    // Environment: plan env, the rendering's, then the neutralising overrides (these win).
    let env_edits: Vec<&String> = plan
        .edits
        .env
        .iter()
        .chain(render.env.iter())
        .chain(plan.env_overrides.iter())
        .collect();
    if !env_edits.is_empty() {
        let process = obj(child(root, "process"), "process")?;
        let env = arr(child_arr(process, "env"), "process.env")?;
        for e in env_edits {
            set_env(env, e);
        }
    }

    if !plan.edits.device_nodes.is_empty() || !plan.cgroup_rules.is_empty() {
        let linux = obj(child(root, "linux"), "linux")?;
        if !plan.edits.device_nodes.is_empty() {
            let devices = arr(child_arr(linux, "devices"), "linux.devices")?;
            for d in &plan.edits.device_nodes {
                let v = device_json(d)?;
                upsert_by(devices, v, "path");
            }
        }
        if !plan.cgroup_rules.is_empty() {
            let resources = obj(child(linux, "resources"), "linux.resources")?;
            let rules = arr(child_arr(resources, "devices"), "linux.resources.devices")?;
            for r in &plan.cgroup_rules {
                let v = rule_json(r);
                if !rules.contains(&v) {
                    rules.push(v);
                }
            }
        }
    }

    let plan_mounts = render.mounts.unwrap_or(&plan.edits.mounts);
    if !plan_mounts.is_empty() {
        let mounts = arr(child_arr(root, "mounts"), "mounts")?;
        if plan.state_dir.is_some() {
            // Image volumes and spec mounts at or below what gpufence mounts (the state tmpfs,
            // the quota, the shim, ld.so.preload) would hide or replace it: dropped, then ours
            // appended parent-first (the plan's order).
            mounts.retain(|m| {
                !m.get("destination")
                    .and_then(|d| d.as_str())
                    .is_some_and(crate::plan::is_reserved_destination)
            });
        }
        for m in plan_mounts {
            upsert_by(mounts, mount_json(m), "destination");
        }
    }

    if !plan.edits.hooks.is_empty() || !render.hooks.is_empty() {
        let hooks = obj(child(root, "hooks"), "hooks")?;
        for h in render.hooks.iter().chain(&plan.edits.hooks) {
            if !HOOK_STAGES.contains(&h.hook_name.as_str()) {
                return Err(ApplyError::HookStage(h.hook_name.clone()));
            }
            let stage = match hooks.get_mut(h.hook_name.as_str()) {
                Some(v) => v,
                None => {
                    hooks.insert(h.hook_name.clone(), Value::Array(Vec::new()));
                    hooks.get_mut(h.hook_name.as_str()).expect("just inserted")
                }
            };
            let list = arr(stage, "hooks.<stage>")?;
            let v = hook_json(h);
            if !list.contains(&v) {
                list.push(v);
            }
        }
    }

    if !plan.edits.additional_gids.is_empty() {
        let process = obj(child(root, "process"), "process")?;
        let user = obj(child(process, "user"), "process.user")?;
        let gids = arr(
            child_arr(user, "additionalGids"),
            "process.user.additionalGids",
        )?;
        for g in &plan.edits.additional_gids {
            let v = json!(g);
            if !gids.contains(&v) {
                gids.push(v);
            }
        }
    }
    Ok(())
}

fn obj<'a>(
    v: &'a mut Value,
    field: &'static str,
) -> Result<&'a mut Map<String, Value>, ApplyError> {
    v.as_object_mut().ok_or(ApplyError::Shape {
        field,
        expected: "an object",
    })
}

fn arr<'a>(v: &'a mut Value, field: &'static str) -> Result<&'a mut Vec<Value>, ApplyError> {
    v.as_array_mut().ok_or(ApplyError::Shape {
        field,
        expected: "an array",
    })
}

/// `m[key]`, created as `{}` when missing or null.
fn child<'a>(m: &'a mut Map<String, Value>, key: &str) -> &'a mut Value {
    let v = m.entry(key.to_string()).or_insert(Value::Null);
    if v.is_null() {
        *v = Value::Object(Map::new());
    }
    v
}

/// `m[key]`, created as `[]` when missing or null.
fn child_arr<'a>(m: &'a mut Map<String, Value>, key: &str) -> &'a mut Value {
    let v = m.entry(key.to_string()).or_insert(Value::Null);
    if v.is_null() {
        *v = Value::Array(Vec::new());
    }
    v
}

/// Replace `KEY=…` in place (first occurrence; later duplicates removed), else append.
fn set_env(env: &mut Vec<Value>, entry: &str) {
    let key = entry.split('=').next().unwrap_or_default();
    let same_key = |v: &Value| {
        v.as_str()
            .is_some_and(|s| s.split('=').next().unwrap_or_default() == key)
    };
    match env.iter().position(same_key) {
        Some(pos) => {
            env[pos] = Value::String(entry.to_string());
            let mut i = pos + 1;
            while i < env.len() {
                if same_key(&env[i]) {
                    env.remove(i);
                } else {
                    i += 1;
                }
            }
        }
        None => env.push(Value::String(entry.to_string())),
    }
}

/// Replace the element whose `key` field equals the new one's (first; later duplicates removed),
/// else append.
fn upsert_by(list: &mut Vec<Value>, new: Value, key: &str) {
    let k = new.get(key).cloned();
    let same = |v: &Value| v.get(key) == k.as_ref();
    match list.iter().position(same) {
        Some(pos) => {
            list[pos] = new;
            let mut i = pos + 1;
            while i < list.len() {
                if same(&list[i]) {
                    list.remove(i);
                } else {
                    i += 1;
                }
            }
        }
        None => list.push(new),
    }
}

fn device_json(d: &DeviceNodeEdit) -> Result<Value, ApplyError> {
    let (Some(major), Some(minor)) = (d.major, d.minor) else {
        return Err(ApplyError::Device {
            path: d.path.clone(),
            why: "major/minor not resolved",
        });
    };
    let mut m = Map::new();
    m.insert("path".into(), json!(d.path));
    m.insert("type".into(), json!(d.kind.as_deref().unwrap_or("c")));
    m.insert("major".into(), json!(major));
    m.insert("minor".into(), json!(minor));
    if let Some(mode) = d.file_mode {
        m.insert("fileMode".into(), json!(mode));
    }
    if let Some(uid) = d.uid {
        m.insert("uid".into(), json!(uid));
    }
    if let Some(gid) = d.gid {
        m.insert("gid".into(), json!(gid));
    }
    Ok(Value::Object(m))
}

fn rule_json(r: &CgroupRule) -> Value {
    json!({
        "allow": true,
        "type": r.kind.to_string(),
        "major": r.major,
        "minor": r.minor,
        "access": r.access,
    })
}

fn mount_json(m: &MountEdit) -> Value {
    let mut options = m.options.clone();
    let kind = m.kind.clone().unwrap_or_else(|| "bind".to_string());
    if kind == "bind" && !options.iter().any(|o| o == "bind" || o == "rbind") {
        options.push("bind".to_string());
    }
    json!({
        "destination": m.container_path,
        "type": kind,
        "source": m.host_path,
        "options": options,
    })
}

fn hook_json(h: &HookEdit) -> Value {
    let mut m = Map::new();
    m.insert("path".into(), json!(h.path));
    if !h.args.is_empty() {
        m.insert("args".into(), json!(h.args));
    }
    if !h.env.is_empty() {
        m.insert("env".into(), json!(h.env));
    }
    if let Some(t) = h.timeout {
        m.insert("timeout".into(), json!(t));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::ContainerEdits;

    fn base_spec() -> Value {
        json!({
            "ociVersion": "1.0.2",
            "someFutureTopLevel": {"x": [1, 2]},
            "process": {"args": ["sh"], "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "A=1"], "futureProc": true},
            "root": {"path": "rootfs"},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {
                "futureField": "keep",
                "resources": {"devices": [{"allow": false, "access": "rwm"}], "memory": {"limit": 1}},
                "namespaces": [{"type": "mount"}]
            }
        })
    }

    fn gpu_plan() -> Plan {
        Plan {
            container_id: "c1".into(),
            edits: ContainerEdits {
                env: vec!["GPUFENCE_MEMORY_LIMIT_0=1073741824".into(), "A=2".into()],
                device_nodes: vec![
                    DeviceNodeEdit {
                        path: "/dev/nvidia1".into(),
                        host_path: Some("/sim/dev/nvidia1".into()),
                        kind: Some("c".into()),
                        major: Some(195),
                        minor: Some(1),
                        file_mode: Some(0o666),
                        permissions: Some("rw".into()),
                        uid: None,
                        gid: None,
                    },
                    DeviceNodeEdit {
                        path: "/dev/nvidiactl".into(),
                        host_path: Some("/sim/dev/nvidiactl".into()),
                        kind: Some("c".into()),
                        major: Some(195),
                        minor: Some(255),
                        file_mode: Some(0o666),
                        ..Default::default()
                    },
                ],
                hooks: vec![HookEdit {
                    hook_name: "createContainer".into(),
                    path: "/usr/bin/gpufence".into(),
                    args: vec!["gpufence".into(), "hook".into(), "update-ldcache".into()],
                    env: vec!["PATH=/usr/bin".into()],
                    timeout: Some(10),
                }],
                mounts: vec![
                    MountEdit {
                        host_path: "/run/gpufence/c1".into(),
                        container_path: "/run/gpufence".into(),
                        kind: None,
                        options: vec!["rw".into(), "nosuid".into(), "nodev".into(), "bind".into()],
                    },
                    MountEdit {
                        host_path: "/sim/driver/usr/lib/libcuda.so.1".into(),
                        container_path: "/usr/lib/libcuda.so.1".into(),
                        kind: None,
                        options: vec!["ro".into(), "nosuid".into(), "nodev".into()],
                    },
                ],
                ..Default::default()
            },
            cgroup_rules: vec![
                CgroupRule {
                    kind: 'c',
                    major: 195,
                    minor: 1,
                    access: "rw".into(),
                },
                CgroupRule {
                    kind: 'c',
                    major: 195,
                    minor: 255,
                    access: "rw".into(),
                },
            ],
            env_overrides: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
            ..Default::default()
        }
    }

    #[test]
    fn applies_every_edit_and_keeps_unknown_fields() {
        let mut s = base_spec();
        apply_to_spec(&mut s, &gpu_plan()).unwrap();
        assert_eq!(s["someFutureTopLevel"], json!({"x": [1, 2]}));
        assert_eq!(s["linux"]["futureField"], "keep");
        assert_eq!(s["process"]["futureProc"], true);
        assert_eq!(s["linux"]["resources"]["memory"]["limit"], 1);
        assert_eq!(
            s["process"]["env"],
            json!([
                "PATH=/bin",
                "NVIDIA_VISIBLE_DEVICES=void",
                "A=2",
                "GPUFENCE_MEMORY_LIMIT_0=1073741824"
            ])
        );
        assert_eq!(
            s["linux"]["devices"][0],
            json!({"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "fileMode": 438})
        );
        let rules = s["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(rules[0], json!({"allow": false, "access": "rwm"}));
        assert_eq!(
            rules[1],
            json!({"allow": true, "type": "c", "major": 195, "minor": 1, "access": "rw"})
        );
        assert_eq!(rules.len(), 3);
        let mounts = s["mounts"].as_array().unwrap();
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[2]["type"], "bind");
        assert_eq!(
            mounts[2]["options"],
            json!(["ro", "nosuid", "nodev", "bind"])
        );
        assert_eq!(
            s["hooks"]["createContainer"][0]["path"],
            "/usr/bin/gpufence"
        );
        assert_eq!(
            s["hooks"]["createContainer"][0]["env"],
            json!(["PATH=/usr/bin"])
        );
    }

    #[test]
    fn idempotent() {
        let mut once = base_spec();
        apply_to_spec(&mut once, &gpu_plan()).unwrap();
        let mut twice = once.clone();
        apply_to_spec(&mut twice, &gpu_plan()).unwrap();
        assert_eq!(once, twice);
        assert_eq!(
            serde_json::to_string(&once).unwrap(),
            serde_json::to_string(&twice).unwrap()
        );
    }

    #[test]
    fn replaces_same_path_and_destination() {
        let mut s = base_spec();
        s["linux"]["devices"] = json!([
            {"path": "/dev/nvidia1", "type": "c", "major": 1, "minor": 1},
            {"path": "/dev/nvidia1", "type": "c", "major": 2, "minor": 2}
        ]);
        s["mounts"] = json!([{"destination": "/run/gpufence", "type": "tmpfs", "source": "tmpfs"}]);
        apply_to_spec(&mut s, &gpu_plan()).unwrap();
        let devs = s["linux"]["devices"].as_array().unwrap();
        assert_eq!(devs.len(), 2);
        assert_eq!(devs[0]["major"], 195);
        assert_eq!(s["mounts"][0]["source"], "/run/gpufence/c1");
    }

    /// Issue 15.4: image volumes at or below gpufence's destinations are dropped and ours are
    /// mounted parent-first, so the read-only quota ends up on top of the state tmpfs.
    #[test]
    fn image_mounts_at_gpufence_destinations_are_dropped() {
        let mut s = base_spec();
        let vol = |d: &str| json!({"destination": d, "type": "bind", "source": "/var/vol", "options": ["rbind", "rw"]});
        s["mounts"] = json!([
            vol("/run/gpufence/quota"),
            vol("/run/gpufence//x/"),
            vol("/usr/lib/gpufence/libgpufence.so"),
            vol("/etc/ld.so.preload"),
            vol("/run/gpufencex"),
            vol("/data"),
        ]);
        let mut p = gpu_plan();
        p.state_dir = Some("/run/gpufence/c1".into());
        p.edits.mounts = vec![
            crate::plan::state_tmpfs(false),
            MountEdit {
                host_path: "/run/gpufence/c1/quota".into(),
                container_path: "/run/gpufence/quota".into(),
                kind: None,
                options: vec!["ro".into()],
            },
        ];
        apply_to_spec(&mut s, &p).unwrap();
        let got: Vec<(&str, &str)> = s["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["destination"].as_str().unwrap(),
                    m["source"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("/run/gpufencex", "/var/vol"),
                ("/data", "/var/vol"),
                ("/run/gpufence", "tmpfs"),
                ("/run/gpufence/quota", "/run/gpufence/c1/quota"),
            ]
        );
    }

    #[test]
    fn empty_plan_changes_nothing_and_neutralise_only_touches_env() {
        let orig = base_spec();
        let mut s = orig.clone();
        apply_to_spec(&mut s, &Plan::default()).unwrap();
        assert_eq!(s, orig);
        let p = Plan {
            env_overrides: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
            ..Plan::default()
        };
        apply_to_spec(&mut s, &p).unwrap();
        let mut expect = orig.clone();
        expect["process"]["env"][1] = json!("NVIDIA_VISIBLE_DEVICES=void");
        assert_eq!(s, expect);
        assert!(s.get("hooks").is_none());
        assert!(s["linux"].get("devices").is_none());
    }

    #[test]
    fn creates_missing_sections() {
        let mut s = json!({"ociVersion": "1.0.2", "process": {"args": ["sh"]}, "linux": null});
        apply_to_spec(&mut s, &gpu_plan()).unwrap();
        assert_eq!(s["linux"]["devices"].as_array().unwrap().len(), 2);
        assert_eq!(
            s["linux"]["resources"]["devices"].as_array().unwrap().len(),
            2
        );
        assert_eq!(s["process"]["env"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn malformed_spec_is_an_error() {
        let mut s = json!({"process": {"env": "PATH=/bin"}});
        let e = apply_to_spec(&mut s, &gpu_plan()).unwrap_err();
        assert!(e.to_string().contains("process.env"), "{e}");
        let mut s = json!([1]);
        assert!(apply_to_spec(&mut s, &gpu_plan()).is_err());
        let mut p = gpu_plan();
        p.edits.hooks[0].hook_name = "whenever".into();
        assert!(matches!(
            apply_to_spec(&mut base_spec(), &p),
            Err(ApplyError::HookStage(_))
        ));
        let mut p = gpu_plan();
        p.edits.device_nodes[0].major = None;
        assert!(apply_to_spec(&mut base_spec(), &p).is_err());
    }

    fn arb_plan() -> impl proptest::strategy::Strategy<Value = Plan> {
        use proptest::prelude::*;
        let env = proptest::collection::vec((0u8..4, 0u8..4), 0..6).prop_map(|v| {
            v.into_iter()
                .map(|(k, x)| format!("K{k}=v{x}"))
                .collect::<Vec<_>>()
        });
        let devs = proptest::collection::vec((0u8..4, 0i64..3), 0..5);
        let mounts = proptest::collection::vec((0u8..4, 0u8..3), 0..5);
        let rules = proptest::collection::vec(0u32..4, 0..5);
        let hooks = proptest::collection::vec(0u8..3, 0..4);
        (env.clone(), env, devs, mounts, rules, hooks).prop_map(
            |(env, over, devs, mounts, rules, hooks)| Plan {
                edits: ContainerEdits {
                    env,
                    device_nodes: devs
                        .into_iter()
                        .map(|(p, m)| DeviceNodeEdit {
                            path: format!("/dev/x{p}"),
                            kind: Some("c".into()),
                            major: Some(195),
                            minor: Some(m),
                            ..Default::default()
                        })
                        .collect(),
                    mounts: mounts
                        .into_iter()
                        .map(|(d, src)| MountEdit {
                            host_path: format!("/src{src}"),
                            container_path: format!("/m{d}"),
                            kind: None,
                            options: vec!["ro".into(), "bind".into()],
                        })
                        .collect(),
                    hooks: hooks
                        .into_iter()
                        .map(|h| HookEdit {
                            hook_name: "createContainer".into(),
                            path: format!("/h{h}"),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                },
                cgroup_rules: rules
                    .into_iter()
                    .map(|m| CgroupRule {
                        kind: 'c',
                        major: 195,
                        minor: m,
                        access: "rw".into(),
                    })
                    .collect(),
                env_overrides: over,
                ..Plan::default()
            },
        )
    }

    proptest::proptest! {
        /// Applying twice is applying once; keys stay unique; overrides win.
        #[test]
        fn idempotent_for_any_plan(plan in arb_plan(), pre in proptest::collection::vec((0u8..4, 0u8..4), 0..4)) {
            let mut s = base_spec();
            let env = s["process"]["env"].as_array_mut().unwrap();
            for (k, x) in pre {
                env.push(json!(format!("K{k}=old{x}")));
            }
            apply_to_spec(&mut s, &plan).unwrap();
            let once = s.clone();
            apply_to_spec(&mut s, &plan).unwrap();
            proptest::prop_assert_eq!(&s, &once);
            let keys: Vec<&str> = s["process"]["env"].as_array().unwrap().iter()
                .map(|e| e.as_str().unwrap().split('=').next().unwrap()).collect();
            let mut dedup = keys.clone();
            dedup.sort();
            dedup.dedup();
            // Keys the plan touched appear once.
            for e in plan.edits.env.iter().chain(&plan.env_overrides) {
                let k = e.split('=').next().unwrap();
                proptest::prop_assert_eq!(keys.iter().filter(|x| **x == k).count(), 1);
            }
            if let Some(last) = plan.env_overrides.last() {
                let k = last.split('=').next().unwrap();
                let want = plan.env_overrides.iter().rev().find(|e| e.starts_with(&format!("{k}="))).unwrap();
                proptest::prop_assert!(s["process"]["env"].as_array().unwrap().contains(&json!(want)));
            }
            let devs = s["linux"].get("devices").and_then(|d| d.as_array()).cloned().unwrap_or_default();
            let mut paths: Vec<&str> = devs.iter().map(|d| d["path"].as_str().unwrap()).collect();
            let n = paths.len();
            paths.sort();
            paths.dedup();
            proptest::prop_assert_eq!(paths.len(), n);
            let mounts = s["mounts"].as_array().unwrap();
            let mut dests: Vec<&str> = mounts.iter().map(|m| m["destination"].as_str().unwrap()).collect();
            let n = dests.len();
            dests.sort();
            dests.dedup();
            proptest::prop_assert_eq!(dests.len(), n);
        }
    }
}
