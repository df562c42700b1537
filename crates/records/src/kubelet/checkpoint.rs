//! kubelet's device-manager checkpoint (`kubelet_internal_checkpoint`): strict parsing and
//! checksum verification.
//!
//! kubelet (≥ 1.20) writes `{"Data":{"PodDeviceEntries":[…]|null,"RegisteredDevices":{…}|null},
//! "Checksum":N}` where each entry is `{"PodUID","ContainerName","ResourceName","DeviceIDs":
//! {"<numa>":[ids…]},"AllocResp":"<base64 protobuf>"}` and `Checksum` is FNV-32a over go-spew's
//! `%#v` rendering of `Data` (see [`render`]). The parser is stricter than kubelet's own (Go's
//! `encoding/json`): unknown or duplicate keys, keys in another case, non-canonical NUMA keys,
//! padding-less or non-canonical base64 are all refused, so that what is verified is exactly
//! what kubelet wrote. Nil and empty lists/maps are kept apart because the checksum tells them
//! apart (`<nil>` vs `[]`).

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

/// Largest checkpoint read (a node with hundreds of GPU containers stays far below).
pub const MAX_BYTES: u64 = 4 << 20;

/// Why a checkpoint cannot be believed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error("not a kubelet device-manager checkpoint: {0}")]
    Format(String),
    #[error("the pre-1.20 format (DeviceIDs as a list) is not supported")]
    OldFormat,
    #[error("checksum {recorded} does not match the content (computed {computed})")]
    Checksum { recorded: u64, computed: u32 },
}

/// One `PodDeviceEntries` element: the devices and the Allocate response of one resource of one
/// container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub pod_uid: String,
    pub container_name: String,
    pub resource_name: String,
    /// `DevicesPerNUMA`: (NUMA node, device ids) in key order; `None` = JSON null.
    pub device_ids: Option<Vec<(i64, Option<Vec<String>>)>>,
    /// The protobuf `ContainerAllocateResponse`; `None` = JSON null.
    pub alloc_resp: Option<Vec<u8>>,
}

impl Entry {
    /// Every device id of the entry, NUMA nodes in order.
    pub fn all_device_ids(&self) -> Vec<&str> {
        self.device_ids
            .iter()
            .flatten()
            .flat_map(|(_, ids)| ids.iter().flatten().map(String::as_str))
            .collect()
    }
}

/// A parsed checkpoint whose checksum has been verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// `None` = `PodDeviceEntries: null` (no pod holds a device).
    pub entries: Option<Vec<Entry>>,
    /// `RegisteredDevices` in key order; `None` = null.
    pub registered: Option<Vec<(String, Option<Vec<String>>)>>,
    pub checksum: u64,
}

impl Checkpoint {
    /// Parse and verify. Anything but a checkpoint exactly as kubelet writes it is an error.
    pub fn parse(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
        if bytes.len() as u64 > MAX_BYTES {
            return Err(CheckpointError::Format(format!(
                "{} bytes, more than the {MAX_BYTES} accepted",
                bytes.len()
            )));
        }
        let raw: RawFile = serde_json::from_slice(bytes).map_err(|e| {
            if e.to_string().contains(OLD_FORMAT_MARK) {
                CheckpointError::OldFormat
            } else {
                CheckpointError::Format(e.to_string())
            }
        })?;
        let cp = Checkpoint {
            entries: raw.data.entries.map(|list| {
                list.into_iter()
                    .map(|e| Entry {
                        pod_uid: e.pod_uid,
                        container_name: e.container_name,
                        resource_name: e.resource_name,
                        device_ids: e.device_ids.0,
                        alloc_resp: e.alloc_resp.0,
                    })
                    .collect()
            }),
            registered: raw.data.registered.map(|m| m.0),
            checksum: raw.checksum,
        };
        let computed = fnv32a(render(&cp).as_bytes());
        if u64::from(computed) != cp.checksum {
            return Err(CheckpointError::Checksum {
                recorded: cp.checksum,
                computed,
            });
        }
        Ok(cp)
    }

    /// A checkpoint as kubelet would write it for these entries (tests, demo, fixtures).
    pub fn to_json(&self) -> String {
        use base64::Engine as _;
        let list = |l: &Option<Vec<String>>| match l {
            None => serde_json::Value::Null,
            Some(v) => serde_json::Value::from(v.clone()),
        };
        let entries = match &self.entries {
            None => serde_json::Value::Null,
            Some(es) => es
                .iter()
                .map(|e| {
                    let mut o = serde_json::Map::new();
                    o.insert("PodUID".into(), e.pod_uid.clone().into());
                    o.insert("ContainerName".into(), e.container_name.clone().into());
                    o.insert("ResourceName".into(), e.resource_name.clone().into());
                    o.insert(
                        "DeviceIDs".into(),
                        match &e.device_ids {
                            None => serde_json::Value::Null,
                            Some(m) => m
                                .iter()
                                .map(|(k, v)| (k.to_string(), list(v)))
                                .collect::<serde_json::Map<_, _>>()
                                .into(),
                        },
                    );
                    o.insert(
                        "AllocResp".into(),
                        match &e.alloc_resp {
                            None => serde_json::Value::Null,
                            Some(b) => base64::engine::general_purpose::STANDARD.encode(b).into(),
                        },
                    );
                    serde_json::Value::Object(o)
                })
                .collect(),
        };
        let registered = match &self.registered {
            None => serde_json::Value::Null,
            Some(m) => m
                .iter()
                .map(|(k, v)| (k.clone(), list(v)))
                .collect::<serde_json::Map<_, _>>()
                .into(),
        };
        serde_json::json!({
            "Data": {"PodDeviceEntries": entries, "RegisteredDevices": registered},
            "Checksum": self.checksum
        })
        .to_string()
    }

    /// Set `checksum` to the one kubelet computes for this content.
    pub fn seal(mut self) -> Checkpoint {
        self.checksum = u64::from(fnv32a(render(&self).as_bytes()));
        self
    }
}

/// FNV-1a, 32 bits (Go's `hash/fnv.New32a`).
pub fn fnv32a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// go-spew's `%#v` rendering of kubelet's `checkpoint.checkpointData` with the ConfigState
/// kubelet hashes with (`SortKeys`, `DisableMethods`, `SpewKeys`): the top value and struct
/// fields carry their Go type in parentheses, list elements and map keys/values do not; strings
/// print raw, byte slices as decimal lists, nil lists and maps as `<nil>`, maps as
/// `map[k:v k:v]` with sorted keys (NUMA keys numerically).
pub fn render(cp: &Checkpoint) -> String {
    use std::fmt::Write as _;
    let mut out =
        String::from("(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)");
    match &cp.entries {
        None => out.push_str("<nil>"),
        Some(es) => {
            out.push('[');
            for (i, e) in es.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                let _ = write!(
                    out,
                    "{{PodUID:(string){} ContainerName:(string){} ResourceName:(string){} \
                     DeviceIDs:(checkpoint.DevicesPerNUMA)",
                    e.pod_uid, e.container_name, e.resource_name
                );
                render_map(&mut out, e.device_ids.as_deref(), |a, b| a.cmp(b));
                out.push_str(" AllocResp:([]uint8)");
                match &e.alloc_resp {
                    None => out.push_str("<nil>"),
                    Some(b) => {
                        let bytes: Vec<String> = b.iter().map(u8::to_string).collect();
                        let _ = write!(out, "[{}]", bytes.join(" "));
                    }
                }
                out.push('}');
            }
            out.push(']');
        }
    }
    out.push_str(" RegisteredDevices:(map[string][]string)");
    render_map(&mut out, cp.registered.as_deref(), |a, b| a.cmp(b));
    out.push('}');
    out
}

/// A Go `map[K][]string` in key order as read (a nil list is `None`).
type ListMap<K> = [(K, Option<Vec<String>>)];

/// A Go map of string lists as go-spew prints it: `<nil>`, or `map[k:[a b] k:<nil>]` with the
/// keys sorted by `order`.
fn render_map<K: fmt::Display>(
    out: &mut String,
    map: Option<&ListMap<K>>,
    order: impl Fn(&K, &K) -> std::cmp::Ordering,
) {
    let Some(map) = map else {
        out.push_str("<nil>");
        return;
    };
    let mut items: Vec<&(K, Option<Vec<String>>)> = map.iter().collect();
    items.sort_by(|a, b| order(&a.0, &b.0));
    out.push_str("map[");
    for (j, (k, v)) in items.iter().enumerate() {
        if j > 0 {
            out.push(' ');
        }
        out.push_str(&k.to_string());
        out.push(':');
        match v {
            None => out.push_str("<nil>"),
            Some(v) => {
                out.push('[');
                out.push_str(&v.join(" "));
                out.push(']');
            }
        }
    }
    out.push(']');
}

// ---------------------------------------------------------------------------------------------
// Strict JSON shapes

const OLD_FORMAT_MARK: &str = "gpufence:old-format";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(rename = "Data")]
    data: RawData,
    #[serde(rename = "Checksum")]
    checksum: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawData {
    #[serde(rename = "PodDeviceEntries")]
    entries: Option<Vec<RawEntry>>,
    #[serde(rename = "RegisteredDevices")]
    registered: Option<StrictMap<Option<Vec<String>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    #[serde(rename = "ContainerName")]
    container_name: String,
    #[serde(rename = "ResourceName")]
    resource_name: String,
    #[serde(rename = "DeviceIDs")]
    device_ids: NumaMap,
    #[serde(rename = "AllocResp")]
    alloc_resp: Base64,
}

/// A JSON object whose keys are unique (serde_json keeps the last of duplicates silently); also
/// used by [`super::dra`].
pub(super) struct StrictMap<V>(pub(super) Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for StrictMap<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V_<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for V_<V> {
            type Value = StrictMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut out: Vec<(String, V)> = Vec::new();
                while let Some(k) = m.next_key::<String>()? {
                    if out.iter().any(|(x, _)| *x == k) {
                        return Err(de::Error::custom(format!("duplicate key {k:?}")));
                    }
                    let v = m.next_value()?;
                    out.push((k, v));
                }
                Ok(StrictMap(out))
            }
        }
        d.deserialize_map(V_(PhantomData))
    }
}

/// `DeviceIDs`: null, or an object keyed by canonical decimal NUMA node ids.
struct NumaMap(Option<Vec<(i64, Option<Vec<String>>)>>);

impl<'de> Deserialize<'de> for NumaMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V_;
        impl<'de> Visitor<'de> for V_ {
            type Value = NumaMap;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("null or an object of NUMA node → device ids")
            }
            fn visit_unit<E: de::Error>(self) -> Result<NumaMap, E> {
                Ok(NumaMap(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<NumaMap, A::Error> {
                Err(de::Error::custom(OLD_FORMAT_MARK))
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<NumaMap, A::Error> {
                let StrictMap(raw) = StrictMap::<Option<Vec<String>>>::deserialize(
                    de::value::MapAccessDeserializer::new(m),
                )?;
                let mut out = Vec::with_capacity(raw.len());
                for (k, v) in raw {
                    let n: i64 = k
                        .parse()
                        .ok()
                        .filter(|n: &i64| n.to_string() == k)
                        .ok_or_else(|| de::Error::custom(format!("NUMA node {k:?}")))?;
                    out.push((n, v));
                }
                Ok(NumaMap(Some(out)))
            }
        }
        d.deserialize_any(V_)
    }
}

/// `AllocResp`: null, or padded standard base64 (Go's `[]byte` JSON encoding).
struct Base64(Option<Vec<u8>>);

impl<'de> Deserialize<'de> for Base64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use base64::Engine as _;
        let s: Option<String> = Option::deserialize(d)?;
        match s {
            None => Ok(Base64(None)),
            Some(s) => base64::engine::general_purpose::STANDARD
                .decode(s.as_bytes())
                .map(|b| Base64(Some(b)))
                .map_err(|e| de::Error::custom(format!("AllocResp is not base64: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two checkpoints written by real kubelets (shared notes, kubelet-checkpoint.md).
    pub const REAL_WITH_ENTRY: &str = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"bf52b2cd-b611-4e79-86b1-280b283185c3","ContainerName":"check","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["tegra"]},"AllocResp":"Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh"}],"RegisteredDevices":{"nvidia.com/gpu":["tegra"]}},"Checksum":3660592824}"#;
    pub const REAL_EMPTY: &str = r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0"]}},"Checksum":3952659280}"#;

    #[test]
    fn real_checkpoints_verify() {
        let cp = Checkpoint::parse(REAL_WITH_ENTRY.as_bytes()).unwrap();
        let es = cp.entries.as_ref().unwrap();
        assert_eq!(es.len(), 1);
        assert_eq!(es[0].container_name, "check");
        assert_eq!(es[0].all_device_ids(), vec!["tegra"]);
        assert_eq!(es[0].alloc_resp.as_ref().unwrap()[..2], [10, 31]);
        let cp = Checkpoint::parse(REAL_EMPTY.as_bytes()).unwrap();
        assert!(cp.entries.is_none());
        assert_eq!(cp.checksum, 3952659280);
    }

    #[test]
    fn to_json_round_trips_the_real_checkpoints_byte_for_byte() {
        for real in [REAL_WITH_ENTRY, REAL_EMPTY] {
            let cp = Checkpoint::parse(real.as_bytes()).unwrap();
            assert_eq!(cp.to_json(), real);
        }
    }

    #[test]
    fn a_changed_byte_fails_the_checksum() {
        let forged = REAL_WITH_ENTRY.replace("\"check\"", "\"other\"");
        assert!(matches!(
            Checkpoint::parse(forged.as_bytes()),
            Err(CheckpointError::Checksum {
                recorded: 3660592824,
                ..
            })
        ));
    }

    #[test]
    fn nil_and_empty_differ() {
        let a = Checkpoint {
            entries: None,
            registered: None,
            checksum: 0,
        }
        .seal();
        let b = Checkpoint {
            entries: Some(Vec::new()),
            registered: Some(Vec::new()),
            checksum: 0,
        }
        .seal();
        assert_ne!(a.checksum, b.checksum);
        assert!(
            render(&b).contains("PodDevicesEntry)[] RegisteredDevices:(map[string][]string)map[]")
        );
        Checkpoint::parse(a.to_json().as_bytes()).unwrap();
        Checkpoint::parse(b.to_json().as_bytes()).unwrap();
    }

    #[test]
    fn numa_keys_sort_numerically() {
        let cp = Checkpoint {
            entries: Some(vec![Entry {
                pod_uid: "u".into(),
                container_name: "c".into(),
                resource_name: "r".into(),
                device_ids: Some(vec![
                    (10, Some(vec!["b".into()])),
                    (-1, None),
                    (2, Some(vec!["a".into(), "c".into()])),
                ]),
                alloc_resp: Some(Vec::new()),
            }]),
            registered: None,
            checksum: 0,
        };
        assert!(render(&cp).contains("map[-1:<nil> 2:[a c] 10:[b]] AllocResp:([]uint8)[]}"));
    }

    #[test]
    fn strictness() {
        let bad = [
            // unknown key, wrong case, duplicate key, duplicate NUMA key, non-canonical NUMA
            REAL_EMPTY.replace("\"Checksum\"", "\"Extra\":1,\"Checksum\""),
            REAL_EMPTY.replace("\"Checksum\"", "\"checksum\""),
            REAL_EMPTY.replace(
                "\"Checksum\":3952659280",
                "\"Checksum\":1,\"Checksum\":3952659280",
            ),
            REAL_WITH_ENTRY.replace("{\"-1\":[\"tegra\"]}", "{\"-1\":[],\"-1\":[\"tegra\"]}"),
            REAL_WITH_ENTRY.replace("{\"-1\":", "{\"-01\":"),
            REAL_WITH_ENTRY.replace("Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh", "Ch8K!"),
            REAL_WITH_ENTRY.replace("\"tegra\"]}},", "\"tegra\"]}"),
            REAL_EMPTY[..40].to_string(),
            String::new(),
            "[]".to_string(),
        ];
        for b in &bad {
            assert!(
                matches!(
                    Checkpoint::parse(b.as_bytes()),
                    Err(CheckpointError::Format(_))
                ),
                "accepted {b}"
            );
        }
        let old = REAL_WITH_ENTRY.replace("{\"-1\":[\"tegra\"]}", "[\"tegra\"]");
        assert_eq!(
            Checkpoint::parse(old.as_bytes()),
            Err(CheckpointError::OldFormat)
        );
        let huge = vec![b' '; MAX_BYTES as usize + 1];
        assert!(Checkpoint::parse(&huge).is_err());
    }
}
