//! Just enough ELF: read a shared object's `DT_SONAME` (for the ld-cache links of driver
//! libraries), and write a minimal valid shared object carrying one (stand-ins for the driver's
//! libraries in the simulated node, which `ldconfig` accepts and links by soname).
//!
//! Only 64-bit little-endian objects are read; anything else yields `None` (the caller derives
//! the soname from the file name).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_STRTAB: u64 = 5;
const DT_SYMTAB: u64 = 6;
const DT_STRSZ: u64 = 10;
const DT_SYMENT: u64 = 11;
const DT_SONAME: u64 = 14;

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

fn read_exact_at(f: &File, len: usize, off: u64) -> Option<Vec<u8>> {
    // Refuse absurd sizes from a corrupt header.
    if len > 1 << 24 {
        return None;
    }
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, off).ok()?;
    Some(buf)
}

/// The `DT_SONAME` of a 64-bit little-endian ELF shared object, if it has one.
pub fn soname(path: &Path) -> Option<String> {
    let f = File::open(path).ok()?;
    let eh = read_exact_at(&f, 64, 0)?;
    // \x7fELF, ELFCLASS64, ELFDATA2LSB
    if eh[..4] != *b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return None;
    }
    let phoff = u64_at(&eh, 32)?;
    let phentsize = usize::from(u16_at(&eh, 54)?);
    let phnum = usize::from(u16_at(&eh, 56)?);
    if phentsize < 56 || phnum == 0 || phnum > 256 {
        return None;
    }
    let ph = read_exact_at(&f, phentsize * phnum, phoff)?;
    let mut loads = Vec::new();
    let mut dynamic = None;
    for i in 0..phnum {
        let p = &ph[i * phentsize..(i + 1) * phentsize];
        let (kind, off, vaddr, filesz) =
            (u32_at(p, 0)?, u64_at(p, 8)?, u64_at(p, 16)?, u64_at(p, 32)?);
        match kind {
            PT_LOAD => loads.push((vaddr, off, filesz)),
            PT_DYNAMIC => dynamic = Some((off, filesz)),
            _ => {}
        }
    }
    let (doff, dsz) = dynamic?;
    let dy = read_exact_at(&f, usize::try_from(dsz).ok()?, doff)?;
    let (mut strtab, mut soname) = (None, None);
    for e in dy.chunks_exact(16) {
        let (tag, val) = (u64_at(e, 0)?, u64_at(e, 8)?);
        match tag {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(val),
            DT_SONAME => soname = Some(val),
            _ => {}
        }
    }
    let (strtab, soname) = (strtab?, soname?);
    // Virtual address of the string table → file offset through the PT_LOAD that maps it.
    let str_off = loads
        .iter()
        .find_map(|&(va, off, sz)| (strtab >= va && strtab < va + sz).then(|| strtab - va + off))?;
    let name = read_exact_at(&f, 256, str_off + soname).or_else(|| {
        // Short file tail: read what there is.
        let len = f.metadata().ok()?.len().checked_sub(str_off + soname)?;
        read_exact_at(&f, usize::try_from(len.min(256)).ok()?, str_off + soname)
    })?;
    let end = name.iter().position(|&b| b == 0)?;
    let s = std::str::from_utf8(&name[..end]).ok()?;
    (!s.is_empty()).then(|| s.to_string())
}

/// A minimal x86-64 ELF shared object whose only content is a dynamic section naming `soname`
/// (no code, no symbols). `ldconfig` indexes it like any library.
pub fn minimal_shared_object(soname: &str) -> Vec<u8> {
    const EH: usize = 64;
    const PH: usize = 56;
    let ph_off = EH;
    let str_off = ph_off + 2 * PH;
    let mut strtab = vec![0u8];
    strtab.extend_from_slice(soname.as_bytes());
    strtab.push(0);
    let align8 = |x: usize| (x + 7) & !7;
    let sym_off = align8(str_off + strtab.len());
    let sym_len = 24; // one null Elf64_Sym
    let dyn_off = align8(sym_off + sym_len);
    let dyns: [(u64, u64); 6] = [
        (DT_SONAME, 1),
        (DT_STRTAB, str_off as u64),
        (DT_STRSZ, strtab.len() as u64),
        (DT_SYMTAB, sym_off as u64),
        (DT_SYMENT, 24),
        (DT_NULL, 0),
    ];
    let total = dyn_off + dyns.len() * 16;

    let mut b = vec![0u8; total];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2; // ELFCLASS64
    b[5] = 1; // little endian
    b[6] = 1; // EV_CURRENT
    let put16 = |b: &mut Vec<u8>, o: usize, v: u16| b[o..o + 2].copy_from_slice(&v.to_le_bytes());
    let put32 = |b: &mut Vec<u8>, o: usize, v: u32| b[o..o + 4].copy_from_slice(&v.to_le_bytes());
    let put64 = |b: &mut Vec<u8>, o: usize, v: u64| b[o..o + 8].copy_from_slice(&v.to_le_bytes());
    put16(&mut b, 16, 3); // ET_DYN
    put16(&mut b, 18, 62); // EM_X86_64
    put32(&mut b, 20, 1); // e_version
    put64(&mut b, 32, ph_off as u64); // e_phoff
    put16(&mut b, 52, EH as u16); // e_ehsize
    put16(&mut b, 54, PH as u16); // e_phentsize
    put16(&mut b, 56, 2); // e_phnum
    put16(&mut b, 58, 64); // e_shentsize
    // PT_LOAD: the whole file at vaddr 0, read-only.
    let p = ph_off;
    put32(&mut b, p, PT_LOAD);
    put32(&mut b, p + 4, 4); // PF_R
    put64(&mut b, p + 32, total as u64);
    put64(&mut b, p + 40, total as u64);
    put64(&mut b, p + 48, 0x1000);
    // PT_DYNAMIC
    let p = ph_off + PH;
    put32(&mut b, p, PT_DYNAMIC);
    put32(&mut b, p + 4, 6); // PF_R|PF_W
    put64(&mut b, p + 8, dyn_off as u64);
    put64(&mut b, p + 16, dyn_off as u64);
    put64(&mut b, p + 24, dyn_off as u64);
    put64(&mut b, p + 32, (dyns.len() * 16) as u64);
    put64(&mut b, p + 40, (dyns.len() * 16) as u64);
    put64(&mut b, p + 48, 8);
    b[str_off..str_off + strtab.len()].copy_from_slice(&strtab);
    for (i, (tag, val)) in dyns.iter().enumerate() {
        put64(&mut b, dyn_off + i * 16, *tag);
        put64(&mut b, dyn_off + i * 16 + 8, *val);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_object_round_trips() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("libnvidia-encode.so.580.65.06");
        std::fs::write(&p, minimal_shared_object("libnvidia-encode.so.1")).unwrap();
        assert_eq!(soname(&p).as_deref(), Some("libnvidia-encode.so.1"));
    }

    #[test]
    fn non_elf_and_truncated_give_none() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x");
        std::fs::write(&p, b"not an elf").unwrap();
        assert_eq!(soname(&p), None);
        let mut b = minimal_shared_object("libx.so.1");
        b.truncate(100);
        std::fs::write(&p, &b).unwrap();
        assert_eq!(soname(&p), None);
        assert_eq!(soname(&d.path().join("missing")), None);
    }

    #[test]
    fn reads_a_real_library() {
        // glibc's libc carries DT_SONAME libc.so.6 on every Linux build host.
        let p = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        if p.exists() {
            assert_eq!(soname(p).as_deref(), Some("libc.so.6"));
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_garbage(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let d = tempfile::tempdir().unwrap();
            let p = d.path().join("g");
            // Keep the ELF identification so the parser goes past it, corrupt everything else.
            let mut b = minimal_shared_object("libg.so.1");
            let n = bytes.len().min(b.len() - 16);
            b[16..16 + n].copy_from_slice(&bytes[..n]);
            std::fs::write(&p, &b).unwrap();
            let _ = soname(&p);
        }
    }
}
