//! A host file's identity as the wrapper's records keep it ([`crate::passthrough`]'s
//! configuration file, [`crate::ldfacts`]'s driver libraries): device, inode, size, mtime and
//! ctime to the nanosecond — a file replaced (new inode) or rewritten (new ctime, which no caller
//! can set) no longer matches.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How recent a change must be for an identity not to be recorded: file times advance by the
/// kernel's clock tick (1–10 ms), so two writes of the same size in one tick leave the same
/// identity; a file last changed longer ago than this cannot be rewritten unseen (git's "racy"
/// rule). Such a file is simply read again next time.
pub const SETTLE: Duration = Duration::from_millis(100);

/// `dev:ino:size:mtime.ns:ctime.ns`.
pub fn identity(m: &std::fs::Metadata) -> String {
    format!(
        "{}:{}:{}:{}.{}:{}.{}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    )
}

/// Whether the file was modified, or its inode changed, within [`SETTLE`] of now.
pub fn changed_lately(m: &std::fs::Metadata) -> bool {
    let at = |s: i64, ns: i64| {
        UNIX_EPOCH
            + Duration::new(
                u64::try_from(s).unwrap_or(0),
                u32::try_from(ns.clamp(0, 999_999_999)).unwrap_or(0),
            )
    };
    let newest = at(m.mtime(), m.mtime_nsec()).max(at(m.ctime(), m.ctime_nsec()));
    SystemTime::now()
        .duration_since(newest)
        .map_or(true, |age| age < SETTLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewrite_changes_the_identity_and_is_recent() {
        let d = std::env::temp_dir().join(format!("gpufence-fileid-{}", std::process::id()));
        std::fs::write(&d, "a").unwrap();
        let before = std::fs::metadata(&d).unwrap();
        assert!(changed_lately(&before));
        std::thread::sleep(SETTLE + Duration::from_millis(20));
        assert!(!changed_lately(&std::fs::metadata(&d).unwrap()));
        std::fs::write(&d, "b").unwrap();
        let after = std::fs::metadata(&d).unwrap();
        assert_ne!(identity(&before), identity(&after));
        std::fs::remove_file(&d).unwrap();
    }
}
