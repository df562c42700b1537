//! The hook's inputs: the OCI state on stdin and the bundle's `config.json`, both bounded and
//! validated before anything else looks at them.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Largest state JSON accepted on stdin.
pub const MAX_STATE_BYTES: u64 = 1 << 20;
/// Largest `config.json` accepted.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("reading {what}: {source}")]
    Read {
        what: String,
        source: std::io::Error,
    },
    #[error("{what} is larger than {limit} bytes: refused")]
    TooLarge { what: String, limit: u64 },
    #[error("{what}: invalid JSON: {message}")]
    Json { what: String, message: String },
    #[error("{what}: {field} = {value:?}: {why}")]
    Invalid {
        what: String,
        field: &'static str,
        value: String,
        why: &'static str,
    },
}

/// The OCI state as runtimes pass it to hooks.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    #[serde(default)]
    pub oci_version: String,
    pub id: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub pid: Option<i64>,
    pub bundle: PathBuf,
}

/// Read at most `limit` bytes; more is an error (never a truncated parse).
pub fn read_bounded(r: &mut impl Read, limit: u64, what: &str) -> Result<Vec<u8>, StateError> {
    let mut buf = Vec::new();
    r.take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|source| StateError::Read {
            what: what.to_string(),
            source,
        })?;
    if buf.len() as u64 > limit {
        return Err(StateError::TooLarge {
            what: what.to_string(),
            limit,
        });
    }
    Ok(buf)
}

/// The OCI state runc writes on a hook's stdin, at most [`MAX_STATE_BYTES`] (every hook
/// command reads it this way).
pub fn read_oci_state(r: &mut impl Read) -> Result<Vec<u8>, StateError> {
    read_bounded(r, MAX_STATE_BYTES, "OCI state on stdin")
}

/// Container ids name a host directory (`state-dir/<id>`): only `[A-Za-z0-9_.-]`, not `.`/`..`,
/// at most 256 bytes.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

const STATE_WHAT: &str = "OCI state on stdin";

fn invalid(field: &'static str, value: String, why: &'static str) -> StateError {
    StateError::Invalid {
        what: STATE_WHAT.into(),
        field,
        value: value.chars().take(128).collect(),
        why,
    }
}

fn deserialize_state(bytes: &[u8]) -> Result<State, StateError> {
    serde_json::from_slice(bytes).map_err(|e| StateError::Json {
        what: STATE_WHAT.into(),
        message: e.to_string(),
    })
}

/// The state of the createContainer `update-ldcache` hook, which needs only the id and the
/// bundle (a CDI consumer may run it without a pid): the bundle absolute, without `..`.
pub fn parse_ldcache_state(bytes: &[u8]) -> Result<State, StateError> {
    let s = deserialize_state(bytes)?;
    if !s.bundle.is_absolute()
        || s.bundle
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(invalid(
            "bundle",
            s.bundle.display().to_string(),
            "must be an absolute path without `..` components",
        ));
    }
    Ok(s)
}

pub fn parse_state(bytes: &[u8]) -> Result<State, StateError> {
    let s = deserialize_state(bytes)?;
    if !valid_id(&s.id) {
        return Err(invalid("id", s.id.clone(), "not a valid container id"));
    }
    match s.pid {
        Some(p) if p > 1 && p <= i64::from(i32::MAX) => {}
        other => {
            return Err(invalid(
                "pid",
                format!("{other:?}"),
                "the hook needs the container's init pid",
            ));
        }
    }
    if !s.bundle.is_absolute() {
        return Err(invalid(
            "bundle",
            s.bundle.display().to_string(),
            "must be an absolute path",
        ));
    }
    if !s.status.is_empty() && s.status != "creating" && s.status != "created" {
        return Err(invalid(
            "status",
            s.status.clone(),
            "the hook runs while the container is being created",
        ));
    }
    Ok(s)
}

/// The bundle's `config.json` (as a JSON value) and the rootfs path it names.
pub fn read_config(bundle: &Path) -> Result<(serde_json::Value, PathBuf), StateError> {
    let path = bundle.join("config.json");
    let what = path.display().to_string();
    let f = std::fs::File::open(&path).map_err(|source| StateError::Read {
        what: what.clone(),
        source,
    })?;
    let bytes = read_bounded(&mut std::io::BufReader::new(f), MAX_CONFIG_BYTES, &what)?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| StateError::Json {
        what: what.clone(),
        message: e.to_string(),
    })?;
    let inv = |field, value: String, why| StateError::Invalid {
        what: what.clone(),
        field,
        value,
        why,
    };
    if !v.is_object() {
        return Err(inv("(top)", String::new(), "not a JSON object"));
    }
    let root = v
        .pointer("/root/path")
        .and_then(|p| p.as_str())
        .ok_or_else(|| inv("root.path", String::new(), "missing"))?;
    if root.is_empty() || root.contains('\0') {
        return Err(inv("root.path", root.to_string(), "empty or not a path"));
    }
    let rootfs = if Path::new(root).is_absolute() {
        PathBuf::from(root)
    } else {
        bundle.join(root)
    };
    Ok((v, rootfs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_ok_and_refusals() {
        let ok = br#"{"ociVersion":"1.0.2-dev","id":"abc-1","status":"creating","pid":42,"bundle":"/b","annotations":{"x":"y"}}"#;
        let s = parse_state(ok).unwrap();
        assert_eq!((s.id.as_str(), s.pid), ("abc-1", Some(42)));
        for bad in [
            r#"{"id":"../x","pid":42,"bundle":"/b"}"#,
            r#"{"id":"a/b","pid":42,"bundle":"/b"}"#,
            r#"{"id":"a","bundle":"/b"}"#,
            r#"{"id":"a","pid":1,"bundle":"/b"}"#,
            r#"{"id":"a","pid":42,"bundle":"b"}"#,
            r#"{"id":"a","pid":42,"bundle":"/b","status":"running"}"#,
            r#"[]"#,
        ] {
            assert!(parse_state(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn bounded_read() {
        let big = vec![b' '; (MAX_STATE_BYTES + 1) as usize];
        let e = read_bounded(&mut big.as_slice(), MAX_STATE_BYTES, "stdin").unwrap_err();
        assert!(matches!(e, StateError::TooLarge { .. }));
        let small = b"{}".to_vec();
        assert_eq!(read_bounded(&mut small.as_slice(), 10, "x").unwrap(), b"{}");
    }

    #[test]
    fn ldcache_state_bundle_is_validated_and_config_bounded() {
        for b in ["rel/bundle", "/a/../b"] {
            let s = format!(r#"{{"id":"c","bundle":"{b}"}}"#);
            let e = parse_ldcache_state(s.as_bytes()).unwrap_err();
            assert!(e.to_string().contains("absolute path"), "{b}: {e}");
        }
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("config.json"),
            r#"{"root":{"path":"rootfs"}}"#,
        )
        .unwrap();
        // No pid needed (a CDI consumer's createContainer hook).
        let s = format!(r#"{{"id":"c","bundle":"{}"}}"#, d.path().display());
        let st = parse_ldcache_state(s.as_bytes()).unwrap();
        let (_, root) = read_config(&st.bundle).unwrap();
        assert_eq!((st.id.as_str(), root), ("c", d.path().join("rootfs")));
        let f = std::fs::File::create(d.path().join("config.json")).unwrap();
        f.set_len(MAX_CONFIG_BYTES + 1).unwrap();
        let e = read_config(&st.bundle).unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
    }

    #[test]
    fn config_rootfs_relative_to_bundle() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("config.json"),
            r#"{"root":{"path":"rootfs"}}"#,
        )
        .unwrap();
        let (_, r) = read_config(d.path()).unwrap();
        assert_eq!(r, d.path().join("rootfs"));
        std::fs::write(d.path().join("config.json"), r#"{"root":{}}"#).unwrap();
        assert!(read_config(d.path()).is_err());
    }

    proptest::proptest! {
        #[test]
        fn parse_state_never_panics(s in ".{0,300}") {
            let _ = parse_state(s.as_bytes());
        }
        #[test]
        fn valid_ids_are_single_clean_components(id in "[ -~]{0,40}") {
            if valid_id(&id) {
                proptest::prop_assert!(!id.contains('/') && id != ".." && id != ".");
            }
        }
    }
}
