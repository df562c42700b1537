//! The parts of `config.json` the dialects read: annotations, the process env, mounts.

use std::collections::BTreeMap;

use super::AllocationError;

/// Annotations, process env and mount destinations of one container.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// `annotations` (sorted by key, so every reader sees them in one order).
    pub annotations: BTreeMap<String, String>,
    /// `process.env` in order, split at the first `=` (entries without `=` are skipped).
    pub env: Vec<(String, String)>,
    /// `mounts[]` as (destination, source); a missing source is `""`.
    pub mounts: Vec<(String, String)>,
}

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
        Ok(inputs)
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
