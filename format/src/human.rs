//! Byte counts for people (`2.0 GiB`). Shared with the shim: core/alloc only.

/// `2.0 GiB`, `512.0 MiB`, `100 B`; `whole`: `4 GiB` when the value is a whole number of units.
pub fn size(b: u64, whole: bool) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut unit = 1024u64;
    let mut name = UNITS[0];
    for u in &UNITS[1..] {
        if b / unit < 1024 {
            break;
        }
        unit *= 1024;
        name = u;
    }
    if whole && b.is_multiple_of(unit) {
        format!("{} {name}", b / unit)
    } else {
        format!("{:.1} {name}", b as f64 / unit as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::size;

    #[test]
    fn sizes() {
        let g = 1u64 << 30;
        assert_eq!(size(2 * g, false), "2.0 GiB");
        assert_eq!(size(7 * g / 2, false), "3.5 GiB");
        assert_eq!(size(4 * g, true), "4 GiB");
        assert_eq!(size(100 << 20, true), "100 MiB");
        assert_eq!(size(1536, true), "1.5 KiB");
        assert_eq!(size(1000, false), "1000 B");
        assert_eq!(size(u64::MAX, true), "16384.0 PiB");
    }
}
