//! `allocation.trust-env = "kubelet"`: the env the env-borne dialects (hami, gpushare, nvidia)
//! may read is exactly the env kubelet recorded that a device plugin gave this container.
//!
//! [`view`] turns the container's inputs and kubelet's record into the inputs and the effective
//! configuration the dialect readers see: with a record, the GPU env keys are replaced by the
//! recorded values (and believed); keys kubelet has no record of are dropped (and neutralised
//! once the allocation is known, [`neutralise_unrecorded`]); a value that differs from the record
//! is overridden with the recorded one. Without kubelet the env is not believed (as with `false`);
//! with an unreadable record, a container whose only GPU signal is env is refused ([`refusal`]).

use super::container_dialects::{self, NVIDIA_DRIVER_CAPABILITIES, NVIDIA_VISIBLE_DEVICES};
use super::input::Inputs;
pub use super::types::{KubeletReport, Neutralised};
use super::{AllocationError, Intake, short};
use crate::config::{Config, TrustEnv};
use crate::kubelet::KubeletSource;

/// Env keys that carry a GPU allocation in some dialect.
pub fn is_gpu_env_key(k: &str) -> bool {
    k == NVIDIA_VISIBLE_DEVICES
        || k == NVIDIA_DRIVER_CAPABILITIES
        || container_dialects::is_hami_key(k)
        || k.starts_with(container_dialects::ALIYUN_PREFIX)
}

/// Env entries that ask for a GPU (as opposed to `NVIDIA_VISIBLE_DEVICES=void` or capabilities).
fn asks_for_gpu(k: &str, v: &str) -> bool {
    if k == NVIDIA_VISIBLE_DEVICES {
        return !container_dialects::nvd_requests_nothing(v);
    }
    k != NVIDIA_DRIVER_CAPABILITIES && is_gpu_env_key(k)
}

/// The inputs and configuration the dialect readers see.
pub struct View {
    pub inputs: Inputs,
    /// The configuration with `trust-env` resolved to what this container's env deserves.
    pub config: Config,
    /// Env read from kubelet's record (facets from env are `kubelet`-sourced).
    pub from_kubelet: bool,
    /// GPU env of `config.json` kubelet has no record of (neutralised after the allocation).
    unrecorded: Vec<(String, String)>,
    /// Source expected but unusable: `(checkpoint, why)`.
    unavailable: Option<(String, String)>,
    pub report: Option<KubeletReport>,
}

/// Build the view. Overrides and notes for values that differ from the record go to `intake`.
pub fn view(
    raw: Inputs,
    config: &Config,
    source: &KubeletSource,
    intake: &mut Intake,
) -> Result<View, AllocationError> {
    let mut v = View {
        config: config.clone(),
        inputs: raw,
        from_kubelet: false,
        unrecorded: Vec::new(),
        unavailable: None,
        report: None,
    };
    if !config.allocation.trust_env.is_kubelet() {
        return Ok(v);
    }
    // Until kubelet vouches for it, env is believed for no dialect.
    v.config.allocation.trust_env = TrustEnv::All(false);
    let record = match source {
        KubeletSource::Absent => {
            v.report = Some(KubeletReport {
                status: "absent".into(),
                checkpoint: None,
                dra_state: None,
                why: Some(
                    "no kubelet for this container (no CRI pod identity, a podman container, or no \
                     kubelet directory): env is not trusted"
                        .into(),
                ),
                record: None,
            });
            return Ok(v);
        }
        KubeletSource::Unavailable { checkpoint, why } => {
            v.unavailable = Some((checkpoint.clone(), why.clone()));
            v.report = Some(KubeletReport {
                status: "unavailable".into(),
                checkpoint: Some(checkpoint.clone()),
                dra_state: None,
                why: Some(why.clone()),
                record: None,
            });
            return Ok(v);
        }
        KubeletSource::Record(r) => r,
    };
    let recorded = record
        .env()
        .map_err(|why| AllocationError::new("kubelet.checkpoint", &record.checkpoint, why))?;
    v.config.allocation.trust_env = TrustEnv::All(true);
    v.from_kubelet = true;
    let mut env: Vec<(String, String)> = Vec::with_capacity(v.inputs.env.len());
    let mut seen: Vec<String> = Vec::new();
    for (k, val) in std::mem::take(&mut v.inputs.env) {
        if !is_gpu_env_key(&k) {
            env.push((k, val));
            continue;
        }
        match recorded.get(k.as_str()) {
            None => v.unrecorded.push((k, val)),
            Some((want, res)) => {
                if val != *want && !seen.contains(&k) {
                    intake.env_overrides.push(format!("{k}={want}"));
                    intake.neutralised.push(Neutralised {
                        key: k.clone(),
                        value: short(&val),
                        replacement: Some(want.to_string()),
                        why: format!(
                            "differs from what kubelet recorded for {res} ({want:?}); the recorded value is used"
                        ),
                    });
                }
                seen.push(k);
            }
        }
    }
    // The recorded env, in key order, replaces the GPU env the dialects read; recorded keys
    // missing from config.json are set as recorded.
    for (k, (val, res)) in &recorded {
        if is_gpu_env_key(k) {
            env.push((k.to_string(), val.to_string()));
            if !seen.iter().any(|s| s == k) {
                intake.env_overrides.push(format!("{k}={val}"));
                intake.notes.push(format!(
                    "set {k}={:?} as kubelet recorded for {res}",
                    short(val)
                ));
            }
        }
    }
    v.inputs.env = env;
    v.report = Some(KubeletReport {
        status: "record".into(),
        checkpoint: Some(record.checkpoint.clone()),
        // A record is read with the pod's DRA claims (allocation::record::load).
        dra_state: Some(config.kubelet.dra_checkpoint.display().to_string()),
        why: None,
        record: Some(record.clone()),
    });
    Ok(v)
}

/// GPU env in `config.json` that kubelet has no record of: `NVIDIA_VISIBLE_DEVICES` becomes
/// `void` unless the plan replaces it with the allocated devices; the rest is left, not acted on.
pub fn neutralise_unrecorded(v: &View, replaced_by_plan: bool, intake: &mut Intake) {
    // Every occurrence of a duplicated key counts (the toolkit's env map keeps the last): the
    // one reported is the first that asks for devices, else the first.
    let asks = |k: &str, val: &str| {
        k != NVIDIA_VISIBLE_DEVICES || !container_dialects::nvd_requests_nothing(val)
    };
    let mut done: Vec<&str> = Vec::new();
    for (k, val) in &v.unrecorded {
        if done.contains(&k.as_str()) {
            continue;
        }
        let val = v
            .unrecorded
            .iter()
            .find(|(k2, v2)| k2 == k && asks(k2, v2))
            .map_or(val, |(_, v2)| v2);
        done.push(k);
        let why =
            "kubelet has no record of a device plugin setting it for this container".to_string();
        let replacement = if k == NVIDIA_VISIBLE_DEVICES {
            if replaced_by_plan {
                Some("the allocated devices".to_string())
            } else if !container_dialects::nvd_requests_nothing(val) {
                intake
                    .env_overrides
                    .push(format!("{NVIDIA_VISIBLE_DEVICES}=void"));
                Some("void".to_string())
            } else {
                None
            }
        } else {
            None
        };
        intake.neutralised.push(Neutralised {
            key: k.clone(),
            value: short(val),
            replacement,
            why,
        });
    }
}

/// With kubelet's record expected but unusable, a container whose GPU would come from env
/// alone is refused: one line naming the checkpoint and why.
pub fn refusal(v: &View, has_allocation: bool) -> Result<(), AllocationError> {
    let Some((cp, why)) = &v.unavailable else {
        return Ok(());
    };
    if has_allocation {
        return Ok(());
    }
    // The last one: what the CRI runtime put after the image's env.
    match v
        .inputs
        .env
        .iter()
        .rev()
        .find(|(k, val)| asks_for_gpu(k, val))
    {
        None => Ok(()),
        Some((k, val)) => Err(AllocationError::new(
            k,
            val,
            format!(
                "a GPU from env needs kubelet's record (allocation.trust-env = \"kubelet\"), \
                 and kubelet checkpoint {cp} cannot be used: {why}"
            ),
        )),
    }
}
