//! Numbers as the schedulers' pod annotations write them.

/// A whole number of at most 19 digits.
pub(crate) fn parse_uint(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}
