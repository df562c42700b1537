//! The quota file: written by the runtime or hook into `state-dir/<id>/quota`, mounted read-only
//! at `/run/gpufence/quota`, read by `libgpufence.so`.
//!
//! Format: UTF-8 text, one `key=value` per line, `#` comments. Shared with the shim
//! (this crate), so it uses `core`/`alloc`-level code only and never panics on input.
//!
//! ```text
//! version=1
//! oversubscribe=0
//! device.0.uuid=GPU-2f5d…
//! device.0.memory=4294967296
//! device.0.cores=50
//! cores-policy=burst
//! refusal-messages=0
//! ```
//! `cores-policy` (`hard`, the default when absent, or `burst`) applies to every device with
//! `cores`. `refusal-messages=0` (only written when set) keeps the shim from explaining a refused
//! allocation on the process's stderr (`shim.refusal-messages` in config.toml).
//! `device.<i>` is the container's CUDA ordinal; the shim matches devices by UUID first and falls
//! back to the ordinal.

/// Maximum number of devices described in one quota.
pub const MAX_DEVICES: usize = 64;

/// One device's limits.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct DeviceQuota {
    /// CUDA ordinal inside the container.
    pub ordinal: u32,
    /// `GPU-…` or `MIG-…`.
    pub uuid: String,
    /// Bytes allowed; `None` = no memory limit on this device.
    pub memory: Option<u64>,
    /// Compute share in percent (1–100); `None` = no limit.
    pub cores: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Quota {
    pub oversubscribe: bool,
    pub devices: Vec<DeviceQuota>,
    /// `cores-policy=burst`: a device's compute share may use idle GPU time (work-conserving).
    #[serde(default)]
    pub cores_burst: bool,
    /// No line on stderr when the shim refuses an allocation.
    #[serde(default, rename = "quietRefusals", skip_serializing_if = "is_false")]
    pub quiet_refusals: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Quota {
    /// Render the file contents.
    pub fn render(&self) -> String {
        let mut s = String::from(
            "# gpufence quota (written by the host; read-only in the container)\nversion=1\n",
        );
        s.push_str(if self.oversubscribe {
            "oversubscribe=1\n"
        } else {
            "oversubscribe=0\n"
        });
        if self.quiet_refusals {
            s.push_str("refusal-messages=0\n");
        }
        for d in &self.devices {
            let i = d.ordinal;
            s.push_str(&format!("device.{i}.uuid={}\n", d.uuid));
            if let Some(m) = d.memory {
                s.push_str(&format!("device.{i}.memory={m}\n"));
            }
            if let Some(c) = d.cores {
                s.push_str(&format!("device.{i}.cores={c}\n"));
            }
        }
        if self.cores_burst {
            s.push_str("cores-policy=burst\n");
        }
        s
    }

    /// Parse file contents. Unknown keys are ignored (forward compatibility); malformed values
    /// are errors, so a damaged file never reads as "no limit".
    pub fn parse(text: &str) -> Result<Quota, QuotaParseError> {
        let mut q = Quota::default();
        let mut version_seen = false;
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                return Err(QuotaParseError { line: n + 1 });
            };
            let bad = || QuotaParseError { line: n + 1 };
            match k {
                "version" => {
                    if v != "1" {
                        return Err(bad());
                    }
                    version_seen = true;
                }
                "oversubscribe" => q.oversubscribe = parse_bool(v).ok_or_else(bad)?,
                "cores-policy" => {
                    q.cores_burst = match v {
                        "hard" => false,
                        "burst" => true,
                        _ => return Err(bad()),
                    }
                }
                "refusal-messages" => q.quiet_refusals = !parse_bool(v).ok_or_else(bad)?,
                _ => {
                    let Some(rest) = k.strip_prefix("device.") else {
                        continue;
                    };
                    let Some((idx, field)) = rest.split_once('.') else {
                        return Err(bad());
                    };
                    let ordinal: u32 = idx.parse().map_err(|_| bad())?;
                    if ordinal as usize >= MAX_DEVICES {
                        return Err(bad());
                    }
                    let pos = match q.devices.iter().position(|d| d.ordinal == ordinal) {
                        Some(p) => p,
                        None => {
                            q.devices.push(DeviceQuota {
                                ordinal,
                                ..DeviceQuota::default()
                            });
                            q.devices.len() - 1
                        }
                    };
                    let d = &mut q.devices[pos];
                    match field {
                        "uuid" => d.uuid = v.to_string(),
                        "memory" => d.memory = Some(v.parse().map_err(|_| bad())?),
                        "cores" => {
                            let c: u8 = v.parse().map_err(|_| bad())?;
                            if !(1..=100).contains(&c) {
                                return Err(bad());
                            }
                            d.cores = Some(c);
                        }
                        _ => {}
                    }
                }
            }
        }
        if !version_seen {
            return Err(QuotaParseError { line: 0 });
        }
        q.devices.sort_by_key(|d| d.ordinal);
        Ok(q)
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "true" => Some(true),
        "0" | "false" => Some(false),
        _ => None,
    }
}

/// A malformed quota file (line 0: no `version=1` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaParseError {
    pub line: usize,
}

impl core::fmt::Display for QuotaParseError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.line == 0 {
            write!(f, "quota file has no version=1 line")
        } else {
            write!(f, "quota file line {} is malformed", self.line)
        }
    }
}

impl std::error::Error for QuotaParseError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let q = Quota {
            oversubscribe: true,
            devices: vec![
                DeviceQuota {
                    ordinal: 0,
                    uuid: "GPU-a".into(),
                    memory: Some(4 << 30),
                    cores: Some(50),
                },
                DeviceQuota {
                    ordinal: 1,
                    uuid: "MIG-b".into(),
                    memory: None,
                    cores: None,
                },
            ],
            cores_burst: true,
            quiet_refusals: false,
        };
        assert_eq!(Quota::parse(&q.render()).unwrap(), q);
        let hard = Quota {
            cores_burst: false,
            ..q.clone()
        };
        assert!(!hard.render().contains("cores-policy"));
        assert_eq!(Quota::parse(&hard.render()).unwrap(), hard);
        let quiet = Quota {
            quiet_refusals: true,
            ..q
        };
        assert!(quiet.render().contains("\nrefusal-messages=0\n"));
        assert_eq!(Quota::parse(&quiet.render()).unwrap(), quiet);
    }

    #[test]
    fn malformed_is_error() {
        assert!(Quota::parse("").is_err());
        assert!(Quota::parse("version=1\ndevice.0.memory=lots\n").is_err());
        assert!(Quota::parse("version=1\ndevice.0.cores=0\n").is_err());
        assert!(Quota::parse("version=1\ndevice.99999.memory=1\n").is_err());
        assert!(Quota::parse("version=2\n").is_err());
        assert!(Quota::parse("version=1\ncores-policy=soft\n").is_err());
    }
}
