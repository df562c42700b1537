//! A shared DRA device held to its share ([`super::dra_share`] reads it): no limit becomes the
//! share, a lower one stays, a higher one is refused. Pure.

use super::dra_share::human_bytes;

/// What the DRA shares did to one container's limits: where each came from, and notes.
#[derive(Debug, Default)]
pub(super) struct Applied {
    pub sources: Vec<super::FacetSource>,
    pub notes: Vec<String>,
}

/// Hold every device that is a shared DRA device to its share: no limit becomes the share, a
/// lower one stays, a higher one is refused; a share that cannot be read refuses the container
/// (fail closed).
pub(super) fn apply(
    recorded: Option<&super::backing::Recorded>,
    devices: &[super::devices::Resolved],
    memory: &mut super::replicas::Limits<u64>,
    cores: &mut super::replicas::Limits<u8>,
) -> Result<Applied, super::AllocationError> {
    use super::devices::describe;
    let mut out = Applied::default();
    let Some(rec) = recorded else {
        return Ok(out);
    };
    for (i, r) in devices.iter().enumerate() {
        let Some(share) = rec.share_of(r.device) else {
            continue;
        };
        let claim = match rec.backing_of(r.device) {
            Some(super::backing::Backing::DraClaim { claim, .. }) => claim.as_str(),
            _ => "-",
        };
        let s = share.as_ref().map_err(|why| {
            super::AllocationError::new(
                "DRA claim",
                claim,
                format!(
                    "{} is a shared device (ShareID in kubelet's DRA state) whose share cannot be read: {why}",
                    describe(&r.device, &r.uuid)
                ),
            )
        })?;
        while memory.len() <= i {
            memory.push((None, String::new(), String::new()));
        }
        while cores.len() <= i {
            cores.push((None, String::new(), String::new()));
        }
        let what = format!("DRA claim {claim}: share of {} ({})", r.uuid, s.source);
        let ceiling =
            |slot: &mut (Option<u64>, String, String), limit: u64, show: &dyn Fn(u64) -> String| {
                match slot.0 {
                    None => {
                        *slot = (Some(limit), "DRA claim".to_string(), what.clone());
                        Ok(())
                    }
                    Some(v) if v > limit => Err(super::AllocationError::new(
                        &slot.1,
                        &slot.2,
                        format!(
                            "{} is more than the share of {} that DRA claim {claim} holds ({}); an \
                         annotation may lower the share, never raise it",
                            show(v),
                            describe(&r.device, &r.uuid),
                            show(limit)
                        ),
                    )),
                    Some(_) => Ok(()),
                }
            };
        if let Some(m) = s.memory {
            ceiling(&mut memory[i], m, &human_bytes)?;
            out.sources.push(source("memory", &what));
        }
        if let Some(c) = s.cores {
            let mut slot = (
                cores[i].0.map(u64::from),
                cores[i].1.clone(),
                cores[i].2.clone(),
            );
            ceiling(&mut slot, u64::from(c), &|c| format!("{c}%"))?;
            cores[i] = (slot.0.and_then(|c| u8::try_from(c).ok()), slot.1, slot.2);
            out.sources.push(source("cores", &what));
        }
        out.notes.push(format!(
            "DRA share: {} holds {} of {} ({})",
            claim,
            s.shown(),
            describe(&r.device, &r.uuid),
            s.source
        ));
        tracing::info!(device = %r.uuid, claim, share = %s.shown(), source = %s.source, "DRA device share");
    }
    Ok(out)
}

fn source(facet: &str, what: &str) -> super::FacetSource {
    super::FacetSource {
        facet: facet.to_string(),
        dialect: crate::config::Dialect::Devices,
        origin: super::Origin::Kubelet,
        key: "DRA claim".to_string(),
        value: what.to_string(),
    }
}
