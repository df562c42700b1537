//! What ldconfig reads from a shared object for its cache entry (glibc `elf/readelflib.c` and
//! the x86 wrapper): the soname and the cache flags. 32/64-bit,
//! little-endian. Reads through `read_at`, so a library is never mapped or read whole; every
//! offset is checked.

use super::cache::{
    FLAG_AARCH64_LIB64, FLAG_ELF, FLAG_ELF_LIBC6, FLAG_POWERPC_LIB64, FLAG_X8664_LIB64,
    FLAG_X8664_LIBX32,
};

const ET_DYN: u16 = 3;
const EM_386: u16 = 3;
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;
const EM_PPC64: u16 = 21;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_SONAME: u64 = 14;
/// Largest header/segment piece read (program headers, dynamic section, notes).
const MAX_PIECE: u64 = 1 << 20;

/// A shared object as ldconfig sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dso {
    pub soname: Option<String>,
    pub flags: i32,
    pub osversion: u32,
}

/// `read_at(offset, buf)` fills `buf` from `offset` or fails.
pub type ReadAt<'a> = dyn Fn(u64, &mut [u8]) -> std::io::Result<()> + 'a;

fn piece(read_at: &ReadAt, off: u64, len: u64) -> Option<Vec<u8>> {
    if len > MAX_PIECE {
        return None;
    }
    let mut b = vec![0u8; len as usize];
    read_at(off, &mut b).ok()?;
    Some(b)
}

struct Shape {
    is64: bool,
}

impl Shape {
    fn word(&self, b: &[u8], o: usize) -> Option<u64> {
        if self.is64 {
            Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
        } else {
            Some(u64::from(u32::from_le_bytes(
                b.get(o..o + 4)?.try_into().ok()?,
            )))
        }
    }
    fn half(b: &[u8], o: usize) -> Option<u16> {
        Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
    }
    fn u32(b: &[u8], o: usize) -> Option<u32> {
        Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
    }
}

struct Segment {
    kind: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
}

/// The NUL-terminated string at file offset `off` (at most 4 KiB).
fn string_at(read_at: &ReadAt, off: u64, len: u64) -> Option<String> {
    let want = 4096.min(len.checked_sub(off)?);
    let b = piece(read_at, off, want)?;
    let end = b.iter().position(|&c| c == 0)?;
    String::from_utf8(b[..end].to_vec()).ok()
}

/// Inspect a shared object of `len` bytes. `None`: not an ELF shared object ldconfig would
/// cache (wrong type, unsupported class or byte order, no dynamic section, truncated).
pub fn inspect(read_at: &ReadAt, len: u64) -> Option<Dso> {
    let eh = piece(read_at, 0, 64.min(len))?;
    if eh.len() < 52 || eh[..4] != *b"\x7fELF" || eh[5] != 1 {
        return None;
    }
    let sh = Shape { is64: eh[4] == 2 };
    if !sh.is64 && eh[4] != 1 {
        return None;
    }
    if Shape::half(&eh, 16)? != ET_DYN {
        return None;
    }
    let machine = Shape::half(&eh, 18)?;
    let (phoff, phentsize, phnum) = if sh.is64 {
        (
            sh.word(&eh, 32)?,
            Shape::half(&eh, 54)?,
            Shape::half(&eh, 56)?,
        )
    } else {
        (
            sh.word(&eh, 28)?,
            Shape::half(&eh, 42)?,
            Shape::half(&eh, 44)?,
        )
    };
    let min_ph = if sh.is64 { 56 } else { 32 };
    if phentsize < min_ph {
        return None;
    }
    let ph = piece(read_at, phoff, u64::from(phentsize) * u64::from(phnum))?;
    let segs: Vec<Segment> = ph
        .chunks_exact(usize::from(phentsize))
        .filter_map(|p| {
            Some(if sh.is64 {
                Segment {
                    kind: Shape::u32(p, 0)?,
                    offset: sh.word(p, 8)?,
                    vaddr: sh.word(p, 16)?,
                    filesz: sh.word(p, 32)?,
                }
            } else {
                Segment {
                    kind: Shape::u32(p, 0)?,
                    offset: sh.word(p, 4)?,
                    vaddr: sh.word(p, 8)?,
                    filesz: sh.word(p, 16)?,
                }
            })
        })
        .collect();

    let mut flags = FLAG_ELF;
    let mut dynamic = None;
    for s in &segs {
        match s.kind {
            PT_DYNAMIC if dynamic.is_none() => dynamic = Some((s.offset, s.filesz)),
            PT_INTERP
                if string_at(read_at, s.offset, len).as_deref() == Some("/lib/ld-linux.so.2") =>
            {
                flags = FLAG_ELF_LIBC6;
            }
            _ => {}
        }
    }
    let (doff, dsz) = dynamic?;
    if dsz == 0 {
        return None;
    }
    let dy = piece(read_at, doff, dsz)?;
    let dent = if sh.is64 { 16 } else { 8 };
    let dyns: Vec<(u64, u64)> = dy
        .chunks_exact(dent)
        .map(|e| {
            (
                sh.word(e, 0).unwrap_or(0),
                sh.word(e, dent / 2).unwrap_or(0),
            )
        })
        .take_while(|&(t, _)| t != DT_NULL)
        .collect();
    let strtab = dyns.iter().find(|(t, _)| *t == DT_STRTAB)?.1;
    // The string table's virtual address → file offset through the PT_LOAD that maps it.
    let loadoff = segs
        .iter()
        .find(|s| s.kind == PT_LOAD && strtab >= s.vaddr && strtab - s.vaddr < s.filesz)
        .map_or(0, |s| s.vaddr.wrapping_sub(s.offset));
    let str_off = strtab.wrapping_sub(loadoff);
    let mut soname = None;
    for &(tag, val) in &dyns {
        match tag {
            DT_NEEDED if flags == FLAG_ELF => {
                let name = string_at(read_at, str_off.checked_add(val)?, len)?;
                if matches!(name.as_str(), "libc.so.6" | "libm.so.6" | "libdl.so.2") {
                    flags = FLAG_ELF_LIBC6;
                }
            }
            DT_SONAME if soname.is_none() => {
                soname = Some(string_at(read_at, str_off.checked_add(val)?, len)?)
            }
            _ => {}
        }
    }
    // The per-architecture readelflib wrappers (64-bit libraries are always libc6).
    flags = match (machine, sh.is64) {
        (EM_X86_64, true) => FLAG_X8664_LIB64 | FLAG_ELF_LIBC6,
        (EM_X86_64, false) => FLAG_X8664_LIBX32 | FLAG_ELF_LIBC6,
        (EM_AARCH64, true) => FLAG_AARCH64_LIB64 | FLAG_ELF_LIBC6,
        (EM_PPC64, true) => FLAG_POWERPC_LIB64 | FLAG_ELF_LIBC6,
        (EM_386, false) => flags,
        _ => return None,
    };
    Some(Dso {
        soname: soname.filter(|s| !s.is_empty()),
        flags,
        // glibc ≥ 2.36's ldconfig no longer reads the GNU ABI note: 0, as it stores.
        osversion: 0,
    })
}

/// [`inspect`] a file.
pub fn inspect_file(f: &std::fs::File) -> Option<Dso> {
    use std::os::unix::fs::FileExt;
    let len = f.metadata().ok()?.len();
    inspect(&|off, buf| f.read_exact_at(buf, off), len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(b: &[u8]) -> Option<Dso> {
        inspect(
            &|off, buf| {
                let s = usize::try_from(off).map_err(|_| std::io::ErrorKind::InvalidInput)?;
                let src = b
                    .get(s..s + buf.len())
                    .ok_or(std::io::ErrorKind::UnexpectedEof)?;
                buf.copy_from_slice(src);
                Ok(())
            },
            b.len() as u64,
        )
    }

    #[test]
    fn minimal_object_is_an_x86_64_libc6_library() {
        let b = crate::soname::minimal_shared_object("libcuda.so.1");
        assert_eq!(
            of(&b),
            Some(Dso {
                soname: Some("libcuda.so.1".into()),
                flags: 0x303,
                osversion: 0
            })
        );
        assert_eq!(of(&b[..100]), None);
        assert_eq!(of(b"not elf at all, not at all"), None);
    }

    #[test]
    fn host_libc_is_an_x86_64_libc6_library() {
        let Ok(f) = std::fs::File::open("/lib/x86_64-linux-gnu/libc.so.6") else {
            return;
        };
        let d = inspect_file(&f).expect("libc is a DSO");
        assert_eq!(d.soname.as_deref(), Some("libc.so.6"));
        assert_eq!(d.flags, 0x303);
    }

    proptest::proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400), at in 16usize..200) {
            let _ = of(&bytes);
            let mut b = crate::soname::minimal_shared_object("libg.so.1");
            let n = bytes.len().min(b.len().saturating_sub(at));
            b[at..at + n].copy_from_slice(&bytes[..n]);
            let _ = of(&b);
        }
    }
}
