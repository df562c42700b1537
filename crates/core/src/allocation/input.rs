//! The request: what gpufence reads of a container — annotations, the process env, mounts, its
//! user namespace and root — parsed once, strictly, at the front door ([`Inputs::from_spec`]
//! for an OCI `config.json`; the NRI plugin builds the same from its request) into one typed
//! value that the allocation, the plan and the appliers read. Nothing downstream parses
//! `config.json` again.

use std::collections::BTreeMap;

use super::AllocationError;

/// Annotations, process env and mount destinations of one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inputs {
    /// `annotations` (sorted by key, so every reader sees them in one order).
    pub annotations: BTreeMap<String, String>,
    /// `process.env` in order, split at the first `=` (entries without `=` are skipped).
    pub env: Vec<(String, String)>,
    /// `mounts[]` as (destination, source); a missing source is `""`.
    pub mounts: Vec<(String, String)>,
    /// The container has a user namespace (its own or a joined one).
    pub user_namespace: bool,
    /// `root.path` as written (relative to the bundle unless absolute); `None` when absent or
    /// empty.
    pub root_path: Option<String>,
    /// `linux.devices`: the device nodes the engine already put into the spec (a device
    /// plugin's DeviceSpecs, CDI devices it resolved, `--device`), in order.
    pub devices: Vec<SpecDevice>,
    /// `linux.resources.devices` allows every device (a privileged container): its device nodes
    /// are not grants (it can reach every device of the node anyway).
    pub all_devices_allowed: bool,
}

/// One character or block device node of the spec (`linux.devices[]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SpecDevice {
    /// Path inside the container.
    pub path: String,
    /// `c` (also for `u`) or `b`.
    pub kind: char,
    pub major: u32,
    pub minor: u32,
}

impl SpecDevice {
    /// `c 195:1 /dev/nvidia1`, as refusals name it.
    pub fn shown(&self) -> String {
        format!(
            "device {} ({} {}:{})",
            self.path, self.kind, self.major, self.minor
        )
    }
}

/// `linux.devices[i]` as a device node; `Ok(None)` for a FIFO (`p`), which names no device.
fn spec_device(i: usize, d: &serde_json::Value) -> Result<Option<SpecDevice>, AllocationError> {
    let key = format!("linux.devices[{i}]");
    let err = |why: &str| AllocationError::new(&key, &d.to_string(), why);
    let path = d
        .get("path")
        .and_then(|p| p.as_str())
        .ok_or_else(|| err("no path"))?;
    let kind = match d.get("type").and_then(|t| t.as_str()) {
        Some("c" | "u") => 'c',
        Some("b") => 'b',
        Some("p") => return Ok(None),
        _ => return Err(err("type is not c, u, b or p")),
    };
    let num = |k: &str| {
        d.get(k)
            .and_then(|n| n.as_u64())
            .and_then(|n| u32::try_from(n).ok())
    };
    let (Some(major), Some(minor)) = (num("major"), num("minor")) else {
        return Err(err("major/minor missing or out of range"));
    };
    Ok(Some(SpecDevice {
        path: path.to_string(),
        kind,
        major,
        minor,
    }))
}

/// Whether a device cgroup rule list allows every device: its last rule for every device (no
/// type or type `a`, no numbers) allows (`{"allow": true, "access": "rwm"}`: a privileged
/// container). Rules apply in order, so a later deny-all closes it again.
fn allows_all(rules: &serde_json::Value) -> bool {
    let every = |r: &&serde_json::Value| {
        matches!(r.get("type").and_then(|t| t.as_str()), None | Some("a"))
            && r.get("major").is_none_or(serde_json::Value::is_null)
            && r.get("minor").is_none_or(serde_json::Value::is_null)
    };
    rules
        .as_array()
        .and_then(|rules| rules.iter().rfind(every))
        .is_some_and(|r| {
            r.get("allow").and_then(|a| a.as_bool()) == Some(true)
                && r.get("access")
                    .and_then(|a| a.as_str())
                    .is_none_or(|a| a.contains('r') || a.contains('w'))
        })
}

/// Each engine's container-type annotation: (key, the value for a pod sandbox, engine).
const SANDBOX_KEYS: [(&str, &str, &str); 3] = [
    ("io.kubernetes.cri.container-type", "sandbox", "containerd"),
    ("io.kubernetes.cri-o.ContainerType", "sandbox", "cri-o"),
    ("io.kubernetes.docker.type", "podsandbox", "dockershim"),
];

impl Inputs {
    /// Read the inputs from a parsed `config.json`. Non-string annotation values or env entries
    /// are errors (runc would refuse them as well).
    pub fn from_spec(spec: &serde_json::Value) -> Result<Inputs, AllocationError> {
        let mut inputs = Inputs::default();
        match spec.get("annotations") {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Object(map)) => {
                for (k, v) in map {
                    let Some(v) = v.as_str() else {
                        return Err(AllocationError::new(
                            k,
                            &v.to_string(),
                            "annotation value is not a string",
                        ));
                    };
                    inputs.annotations.insert(k.clone(), v.to_string());
                }
            }
            Some(other) => {
                return Err(AllocationError::new(
                    "annotations",
                    &other.to_string(),
                    "not an object",
                ));
            }
        }
        match spec.get("process").and_then(|p| p.get("env")) {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Array(list)) => {
                for e in list {
                    let Some(e) = e.as_str() else {
                        return Err(AllocationError::new(
                            "process.env",
                            &e.to_string(),
                            "env entry is not a string",
                        ));
                    };
                    if let Some((k, v)) = e.split_once('=') {
                        inputs.env.push((k.to_string(), v.to_string()));
                    }
                }
            }
            Some(other) => {
                return Err(AllocationError::new(
                    "process.env",
                    &other.to_string(),
                    "not an array",
                ));
            }
        }
        if let Some(serde_json::Value::Array(mounts)) = spec.get("mounts") {
            for m in mounts {
                if let Some(d) = m.get("destination").and_then(|d| d.as_str()) {
                    let src = m.get("source").and_then(|s| s.as_str()).unwrap_or_default();
                    inputs.mounts.push((d.to_string(), src.to_string()));
                }
            }
        }
        inputs.user_namespace = spec
            .pointer("/linux/namespaces")
            .and_then(|n| n.as_array())
            .is_some_and(|n| {
                n.iter()
                    .any(|ns| ns.get("type").and_then(|t| t.as_str()) == Some("user"))
            });
        inputs.read_devices(
            spec.pointer("/linux/devices"),
            spec.pointer("/linux/resources/devices"),
        )?;
        inputs.root_path = spec
            .pointer("/root/path")
            .and_then(|p| p.as_str())
            .filter(|p| !p.is_empty())
            .map(str::to_string);
        Ok(inputs)
    }

    /// `devices` (`linux.devices`) and `rules` (`linux.resources.devices`) in OCI's JSON shape
    /// (the NRI plugin renders its request's into it).
    pub fn read_devices(
        &mut self,
        devices: Option<&serde_json::Value>,
        rules: Option<&serde_json::Value>,
    ) -> Result<(), AllocationError> {
        match devices {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Array(list)) => {
                for (i, d) in list.iter().enumerate() {
                    self.devices.extend(spec_device(i, d)?);
                }
            }
            Some(other) => {
                return Err(AllocationError::new(
                    "linux.devices",
                    &other.to_string(),
                    "not an array",
                ));
            }
        }
        self.all_devices_allowed = rules.is_some_and(allows_all);
        Ok(())
    }

    /// The CRI annotation marking a pod sandbox (pause) container, if this is one. Every
    /// engine's key present must say sandbox: a pod can carry another engine's key as a pod
    /// annotation (CRI-O passes pod annotations into the spec, where containerd's key is never
    /// set by the engine), so one key saying "sandbox" while the creating engine's says
    /// "container" (or anything else) is a container, and gets its plan.
    pub fn sandbox_kind(&self) -> Option<&'static str> {
        let mut kind = None;
        for (key, sandbox, engine) in SANDBOX_KEYS {
            match self.annotations.get(key) {
                None => {}
                Some(v) if v == sandbox => kind = kind.or(Some(engine)),
                Some(_) => return None,
            }
        }
        kind
    }

    /// Whether the request names CDI devices (`cdi.k8s.io/*` annotations): only then are the
    /// node's CDI spec directories read.
    pub fn wants_cdi(&self) -> bool {
        self.annotations
            .keys()
            .any(|k| k.starts_with(crate::cdi::parse::ANNOTATION_PREFIX))
    }

    /// The process `PATH`: the first `PATH=` of the env (the one `getenv` returns and the one
    /// the spec editor replaces).
    pub fn path(&self) -> Option<&str> {
        self.env_first("PATH")
    }

    /// A trusted env variable: the value, or an error when it is set more than once with
    /// different values (which one the program sees depends on its libc).
    pub fn env_var(&self, key: &str) -> Result<Option<&str>, AllocationError> {
        let mut found: Option<&str> = None;
        for (k, v) in &self.env {
            if k == key {
                match found {
                    Some(prev) if prev != v => {
                        return Err(AllocationError::new(
                            key,
                            v,
                            format!("set more than once with different values (also {prev:?})"),
                        ));
                    }
                    _ => found = Some(v),
                }
            }
        }
        Ok(found)
    }

    /// First value of an env variable, for reporting untrusted env (never an error).
    pub fn env_first(&self, key: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Env keys matching a predicate (sorted, deduplicated).
    pub fn env_keys(&self, pred: impl Fn(&str) -> bool) -> Vec<&str> {
        let mut keys: Vec<&str> = self
            .env
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| pred(k))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }
}
