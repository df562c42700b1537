//! What the ld cache needs of each driver library (soname, cache flags, OS version), remembered
//! per host file in `state-dir/ld-facts`, so a create reads it with one `stat` per library
//! instead of opening and reading every library's ELF headers again (≈ 8 syscalls each).
//!
//! A fact is used only while the file's identity ([`crate::fileid::identity`]: device, inode,
//! size, mtime, ctime) is the one recorded with it; a file changed within
//! [`crate::fileid::SETTLE`] is read and not recorded. A file that is not a shared object is
//! recorded as such (the simulated node's data files sit among the libraries). The record is
//! the host's own (root's state directory, never mounted into a container); an unreadable or
//! malformed one is read past, and rewritten whole (temporary file, then rename).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::enter::ldcache::{Library, known_libraries};

/// The record's name under `state-dir` (a container id it would collide with is refused).
pub const FILE: &str = crate::plan::LD_FACTS_FILE;
/// The most files remembered (every driver file of a node is a few dozen).
const MAX_ENTRIES: usize = 1024;
const MAGIC: &str = "gpufence-ld-facts-1";

/// One remembered file: its identity, and its facts (`None`: not a shared object).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fact {
    identity: String,
    lib: Option<(String, i32, u32)>,
}

/// `<identity> <flags> <osversion> <soname or -> <host path>` per line; the path (last, may hold
/// spaces) and the soname never hold a newline (such files are not recorded).
fn parse(text: &str) -> BTreeMap<PathBuf, Fact> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return BTreeMap::new();
    }
    lines
        .filter_map(|l| {
            let mut f = l.splitn(5, ' ');
            let (identity, flags, osv, soname, path) =
                (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
            let lib = match soname {
                "-" => None,
                s => Some((s.to_string(), flags.parse().ok()?, osv.parse().ok()?)),
            };
            Some((
                PathBuf::from(path),
                Fact {
                    identity: identity.to_string(),
                    lib,
                },
            ))
        })
        .collect()
}

fn render(facts: &BTreeMap<PathBuf, Fact>) -> String {
    let mut out = format!("{MAGIC}\n");
    for (path, f) in facts {
        let (soname, flags, osv) = match &f.lib {
            Some((s, flags, osv)) => (s.as_str(), *flags, *osv),
            None => ("-", 0, 0),
        };
        out.push_str(&format!(
            "{} {flags} {osv} {soname} {}\n",
            f.identity,
            path.display()
        ));
    }
    out
}

/// Whether a fact about `path` can be written on one line and read back.
fn recordable(path: &Path, lib: Option<&Library>) -> bool {
    let plain = |s: &[u8]| !s.contains(&b'\n') && !s.is_empty();
    plain(path.as_os_str().as_bytes())
        && lib.is_none_or(|l| plain(l.soname.as_bytes()) && !l.soname.contains(' '))
}

/// The record, loaded once per create ([`Facts::load`]), asked for each list of mounts
/// ([`Facts::known`]) and written back when it learnt something ([`Facts::save`]).
#[derive(Debug)]
pub struct Facts {
    record: PathBuf,
    facts: BTreeMap<PathBuf, Fact>,
    changed: bool,
}

impl Facts {
    /// `state-dir`'s record (empty when missing or unreadable).
    pub fn load(state_dir: &Path) -> Facts {
        let record = state_dir.join(FILE);
        let facts = std::fs::read_to_string(&record)
            .map(|t| parse(&t))
            .unwrap_or_default();
        Facts {
            record,
            facts,
            changed: false,
        }
    }

    /// The libraries among `mounts` (container path, host path), as
    /// [`crate::enter::ldcache::known_libraries`] finds them, from the record where it is fresh.
    pub fn known(&mut self, mounts: &[(String, PathBuf)]) -> Vec<Library> {
        mounts
            .iter()
            .filter_map(|(target, host)| self.library(target, host))
            .collect()
    }

    fn library(&mut self, target: &str, host: &Path) -> Option<Library> {
        let m = std::fs::metadata(host).ok().filter(|m| m.is_file())?;
        let identity = crate::fileid::identity(&m);
        let p = Path::new(target);
        let (folder, file) = (p.parent()?.to_str()?, p.file_name()?.to_str()?);
        if let Some(f) = self.facts.get(host).filter(|f| f.identity == identity) {
            let (soname, flags, osversion) = f.lib.clone()?;
            return Some(Library {
                folder: folder.to_string(),
                file: file.to_string(),
                soname,
                flags,
                osversion,
                linked: false,
            });
        }
        let lib = known_libraries(&[(target.to_string(), host.to_path_buf())])
            .into_iter()
            .next();
        // Recorded only when the file was the same before and after it was read.
        let same = std::fs::metadata(host).is_ok_and(|after| {
            crate::fileid::identity(&after) == identity && !crate::fileid::changed_lately(&after)
        });
        if same && recordable(host, lib.as_ref()) && self.facts.len() < MAX_ENTRIES {
            let fact = Fact {
                identity,
                lib: lib
                    .as_ref()
                    .map(|l| (l.soname.clone(), l.flags, l.osversion)),
            };
            self.facts.insert(host.to_path_buf(), fact);
            self.changed = true;
        }
        lib
    }

    /// Write the record back if it learnt something (best effort: one log line otherwise).
    pub fn save(self) {
        if self.changed
            && let Err(e) = write(&self.record, &render(&self.facts))
        {
            tracing::warn!(file = %self.record.display(), error = %e, "driver library facts not recorded");
        }
    }
}

fn write(record: &Path, text: &str) -> std::io::Result<()> {
    let tmp = record.with_file_name(format!(".{FILE}.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let r = f.write_all(text.as_bytes()).and_then(|()| {
        drop(f);
        std::fs::rename(&tmp, record)
    });
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_and_parse_round_trip() {
        let mut facts = BTreeMap::new();
        facts.insert(
            PathBuf::from("/usr/lib/a b/libcuda.so.1"),
            Fact {
                identity: "1:2:3:4.5:6.7".into(),
                lib: Some(("libcuda.so.1".into(), 0x303, 0x30200)),
            },
        );
        facts.insert(
            PathBuf::from("/usr/lib/data.json"),
            Fact {
                identity: "1:3:3:4.5:6.7".into(),
                lib: None,
            },
        );
        assert_eq!(parse(&render(&facts)), facts);
        assert!(parse("not the magic\n1 2 3 - /x\n").is_empty());
        // Malformed lines are read past.
        let text = format!("{MAGIC}\nshort line\n1:1 x 0 so /p\n");
        assert!(parse(&text).is_empty());
        assert!(!recordable(Path::new("/a\nb"), None));
    }

    #[test]
    fn remembers_a_file_until_it_changes() {
        let d = std::env::temp_dir().join(format!("gpufence-ldfacts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let data = d.join("data.json");
        std::fs::write(&data, "{}").unwrap();
        let lib = d.join("libc.so.6");
        std::fs::copy("/lib/x86_64-linux-gnu/libc.so.6", &lib).unwrap();
        std::thread::sleep(crate::fileid::SETTLE + std::time::Duration::from_millis(20));
        let mounts = vec![
            ("/usr/lib/x/data.json".to_string(), data.clone()),
            ("/usr/lib/x/libc.so.6".to_string(), lib.clone()),
        ];
        let known = |m: &[(String, PathBuf)]| {
            let mut f = Facts::load(&d);
            let libs = f.known(m);
            f.save();
            libs
        };
        let direct = known_libraries(&mounts);
        assert_eq!(direct.len(), 1, "{direct:?}");
        assert_eq!(known(&mounts), direct);
        let text = std::fs::read_to_string(d.join(FILE)).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        // From the record: the same answer.
        assert_eq!(known(&mounts), direct);
        // The record is the host's own and believed while the identity matches (here a forged
        // soname proves it is read, not the file); a changed file is read again.
        let forged = text.replace("libc.so.6 ", "libforged.so ");
        std::fs::write(d.join(FILE), &forged).unwrap();
        assert_eq!(known(&mounts)[0].soname, "libforged.so");
        std::fs::write(&lib, "not an ELF file").unwrap();
        assert_eq!(known(&mounts), Vec::new());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
