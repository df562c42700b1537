//! glibc's own `dlvsym`, found without asking the dynamic loader by name: the shim exports a
//! `dlvsym` of its own (so that `dlvsym(h, "dlsym", "GLIBC_2.34")` cannot hand an application
//! glibc's `dlsym` past the shim), and every lookup by name — `dlsym`, `dlvsym` — would now
//! find the shim's. The default-version definition is read from the dynamic symbol table of
//! the loaded `libc.so.6` / `libdl.so.2` (`dl_iterate_phdr`), once.

use std::ffi::{CStr, c_int, c_void};

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const STT_FUNC: u8 = 2;
const VERSYM_HIDDEN: u16 = 0x8000;

/// `Elf64_Dyn` (not in the libc crate): a tag and an address or value.
#[repr(C)]
struct Dyn {
    d_tag: i64,
    d_val: u64,
}

struct Search<'a> {
    objects: &'a [&'a [u8]],
    name: &'a [u8],
    found: usize,
}

/// Address of `name`'s default-version function definition in the first loaded object whose
/// path ends in one of `objects`; 0 when there is none.
pub fn find(objects: &[&[u8]], name: &[u8]) -> usize {
    let mut s = Search {
        objects,
        name,
        found: 0,
    };
    // SAFETY: the callback only reads the loader's program headers and the mapped dynamic
    // sections of loaded objects; `s` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut s as *mut Search as *mut c_void) };
    s.found
}

unsafe extern "C" fn cb(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info; data is our Search.
    let (info, s) = unsafe { (&*info, &mut *(data as *mut Search)) };
    if info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: dlpi_name is the loader's NUL-terminated path of this object.
    let path = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
    if !s.objects.iter().any(|o| path.ends_with(o)) {
        return 0;
    }
    // SAFETY: this object is loaded: its headers and dynamic section are mapped.
    s.found = unsafe { lookup(info, s.name) };
    c_int::from(s.found != 0)
}

/// # Safety
/// `info` describes a loaded object (mapped headers and dynamic section).
unsafe fn lookup(info: &libc::dl_phdr_info, name: &[u8]) -> usize {
    let base = info.dlpi_addr as usize;
    // SAFETY: the loader's program header table of this object, dlpi_phnum entries.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC) else {
        return 0;
    };
    // glibc relocates the dynamic section's addresses in place; other loaders may not.
    let abs = |v: u64| {
        let v = v as usize;
        if v < base { v + base } else { v }
    };
    let (mut symtab, mut strtab, mut hash, mut gnu_hash, mut versym) = (0, 0, 0, 0, 0);
    let mut d = (base + dynamic.p_vaddr as usize) as *const Dyn;
    loop {
        // SAFETY: the dynamic section is an array ended by DT_NULL.
        let e = unsafe { &*d };
        match e.d_tag {
            DT_NULL => break,
            DT_SYMTAB => symtab = abs(e.d_val),
            DT_STRTAB => strtab = abs(e.d_val),
            DT_HASH => hash = abs(e.d_val),
            DT_GNU_HASH => gnu_hash = abs(e.d_val),
            DT_VERSYM => versym = abs(e.d_val),
            _ => {}
        }
        // SAFETY: still inside the array (DT_NULL not reached).
        d = unsafe { d.add(1) };
    }
    if symtab == 0 || strtab == 0 {
        return 0;
    }
    // SAFETY: the hash tables named by the dynamic section are mapped.
    let count = unsafe { symbol_count(hash, gnu_hash) };
    let syms = symtab as *const libc::Elf64_Sym;
    for i in 0..count {
        // SAFETY: i < the symbol count the hash tables give.
        let sym = unsafe { &*syms.add(i) };
        if sym.st_value == 0 || sym.st_shndx == 0 || sym.st_info & 0xf != STT_FUNC {
            continue;
        }
        if versym != 0 {
            // SAFETY: DT_VERSYM has one u16 per symbol.
            let v = unsafe { *(versym as *const u16).add(i) };
            if v & VERSYM_HIDDEN != 0 {
                continue;
            }
        }
        // SAFETY: st_name is an offset of a NUL-terminated string in the string table.
        let n = unsafe { CStr::from_ptr((strtab + sym.st_name as usize) as *const libc::c_char) };
        if n.to_bytes() == name {
            return base + sym.st_value as usize;
        }
    }
    0
}

/// Number of dynamic symbols: `nchain` of DT_HASH, else one past the last symbol reachable
/// through DT_GNU_HASH's buckets and chains.
///
/// # Safety
/// Non-zero arguments are the mapped hash tables of a loaded object.
unsafe fn symbol_count(hash: usize, gnu_hash: usize) -> usize {
    if hash != 0 {
        // SAFETY: DT_HASH starts with nbucket, nchain (u32 each).
        return unsafe { *(hash as *const u32).add(1) } as usize;
    }
    if gnu_hash == 0 {
        return 0;
    }
    let h = gnu_hash as *const u32;
    // SAFETY: DT_GNU_HASH header: nbuckets, symoffset, bloom_size, bloom_shift; then bloom_size
    // 64-bit words, nbuckets bucket words, then the chains.
    unsafe {
        let (nbuckets, symoffset, bloom) = (*h as usize, *h.add(1) as usize, *h.add(2) as usize);
        let buckets = h.add(4 + bloom * 2);
        let chains = buckets.add(nbuckets);
        let mut last = 0usize;
        for b in 0..nbuckets {
            last = last.max(*buckets.add(b) as usize);
        }
        if last < symoffset {
            return symoffset;
        }
        while *chains.add(last - symoffset) & 1 == 0 {
            last += 1;
        }
        last + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_glibc_dlvsym_by_table() {
        let p = find(&[b"/libc.so.6".as_slice(), b"/libdl.so.2"], b"dlvsym");
        assert_ne!(p, 0);
        // SAFETY: Dl_info is plain data; all-zero is valid.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only inspects the address and fills info.
        assert_ne!(unsafe { libc::dladdr(p as *const c_void, &mut info) }, 0);
        assert_eq!(find(&[b"/libc.so.6"], b"no_such_symbol_here"), 0);
    }
}
