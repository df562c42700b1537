//! The compute share's policy (`gpufence.dev/cores-policy`) and the rules `cores` obeys whatever
//! dialect expressed it: a MIG device refuses a share (MIG already isolates compute), and a
//! policy needs a share to apply to.

use super::container_dialects::ANN_CORES_POLICY;
use super::devices::{Resolved, describe};
use super::input::Inputs;
use super::{AllocationError, DeviceRef};

/// Whether the container's compute shares may burst (`true`) or are hard caps (`false`).
/// `cores` is the agreed per-device share with the key and value it came from.
pub fn cores_policy(
    inputs: &Inputs,
    devices: &[Resolved],
    cores: &[(Option<u8>, String, String)],
) -> Result<bool, AllocationError> {
    for (r, (c, key, value)) in devices.iter().zip(cores) {
        if c.is_some() && matches!(r.device, DeviceRef::Mig { .. }) {
            return Err(AllocationError::new(
                key,
                value,
                format!(
                    "{} is a MIG device, which already isolates compute: a compute share applies to whole GPUs only",
                    describe(&r.device, &r.uuid)
                ),
            ));
        }
    }
    let Some(v) = inputs.annotations.get(ANN_CORES_POLICY) else {
        return Ok(false);
    };
    let burst = match v.trim() {
        "hard" => false,
        "burst" => true,
        _ => {
            return Err(AllocationError::new(
                ANN_CORES_POLICY,
                v,
                "expected hard or burst",
            ));
        }
    };
    if !cores.iter().any(|c| c.0.is_some()) {
        return Err(AllocationError::new(
            ANN_CORES_POLICY,
            v,
            "no compute share to apply it to (set gpufence.dev/cores)",
        ));
    }
    Ok(burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(policy: Option<&str>) -> Inputs {
        let mut i = Inputs::default();
        if let Some(p) = policy {
            i.annotations
                .insert(ANN_CORES_POLICY.to_string(), p.to_string());
        }
        i
    }

    fn dev(device: DeviceRef) -> Resolved {
        Resolved {
            device,
            uuid: "GPU-x".into(),
            memory_bytes: 1 << 30,
        }
    }

    fn share(c: Option<u8>) -> (Option<u8>, String, String) {
        (c, "gpufence.dev/cores".into(), "30".into())
    }

    #[test]
    fn policies() {
        let gpu = [dev(DeviceRef::Gpu { index: 0 })];
        assert_eq!(
            cores_policy(&inputs(None), &gpu, &[share(Some(30))]),
            Ok(false)
        );
        assert_eq!(
            cores_policy(&inputs(Some("burst")), &gpu, &[share(Some(30))]),
            Ok(true)
        );
        assert_eq!(
            cores_policy(&inputs(Some("hard")), &gpu, &[share(Some(30))]),
            Ok(false)
        );
        let e = cores_policy(&inputs(Some("soft")), &gpu, &[share(Some(30))]).unwrap_err();
        assert_eq!(e.key, ANN_CORES_POLICY);
        let e = cores_policy(&inputs(Some("burst")), &gpu, &[share(None)]).unwrap_err();
        assert!(e.why.contains("no compute share"), "{e}");
        // no cores at all and no policy: fine
        assert_eq!(cores_policy(&inputs(None), &gpu, &[]), Ok(false));
    }

    #[test]
    fn mig_refuses_a_share() {
        let mig = [dev(DeviceRef::Mig { gpu: 0, mig: 1 })];
        let e = cores_policy(&inputs(None), &mig, &[share(Some(30))]).unwrap_err();
        assert_eq!(e.key, "gpufence.dev/cores");
        assert!(e.to_string().contains("MIG 0:1"), "{e}");
        assert_eq!(cores_policy(&inputs(None), &mig, &[share(None)]), Ok(false));
    }
}
