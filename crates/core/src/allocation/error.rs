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
        // Reasons may quote parts of the input: keep them short too.
        const MAX_WHY: usize = 400;
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
