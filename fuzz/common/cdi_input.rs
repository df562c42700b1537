//! The input of the CDI spec fuzz targets: one selector byte (even = `.json`, odd = `.yaml`), then
//! the file's text.

/// The file's path (`<stem>.json` or `<stem>.yaml`) and text; `None` for an empty or non-UTF-8
/// input.
pub fn split<'a>(data: &'a [u8], stem: &str) -> Option<(String, &'a str)> {
    let (&sel, rest) = data.split_first()?;
    let text = std::str::from_utf8(rest).ok()?;
    let ext = if sel & 1 == 0 { "json" } else { "yaml" };
    Some((format!("{stem}.{ext}"), text))
}
