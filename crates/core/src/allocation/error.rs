//! Why an allocation is refused: [`AllocationError`], one line naming the key, its value and why.

/// Why an allocation is refused: one line naming the input key, its value and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}={value:?}: {why}")]
pub struct AllocationError {
    /// The annotation or env key at fault (or the CDI spec file).
    pub key: String,
    /// The offending value (truncated for display by the constructor).
    pub value: String,
    pub why: String,
}

/// Longest reason an [`AllocationError`] keeps (longer ones are clipped, with `…`).
pub const MAX_WHY: usize = 900;

impl AllocationError {
    /// Build an error, truncating huge values so the message stays one readable line.
    pub fn new(key: impl Into<String>, value: &str, why: impl Into<String>) -> Self {
        const MAX: usize = 120;
        let value = if value.len() > MAX {
            format!("{}…({} bytes)", crate::text::clip(value, MAX), value.len())
        } else {
            value.to_string()
        };
        let mut why: String = why.into();
        // Reasons may quote parts of the input: keep them bounded too — but whole where they
        // name a pod, its claims' CDI ids and what kubelet recorded (a refusal of a DRA pod is
        // easily 500 bytes, its most useful part at the end).
        if why.len() > MAX_WHY {
            why = format!("{}…", crate::text::clip(&why, MAX_WHY));
        }
        AllocationError {
            key: key.into(),
            value: value.replace('\n', "\\n"),
            why: why.replace('\n', " "),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_kept_whole_up_to_max_why_then_clipped() {
        // A DRA pod's refusal: the pod, the claim's CDI ids and kubelet's record, whole.
        let id = "k8s.gpu.nvidia.com/claim=c0ffee00-0000-4000-8000-00000000000e-gpu-1";
        let why = format!(
            "GPU 1 (GPU-6f7a3c01-5e11-4f1e-9a3c-00d15ca1ab1f) is not among what kubelet recorded \
             for container trainer of pod ml-team-a/llm-finetune-7f9c8d6b5-x2k4q \
             (allocation.trust-annotations = \"kubelet\"); kubelet recorded: DRA claim \
             ml-team-a/llm-finetune-7f9c8d6b5-x2k4q-gpu-xr5tz [k8s.gpu.nvidia.com/device=gpu-1, \
             {id}: in no CDI spec read from cdi.spec-dirs]"
        );
        assert!(why.len() > 400 && why.len() <= MAX_WHY);
        assert_eq!(
            AllocationError::new("linux.devices", "/dev/nvidia1", why.clone()).why,
            why
        );
        let long = "x".repeat(3 * MAX_WHY);
        let e = AllocationError::new("k", "v", long);
        assert_eq!(e.why, format!("{}…", "x".repeat(MAX_WHY)));
    }
}
