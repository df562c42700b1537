//! Errors in runc's own `--log` format, so that whoever reads runc's log (containerd shows its
//! last error to the CRI client) sees gpufence's refusal.
//!
//! runc (logrus) writes, with `--log-format json`:
//! `{"level":"error","msg":"…","time":"2024-05-01T10:00:00Z"}`; with text:
//! `time="2024-05-01T10:00:00Z" level=error msg="…"`.

use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// RFC 3339 UTC timestamp with seconds (`2024-05-01T10:00:00Z`).
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// One error line in runc's format.
pub fn format_error(msg: &str, json: bool, t: SystemTime) -> String {
    let time = rfc3339(t);
    if json {
        serde_json::json!({"level": "error", "msg": msg, "time": time}).to_string()
    } else {
        // logrus text formatter quotes values with Go's %q.
        format!("time=\"{time}\" level=error msg={}", go_quote(msg))
    }
}

fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Append the error line to runc's log file (best effort: the message also goes to stderr).
pub fn append_error(path: &Path, msg: &str, json: bool) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut line = format_error(msg, json, SystemTime::now());
    line.push('\n');
    f.write_all(line.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn time_format() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_714_557_600 + 59);
        assert_eq!(rfc3339(t), "2024-05-01T10:00:59Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400); // leap day
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn formats() {
        let t = UNIX_EPOCH;
        assert_eq!(
            format_error("bad \"x\"", true, t),
            r#"{"level":"error","msg":"bad \"x\"","time":"1970-01-01T00:00:00Z"}"#
        );
        assert_eq!(
            format_error("bad \"x\"", false, t),
            r#"time="1970-01-01T00:00:00Z" level=error msg="bad \"x\"""#
        );
    }
}
