//! The glibc `ld.so.cache` format: parse (the `ld.so-1.7.0` format, the `glibc-ld.so.cache1.1`
//! format alone or hidden behind the old one, its extension directory with the generator string
//! and the `glibc-hwcaps` subdirectory names) and write the new format exactly as glibc ≥ 2.33's
//! `ldconfig` writes it (entry order, string table with tail merging, extension directory), so
//! `write(parse(x)) == x` for a cache written by that `ldconfig`.
//!
//! Layout (glibc `sysdeps/generic/dl-cache.h`, `elf/cache.c`, `elf/stringtable.c`):
//! a 48-byte header (`glibc-ld.so.cache1.1`, nlibs, len_strings, flags = endianness, extension
//! offset), `nlibs` 24-byte entries (flags, key, value, osversion, hwcap), the string table
//! (offsets relative to the header), then, 4-aligned, the extension directory (magic, count,
//! 16-byte section descriptors), the hwcaps array (u32 string offsets) and the generator string.
//!
//! Pure: bytes in, bytes out. The input is the image author's: every offset and count is
//! checked against the buffer, nothing is trusted.

use std::cmp::Ordering;

const MAGIC_OLD: &[u8] = b"ld.so-1.7.0";
const MAGIC_NEW: &[u8] = b"glibc-ld.so.cache1.1";
const HEADER_NEW: usize = 48;
const ENTRY_NEW: usize = 24;
const HEADER_OLD: usize = 16;
const ENTRY_OLD: usize = 12;
/// `cache_extension_magic` ((uint32_t) -358342284).
const EXTENSION_MAGIC: u32 = (-358342284i32) as u32;
const TAG_GENERATOR: u32 = 0;
const TAG_HWCAPS: u32 = 1;
/// `DL_CACHE_HWCAP_EXTENSION`: the low 32 bits of hwcap index the glibc-hwcaps names.
pub const HWCAP_EXTENSION: u64 = 1 << 62;
const ISA_LEVEL_MASK: u64 = (1 << 10) - 1;
const ENDIAN_LITTLE: u8 = 2;

/// ldconfig's flags: `FLAG_ELF_LIBC6`, and the ABI bits ld.so requires on 64-bit hosts.
pub const FLAG_ELF: i32 = 0x0001;
pub const FLAG_ELF_LIBC6: i32 = 0x0003;
pub const FLAG_X8664_LIB64: i32 = 0x0300;
pub const FLAG_POWERPC_LIB64: i32 = 0x0500;
pub const FLAG_X8664_LIBX32: i32 = 0x0800;
pub const FLAG_AARCH64_LIB64: i32 = 0x0a00;

/// One cache entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub flags: i32,
    /// The soname looked up (`libcuda.so.1`).
    pub key: Vec<u8>,
    /// The path ld.so opens.
    pub value: Vec<u8>,
    pub osversion: u32,
    /// As stored, except for glibc-hwcaps entries, whose low 32 bits (the index into the
    /// hwcaps section) are recomputed on write from [`Entry::hwcaps`].
    pub hwcap: u64,
    /// The glibc-hwcaps subdirectory name (`x86-64-v3`) of an extension entry.
    pub hwcaps: Option<Vec<u8>>,
}

impl Entry {
    /// A plain entry (no hwcap), as ldconfig adds for a library in an ordinary directory.
    pub fn new(key: &str, value: &str, flags: i32, osversion: u32) -> Entry {
        Entry {
            flags,
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            osversion,
            hwcap: 0,
            hwcaps: None,
        }
    }
}

/// A parsed cache: its entries in file order and the generator string, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cache {
    pub entries: Vec<Entry>,
    pub generator: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("not an ld.so cache (no known magic)")]
    Magic,
    #[error("truncated or inconsistent at {0}")]
    Bounds(&'static str),
    #[error("written for the other byte order")]
    Endian,
    #[error("string table offset {0} has no terminating NUL inside the file")]
    String(u32),
    #[error("entry {0} names glibc-hwcaps index {1}, which the hwcaps section lacks")]
    HwcapsIndex(usize, u32),
    #[error("too large to write ({0})")]
    TooLarge(&'static str),
}

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(o..o.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(o..o.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The NUL-terminated string at `base + off`.
fn string_at(b: &[u8], base: usize, off: u32) -> Result<Vec<u8>, FormatError> {
    let start = base
        .checked_add(off as usize)
        .ok_or(FormatError::String(off))?;
    let rest = b.get(start..).ok_or(FormatError::String(off))?;
    let end = rest
        .iter()
        .position(|&c| c == 0)
        .ok_or(FormatError::String(off))?;
    Ok(rest[..end].to_vec())
}

/// Whether an entry's hwcap marks a glibc-hwcaps extension entry (`dl_cache_hwcap_extension`).
pub fn is_extension(hwcap: u64) -> bool {
    ((hwcap >> 32) & !ISA_LEVEL_MASK) == (HWCAP_EXTENSION >> 32)
}

/// Parse a cache file.
pub fn parse(b: &[u8]) -> Result<Cache, FormatError> {
    if b.starts_with(MAGIC_NEW) {
        return parse_new(b, 0);
    }
    if !b.starts_with(MAGIC_OLD) {
        return Err(FormatError::Magic);
    }
    let n = u32_at(b, 12).ok_or(FormatError::Bounds("old header"))? as usize;
    let entries_end = n
        .checked_mul(ENTRY_OLD)
        .and_then(|x| x.checked_add(HEADER_OLD))
        .filter(|&e| e <= b.len())
        .ok_or(FormatError::Bounds("old entries"))?;
    // The new format hides after the old entries, 8-aligned (ALIGN_CACHE).
    let new_at = (entries_end + 7) & !7;
    if b.len() > new_at + HEADER_NEW && b[new_at..].starts_with(MAGIC_NEW) {
        return parse_new(b, new_at);
    }
    let mut entries = Vec::with_capacity(n);
    for i in 0..n {
        let o = HEADER_OLD + i * ENTRY_OLD;
        let bad = FormatError::Bounds("old entry");
        let flags = u32_at(b, o).ok_or(bad.clone())? as i32;
        let key = u32_at(b, o + 4).ok_or(bad.clone())?;
        let value = u32_at(b, o + 8).ok_or(bad)?;
        entries.push(Entry {
            flags,
            key: string_at(b, entries_end, key)?,
            value: string_at(b, entries_end, value)?,
            osversion: 0,
            hwcap: 0,
            hwcaps: None,
        });
    }
    Ok(Cache {
        entries,
        generator: None,
    })
}

/// The extension sections of a new-format cache: (generator, hwcaps names).
type Extensions = (Option<Vec<u8>>, Vec<Vec<u8>>);

fn parse_extensions(b: &[u8], base: usize, ext: usize) -> Result<Extensions, FormatError> {
    let bad = |w| FormatError::Bounds(w);
    if !ext.is_multiple_of(4) {
        return Err(bad("extension offset alignment"));
    }
    if u32_at(b, ext).ok_or(bad("extension directory"))? != EXTENSION_MAGIC {
        return Err(bad("extension magic"));
    }
    let count = u32_at(b, ext + 4).ok_or(bad("extension directory"))? as usize;
    let dir_end = count
        .checked_mul(16)
        .and_then(|x| x.checked_add(ext + 8))
        .filter(|&e| e <= b.len())
        .ok_or(bad("extension sections"))?;
    let (mut generator, mut hwcaps) = (None, Vec::new());
    for s in (ext + 8..dir_end).step_by(16) {
        let tag = u32_at(b, s).ok_or(bad("extension section"))?;
        let off = u32_at(b, s + 8).ok_or(bad("extension section"))? as usize;
        let size = u32_at(b, s + 12).ok_or(bad("extension section"))? as usize;
        let data = off
            .checked_add(size)
            .and_then(|end| b.get(off..end))
            .ok_or(bad("extension section data"))?;
        match tag {
            TAG_GENERATOR => generator = Some(data.to_vec()),
            // dl-cache.h drops a hwcaps section that is empty or misaligned.
            TAG_HWCAPS if size > 0 && size.is_multiple_of(4) && off.is_multiple_of(4) => {
                hwcaps = data
                    .chunks_exact(4)
                    .map(|c| string_at(b, base, u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                    .collect::<Result<_, _>>()?;
            }
            _ => {}
        }
    }
    Ok((generator, hwcaps))
}

fn parse_new(b: &[u8], base: usize) -> Result<Cache, FormatError> {
    let h = b
        .get(base..base + HEADER_NEW)
        .ok_or(FormatError::Bounds("header"))?;
    let n = u32_at(h, 20).ok_or(FormatError::Bounds("header"))? as usize;
    match h[28] & 3 {
        0 | ENDIAN_LITTLE => {}
        _ => return Err(FormatError::Endian),
    }
    let ext = u32_at(h, 32).ok_or(FormatError::Bounds("header"))? as usize;
    n.checked_mul(ENTRY_NEW)
        .and_then(|x| x.checked_add(base + HEADER_NEW))
        .filter(|&e| e <= b.len())
        .ok_or(FormatError::Bounds("entries"))?;
    let (generator, hwcaps) = if ext == 0 {
        (None, Vec::new())
    } else {
        parse_extensions(b, base, ext)?
    };
    let mut entries = Vec::with_capacity(n);
    for i in 0..n {
        let o = base + HEADER_NEW + i * ENTRY_NEW;
        let bad = FormatError::Bounds("entry");
        let hwcap = u64_at(b, o + 16).ok_or(bad.clone())?;
        let names = if is_extension(hwcap) {
            let idx = hwcap as u32;
            Some(
                hwcaps
                    .get(idx as usize)
                    .cloned()
                    .ok_or(FormatError::HwcapsIndex(i, idx))?,
            )
        } else {
            None
        };
        entries.push(Entry {
            flags: u32_at(b, o).ok_or(bad.clone())? as i32,
            key: string_at(b, base, u32_at(b, o + 4).ok_or(bad.clone())?)?,
            value: string_at(b, base, u32_at(b, o + 8).ok_or(bad.clone())?)?,
            osversion: u32_at(b, o + 12).ok_or(bad)?,
            hwcap,
            hwcaps: names,
        });
    }
    Ok(Cache { entries, generator })
}

/// glibc's `_dl_cache_libcmp`: digit runs compare numerically (with C's `int` wrap-around),
/// other bytes as signed `char`s.
pub fn libcmp(a: &[u8], b: &[u8]) -> i32 {
    let at = |s: &[u8], i: usize| s.get(i).copied().unwrap_or(0);
    let digit = |c: u8| c.is_ascii_digit();
    let (mut i, mut j) = (0, 0);
    while at(a, i) != 0 {
        let (c1, c2) = (at(a, i), at(b, j));
        if digit(c1) {
            if !digit(c2) {
                return 1;
            }
            let num = |s: &[u8], k: &mut usize| {
                let mut v: i32 = 0;
                while digit(at(s, *k)) {
                    v = v.wrapping_mul(10).wrapping_add(i32::from(at(s, *k) - b'0'));
                    *k += 1;
                }
                v
            };
            let (v1, v2) = (num(a, &mut i), num(b, &mut j));
            if v1 != v2 {
                return v1.wrapping_sub(v2);
            }
        } else if digit(c2) {
            return -1;
        } else if c1 != c2 {
            return i32::from(c1 as i8) - i32::from(c2 as i8);
        } else {
            i += 1;
            j += 1;
        }
    }
    i32::from(at(a, i) as i8) - i32::from(at(b, j) as i8)
}

/// ldconfig's `compare` (elf/cache.c): the order entries are stored in (descending names; for
/// one name: higher flags, glibc-hwcaps entries first by subdirectory, more hwcap bits, higher
/// hwcap, higher osversion).
pub fn compare(e1: &Entry, e2: &Entry) -> i32 {
    let res = libcmp(&e2.key, &e1.key);
    if res != 0 {
        return res;
    }
    let ord = |o: Ordering| match o {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    };
    if e1.flags != e2.flags {
        return ord(e2.flags.cmp(&e1.flags));
    }
    match (&e1.hwcaps, &e2.hwcaps) {
        (Some(_), None) => return -1,
        (None, Some(_)) => return 1,
        (Some(a), Some(b)) if a != b => return ord(a.cmp(b)),
        _ => {}
    }
    // ldconfig keeps hwcap 0 for glibc-hwcaps entries in memory.
    let hw = |e: &Entry| if e.hwcaps.is_some() { 0 } else { e.hwcap };
    let (h1, h2) = (hw(e1), hw(e2));
    if h1.count_ones() != h2.count_ones() {
        return ord(h2.count_ones().cmp(&h1.count_ones()));
    }
    if h1 != h2 {
        return ord(h2.cmp(&h1));
    }
    ord(e2.osversion.cmp(&e1.osversion))
}

impl Cache {
    /// Add `e` where `ldconfig -r ROOT DIR…` would put an entry for a library in a directory
    /// named on its command line: before every entry that sorts equal to it (those directories
    /// are scanned first, and ld.so takes the first match). An entry for the same name and
    /// path is replaced.
    pub fn add(&mut self, e: Entry) {
        self.entries
            .retain(|x| !(x.key == e.key && x.value == e.value));
        let at = self
            .entries
            .iter()
            .position(|x| compare(x, &e) >= 0)
            .unwrap_or(self.entries.len());
        self.entries.insert(at, e);
    }
}

/// ldconfig's string table (elf/stringtable.c): unique strings sorted by their reversed bytes,
/// descending (longer first on a common suffix), each stored once, a string that is the tail of
/// the one before it sharing its bytes. Returns the table and the offset of each of `strings`,
/// by position. One sort of positions, compared in place (no reversed copies, no hashing: the
/// create path writes this for every GPU container).
fn string_table(strings: &[&[u8]]) -> (Vec<u8>, Vec<u32>) {
    let mut order: Vec<usize> = (0..strings.len()).collect();
    // finalize_compare: reversed bytes, descending; a shorter string that is the other's tail
    // compares lower, so the longer comes first. Equal strings end up adjacent.
    order.sort_unstable_by(|&l, &r| strings[r].iter().rev().cmp(strings[l].iter().rev()));
    let mut table = Vec::new();
    let mut offsets = vec![0u32; strings.len()];
    let mut prev: Option<(&[u8], usize)> = None;
    for i in order {
        let s = strings[i];
        let off = match prev {
            Some((p, poff)) if p.len() >= s.len() && p.ends_with(s) => poff + p.len() - s.len(),
            _ => {
                let o = table.len();
                table.extend_from_slice(s);
                table.push(0);
                o
            }
        };
        offsets[i] = off as u32;
        prev = Some((s, off));
    }
    (table, offsets)
}

/// Serialise `c` in the new format (glibc ≥ 2.33 `ldconfig -c new`), entries in the given order.
pub fn write(c: &Cache) -> Result<Vec<u8>, FormatError> {
    let n = c.entries.len();
    let too_large = |w| FormatError::TooLarge(w);
    let mut hwcaps: Vec<&[u8]> = c
        .entries
        .iter()
        .filter_map(|e| e.hwcaps.as_deref())
        .collect();
    hwcaps.sort_unstable();
    hwcaps.dedup();
    let mut strings: Vec<&[u8]> = Vec::with_capacity(2 * n + hwcaps.len());
    for e in &c.entries {
        strings.push(&e.key);
        strings.push(&e.value);
    }
    strings.extend(hwcaps.iter().copied());
    if strings.iter().any(|s| s.contains(&0)) {
        return Err(FormatError::String(0));
    }
    let (table, offsets) = string_table(&strings);
    let str_base = n
        .checked_mul(ENTRY_NEW)
        .and_then(|x| x.checked_add(HEADER_NEW))
        .ok_or(too_large("entries"))?;
    let ext = (str_base + table.len() + 3) & !3;
    let generator: &[u8] = c.generator.as_deref().unwrap_or(b"gpufence");
    let total = ext + 8 + 16 * (1 + usize::from(!hwcaps.is_empty())) + 4 * hwcaps.len();
    let total = total + generator.len();
    if u32::try_from(total).is_err() || u32::try_from(n).is_err() {
        return Err(too_large("file"));
    }
    // `strings` is key, value of each entry in order, then the hwcaps names.
    let sref = |i: usize| str_base as u32 + offsets[i];

    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(MAGIC_NEW);
    out.extend_from_slice(&(n as u32).to_le_bytes());
    out.extend_from_slice(&(table.len() as u32).to_le_bytes());
    out.extend_from_slice(&[ENDIAN_LITTLE, 0, 0, 0]);
    out.extend_from_slice(&(ext as u32).to_le_bytes());
    out.extend_from_slice(&[0u8; 12]);
    for (i, e) in c.entries.iter().enumerate() {
        let hwcap = match &e.hwcaps {
            Some(h) => {
                let idx = hwcaps.iter().position(|x| x == h).unwrap_or(0) as u64;
                (e.hwcap & !0xffff_ffff) | HWCAP_EXTENSION | idx
            }
            None => e.hwcap,
        };
        out.extend_from_slice(&e.flags.to_le_bytes());
        out.extend_from_slice(&sref(2 * i).to_le_bytes());
        out.extend_from_slice(&sref(2 * i + 1).to_le_bytes());
        out.extend_from_slice(&e.osversion.to_le_bytes());
        out.extend_from_slice(&hwcap.to_le_bytes());
    }
    out.extend_from_slice(&table);
    out.resize(ext, 0);
    // Extension directory: the generator section, then the hwcaps section if used.
    let sections = 1 + usize::from(!hwcaps.is_empty());
    let hwcaps_at = ext + 8 + 16 * sections;
    let generator_at = hwcaps_at + 4 * hwcaps.len();
    out.extend_from_slice(&EXTENSION_MAGIC.to_le_bytes());
    out.extend_from_slice(&(sections as u32).to_le_bytes());
    for v in [
        TAG_GENERATOR,
        0,
        generator_at as u32,
        generator.len() as u32,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    if !hwcaps.is_empty() {
        let size = 4 * hwcaps.len() as u32;
        for v in [TAG_HWCAPS, 0, hwcaps_at as u32, size] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for j in 0..hwcaps.len() {
            out.extend_from_slice(&sref(2 * n + j).to_le_bytes());
        }
    }
    out.extend_from_slice(generator);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libcmp_matches_glibc() {
        assert!(libcmp(b"libz.so.1", b"libc.so.6") > 0);
        assert!(libcmp(b"libfoo.so.10", b"libfoo.so.9") > 0);
        assert_eq!(libcmp(b"libfoo.so.1", b"libfoo.so.1"), 0);
        assert!(libcmp(b"libfoo.so", b"libfoo.so.1") < 0);
        assert!(libcmp(b"lib1", b"liba") > 0, "digit beats non-digit");
        assert!(libcmp(b"liba", b"lib1") < 0);
        assert!(libcmp(b"", b"a") < 0);
        // Leading zeros compare by value.
        assert_eq!(libcmp(b"l.007", b"l.7"), 0);
    }

    fn sample() -> Cache {
        let mut c = Cache {
            entries: Vec::new(),
            generator: Some(b"ldconfig test".to_vec()),
        };
        for (k, v) in [
            ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
            ("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1"),
            ("libm.so.6", "/lib/x86_64-linux-gnu/libm.so.6"),
        ] {
            c.add(Entry::new(k, v, FLAG_ELF_LIBC6 | FLAG_X8664_LIB64, 0));
        }
        c
    }

    #[test]
    fn entries_sorted_descending_and_new_first_among_equals() {
        let mut c = sample();
        let keys: Vec<&[u8]> = c.entries.iter().map(|e| e.key.as_slice()).collect();
        assert_eq!(keys, [&b"libz.so.1"[..], b"libm.so.6", b"libc.so.6"]);
        c.add(Entry::new("libz.so.1", "/usr/lib/gpu/libz.so.1", 0x303, 0));
        assert_eq!(c.entries[0].value, b"/usr/lib/gpu/libz.so.1");
        assert_eq!(c.entries[1].value, b"/lib/x86_64-linux-gnu/libz.so.1");
        // Same name and path again: replaced, not duplicated.
        c.add(Entry::new(
            "libz.so.1",
            "/lib/x86_64-linux-gnu/libz.so.1",
            0x303,
            0,
        ));
        assert_eq!(c.entries.len(), 4);
        assert_eq!(c.entries[0].value, b"/lib/x86_64-linux-gnu/libz.so.1");
        // A 32-bit library (lower flags) sorts after the 64-bit one of the same name.
        c.add(Entry::new(
            "libz.so.1",
            "/lib/i386-linux-gnu/libz.so.1",
            3,
            0,
        ));
        assert_eq!(c.entries[2].value, b"/lib/i386-linux-gnu/libz.so.1");
    }

    #[test]
    fn write_then_parse_round_trips_with_hwcaps() {
        let mut c = sample();
        let mut e = Entry::new(
            "libz.so.1",
            "/usr/lib/glibc-hwcaps/x86-64-v3/libz.so.1",
            0x303,
            0,
        );
        e.hwcap = HWCAP_EXTENSION | (2 << 32);
        e.hwcaps = Some(b"x86-64-v3".to_vec());
        c.add(e);
        let bytes = write(&c).unwrap();
        let back = parse(&bytes).unwrap();
        assert_eq!(back, c);
        assert_eq!(write(&back).unwrap(), bytes);
        assert_eq!(back.entries[0].hwcaps.as_deref(), Some(&b"x86-64-v3"[..]));
    }

    #[test]
    fn string_table_merges_tails() {
        let (t, off) = string_table(&[b"libc.so.6", b"/lib/libc.so.6", b"c.so.6", b"libc.so.6"]);
        assert_eq!(t, b"/lib/libc.so.6\0");
        assert_eq!(off, [5, 0, 8, 5]);
    }

    #[test]
    fn old_and_compat_formats_parse() {
        // Old format alone: header, 1 entry, strings after the entries.
        let mut b = MAGIC_OLD.to_vec();
        b.push(0);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&3i32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(b"libx.so\0/l/libx.so\0");
        let c = parse(&b).unwrap();
        assert_eq!(c.entries, vec![Entry::new("libx.so", "/l/libx.so", 3, 0)]);
        // Compat: the same old part, then (8-aligned) a new cache.
        let mut compat = b[..HEADER_OLD + ENTRY_OLD].to_vec();
        compat.resize(32, 0);
        let mut new = write(&sample()).unwrap();
        // Extension offsets are file offsets: drop the directory rather than shift it.
        new[32..36].copy_from_slice(&0u32.to_le_bytes());
        compat.extend_from_slice(&new);
        let c = parse(&compat).unwrap();
        assert_eq!(c.entries, sample().entries);
    }

    #[test]
    fn hostile_inputs_are_errors_not_panics() {
        let good = write(&sample()).unwrap();
        assert_eq!(parse(b"garbage"), Err(FormatError::Magic));
        assert!(parse(&good[..40]).is_err());
        let mut huge = good.clone();
        huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(parse(&huge), Err(FormatError::Bounds(_))));
        let mut off = good.clone();
        off[HEADER_NEW + 4..HEADER_NEW + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(parse(&off), Err(FormatError::String(_))));
        let mut be = good.clone();
        be[28] = 3;
        assert_eq!(parse(&be), Err(FormatError::Endian));
        let mut idx = good;
        idx[HEADER_NEW + 16..HEADER_NEW + 24].copy_from_slice(&(HWCAP_EXTENSION | 7).to_le_bytes());
        assert!(matches!(parse(&idx), Err(FormatError::HwcapsIndex(0, 7))));
    }

    #[test]
    fn host_cache_round_trips_byte_for_byte() {
        // The build host's own cache, written by its ldconfig (glibc ≥ 2.33 on Debian 12).
        let Ok(bytes) = std::fs::read("/etc/ld.so.cache") else {
            return;
        };
        let c = parse(&bytes).expect("host cache parses");
        assert!(!c.entries.is_empty());
        if bytes.starts_with(MAGIC_NEW) {
            assert_eq!(write(&c).unwrap(), bytes, "write(parse(host cache))");
        }
    }

    fn arb_entry() -> impl proptest::strategy::Strategy<Value = Entry> {
        use proptest::prelude::*;
        let name = "[a-z._+-]{1,8}(\\.[0-9]{1,3}){0,2}";
        (
            name,
            "(/[a-z0-9._-]{1,8}){1,3}",
            prop_oneof![Just(0x303), Just(3), Just(1), Just(0x803)],
            prop_oneof![Just(0u32), Just(0x30200), any::<u32>()],
            prop_oneof![Just(None), Just(Some("x86-64-v3")), Just(Some("x86-64-v2"))],
            0u64..4,
        )
            .prop_map(|(k, v, flags, os, hw, legacy)| Entry {
                flags,
                key: k.into_bytes(),
                value: v.into_bytes(),
                osversion: os,
                hwcap: if hw.is_some() {
                    HWCAP_EXTENSION
                } else {
                    legacy
                },
                hwcaps: hw.map(|h| h.as_bytes().to_vec()),
            })
    }

    proptest::proptest! {
        #[test]
        fn parse_inverts_write(entries in proptest::collection::vec(arb_entry(), 0..40),
                               generator in proptest::option::of("[ -~]{0,40}")) {
            let c = Cache { entries, generator: generator.map(String::into_bytes) };
            let bytes = write(&c).unwrap();
            let back = parse(&bytes).unwrap();
            // The generator defaults on write; the hwcap low bits are recomputed.
            proptest::prop_assert_eq!(back.entries.len(), c.entries.len());
            for (a, b) in back.entries.iter().zip(&c.entries) {
                proptest::prop_assert_eq!(&a.key, &b.key);
                proptest::prop_assert_eq!(&a.value, &b.value);
                proptest::prop_assert_eq!(a.flags, b.flags);
                proptest::prop_assert_eq!(a.osversion, b.osversion);
                proptest::prop_assert_eq!(&a.hwcaps, &b.hwcaps);
            }
            proptest::prop_assert_eq!(write(&back).unwrap(), bytes);
        }

        #[test]
        fn add_keeps_ldconfig_order(entries in proptest::collection::vec(arb_entry(), 0..30)) {
            let mut c = Cache::default();
            for e in entries {
                c.add(e);
            }
            for w in c.entries.windows(2) {
                proptest::prop_assert!(compare(&w[0], &w[1]) <= 0, "{:?}", w);
            }
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
                              at in 0usize..600) {
            let _ = parse(&bytes);
            // A valid cache with one corrupted byte.
            let mut good = write(&Cache { entries: vec![Entry::new("libq.so.1", "/q/libq.so.1", 0x303, 0)], generator: None }).unwrap();
            let i = at % good.len();
            good[i] = bytes.first().copied().unwrap_or(0xff);
            let _ = parse(&good);
        }
    }
}
