//! Memory quantities as schedulers write them.
//!
//! * [`parse_k8s_bytes`]: a Kubernetes resource quantity (`4Gi`, `4096Mi`, `4G`, `500M`, `1.5Gi`,
//!   `1e9`, plain bytes), as `gpufence.dev/memory` carries it. Fractional bytes round up, as
//!   Kubernetes' `Quantity.Value()` does.
//! * [`parse_hami_bytes`]: HAMi's `CUDA_DEVICE_MEMORY_LIMIT_<i>` values: an integer with an
//!   optional `k`/`m`/`g` suffix (either case) meaning ×1024ⁿ, else bytes (as HAMi-core's
//!   `get_limit_from_env`; a leading zero, octal to HAMi-core, is refused).
//!
//! Both parsers take untrusted input: they never panic, reject negative and overflowing values
//! and bound the work they do by refusing over-long strings.

/// Longest quantity string accepted (Kubernetes' own limit on a serialised quantity is far
/// below this; anything longer is an attack or a mistake).
pub const MAX_LEN: usize = 64;

/// Why a quantity was refused (the caller names the key and value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("empty quantity")]
    Empty,
    #[error("longer than {MAX_LEN} characters")]
    TooLong,
    #[error("negative quantities are not allowed")]
    Negative,
    #[error("not a quantity (expected a number with an optional suffix: {0})")]
    Syntax(&'static str),
    #[error("unknown suffix {0:?} ({1})")]
    Suffix(String, &'static str),
    #[error("too large")]
    Overflow,
    #[error("a leading zero (HAMi-core reads it as octal)")]
    LeadingZero,
}

const K8S_SUFFIXES: &str = "Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E, m, or e<exponent>";
const HAMI_SUFFIXES: &str = "k, m, g";

/// A Kubernetes quantity in bytes.
pub fn parse_k8s_bytes(s: &str) -> Result<u64, QuantityError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    if s.len() > MAX_LEN {
        return Err(QuantityError::TooLong);
    }
    let (negative, rest) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    // Number: digits with at most one '.', at least one digit.
    let num_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (num, suffix) = rest.split_at(num_end);
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if frac_part.contains('.') {
        return Err(QuantityError::Syntax(K8S_SUFFIXES));
    }
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(QuantityError::Syntax(K8S_SUFFIXES));
    }
    // mantissa = digits as an integer, scaled by 10^-frac_len.
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 38 {
        return Err(QuantityError::Overflow);
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| QuantityError::Overflow)?
    };
    // Suffix → (binary multiplier, decimal exponent).
    let (mul, mut exp10): (u128, i32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        other => {
            let exp = other
                .strip_prefix('e')
                .or_else(|| other.strip_prefix('E'))
                .filter(|e| {
                    let body = e.strip_prefix(['+', '-']).unwrap_or(e);
                    !body.is_empty() && body.len() <= 4 && body.bytes().all(|b| b.is_ascii_digit())
                })
                .and_then(|e| e.parse::<i32>().ok());
            match exp {
                Some(e) => (1, e),
                None => return Err(QuantityError::Suffix(other.to_string(), K8S_SUFFIXES)),
            }
        }
    };
    if negative && mantissa != 0 {
        return Err(QuantityError::Negative);
    }
    if mantissa == 0 {
        return Ok(0);
    }
    exp10 -= i32::try_from(frac_part.len()).map_err(|_| QuantityError::Overflow)?;
    let mut value = mantissa.checked_mul(mul).ok_or(QuantityError::Overflow)?;
    if exp10 >= 0 {
        for _ in 0..exp10 {
            value = value.checked_mul(10).ok_or(QuantityError::Overflow)?;
            if value > u128::from(u64::MAX) {
                return Err(QuantityError::Overflow);
            }
        }
    } else {
        // Divide, rounding up (a fraction of a byte is a whole byte, as Kubernetes does).
        let mut div: u128 = 1;
        for _ in 0..(-exp10) {
            div = match div.checked_mul(10) {
                Some(d) => d,
                // The divisor exceeds any mantissa: the value is a fraction of a byte.
                None => return Ok(1),
            };
        }
        value = value.div_ceil(div);
    }
    u64::try_from(value).map_err(|_| QuantityError::Overflow)
}

/// A HAMi memory limit (`4096m`, `4g`, `512k`, `1073741824`) in bytes.
pub fn parse_hami_bytes(s: &str) -> Result<u64, QuantityError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    if s.len() > MAX_LEN {
        return Err(QuantityError::TooLong);
    }
    if s.starts_with('-') {
        return Err(QuantityError::Negative);
    }
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(end);
    if num.is_empty() {
        return Err(QuantityError::Syntax(HAMI_SUFFIXES));
    }
    // HAMi-core reads the number with strtoul(…, 0): `010` is 8 there, `0x10` 16 (refused as a
    // suffix above). Refused rather than read differently.
    if num.len() > 1 && num.starts_with('0') {
        return Err(QuantityError::LeadingZero);
    }
    let shift = match suffix {
        "" => 0,
        "k" | "K" => 10,
        "m" | "M" => 20,
        "g" | "G" => 30,
        other => return Err(QuantityError::Suffix(other.to_string(), HAMI_SUFFIXES)),
    };
    let n: u64 = num.parse().map_err(|_| QuantityError::Overflow)?;
    n.checked_mul(1u64 << shift).ok_or(QuantityError::Overflow)
}

/// Bytes for display: `4Gi`, `512Mi`, or plain bytes when not a whole number of KiB.
pub fn format_bytes(b: u64) -> String {
    const UNITS: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    if b == 0 {
        return "0".to_string();
    }
    for (u, shift) in UNITS {
        if b.trailing_zeros() >= shift {
            return format!("{}{u}", b >> shift);
        }
    }
    b.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k8s_table() {
        let gi = 1u64 << 30;
        let cases: &[(&str, Result<u64, ()>)] = &[
            ("4Gi", Ok(4 * gi)),
            ("4096Mi", Ok(4 * gi)),
            ("4G", Ok(4_000_000_000)),
            ("500M", Ok(500_000_000)),
            ("1073741824", Ok(gi)),
            ("0.5Gi", Ok(gi / 2)),
            ("1.5Gi", Ok(gi + gi / 2)),
            (".5Ki", Ok(512)),
            ("1e9", Ok(1_000_000_000)),
            ("1E3", Ok(1000)),
            ("1E", Ok(1_000_000_000_000_000_000)),
            ("2k", Ok(2000)),
            ("1500m", Ok(2)),
            ("1m", Ok(1)),
            ("1n", Ok(1)),
            ("+1Ki", Ok(1024)),
            (" 1Ki ", Ok(1024)),
            ("0", Ok(0)),
            ("-0", Ok(0)),
            ("15Ei", Ok(15 << 60)),
            ("16Ei", Err(())),
            ("99999999999999999999999999999999999999999", Err(())),
            ("1e-3", Ok(1)),
            ("1e99999", Err(())),
            ("-1Gi", Err(())),
            ("4GB", Err(())),
            ("4gi", Err(())),
            ("Gi", Err(())),
            ("", Err(())),
            ("1.2.3", Err(())),
            (".", Err(())),
            ("1 Gi", Err(())),
            ("1Gi1", Err(())),
            ("e3", Err(())),
            ("1e", Err(())),
            ("1e+", Err(())),
        ];
        for (input, want) in cases {
            let got = parse_k8s_bytes(input).map_err(|_| ());
            assert_eq!(&got, want, "input {input:?}");
        }
    }

    #[test]
    fn hami_table() {
        let cases: &[(&str, Result<u64, ()>)] = &[
            ("4096m", Ok(4 << 30)),
            ("4096M", Ok(4 << 30)),
            ("4g", Ok(4 << 30)),
            ("4G", Ok(4 << 30)),
            ("512k", Ok(512 << 10)),
            ("1000", Ok(1000)),
            ("0", Ok(0)),
            ("4Gi", Err(())),
            ("-1m", Err(())),
            ("1.5g", Err(())),
            ("m", Err(())),
            ("", Err(())),
            ("99999999999999999999g", Err(())),
            ("17179869184g", Err(())),
            // HAMi-core's strtoul(…, 0) reads these as octal and hex: refused.
            ("010", Err(())),
            ("0010m", Err(())),
            ("0x10", Err(())),
            ("0m", Ok(0)),
        ];
        for (input, want) in cases {
            let got = parse_hami_bytes(input).map_err(|_| ());
            assert_eq!(&got, want, "input {input:?}");
        }
    }

    #[test]
    fn format() {
        assert_eq!(format_bytes(4 << 30), "4Gi");
        assert_eq!(format_bytes(1536 << 20), "1536Mi");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(0), "0");
    }

    #[test]
    fn long_input_is_refused_quickly() {
        let s = "9".repeat(1 << 20);
        assert_eq!(parse_k8s_bytes(&s), Err(QuantityError::TooLong));
        assert_eq!(parse_hami_bytes(&s), Err(QuantityError::TooLong));
    }
}
