//! Ground: small text rules shared by every layer — values shortened for one-line messages, and
//! the container-id rule that makes an id safe as a path component under `state-dir`.

/// The longest prefix of `s` of at most `max` bytes that ends at a character boundary.
pub fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A value shortened for messages (at most 64 bytes, cut at a character boundary, `…` after).
pub fn short(s: &str) -> String {
    const MAX: usize = 64;
    if s.len() <= MAX {
        return s.to_string();
    }
    format!("{}…", clip(s, MAX))
}

/// runc's rule for container ids (`^[\w+-\.]+$`: letters, digits, `_ + , - .`; not `.` or
/// `..`), at most 255 bytes: what makes an id safe as a path component under `state-dir`.
/// `None` when `id` follows it, else why not.
pub fn container_id_problem(id: &str) -> Option<&'static str> {
    if id.is_empty() {
        return Some("empty");
    }
    if id == "." || id == ".." {
        return Some("not a valid path component");
    }
    if id.len() > 255 {
        return Some("longer than 255 bytes");
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b',' | b'-' | b'.'))
    {
        return Some("only letters, digits and _ + , - . are allowed");
    }
    None
}

/// [`container_id_problem`] as a predicate.
pub fn valid_container_id(id: &str) -> bool {
    container_id_problem(id).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids() {
        for ok in ["a", "A-b_c.d+e,f", "0", &"x".repeat(255)] {
            assert!(valid_container_id(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../x",
            "a b",
            "ä",
            "a\0b",
            &"x".repeat(256),
        ] {
            assert!(container_id_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn clip_keeps_whole_characters() {
        assert_eq!(clip("abc", 5), "abc");
        assert_eq!(clip("abc", 2), "ab");
        assert_eq!(clip("aé", 2), "a");
        assert_eq!(clip("", 0), "");
    }

    #[test]
    fn short_cuts_at_a_char_boundary() {
        assert_eq!(short("abc"), "abc");
        let long = "é".repeat(40);
        let s = short(&long);
        assert!(s.ends_with('…') && s.len() <= 64 + '…'.len_utf8(), "{s}");
    }
}
