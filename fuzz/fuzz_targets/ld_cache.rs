//! The image's `/etc/ld.so.cache`, parsed by gpufence-runtime and the hooks as host root
//! (src/ldso/cache.rs): any bytes, never a panic, bounded work; what parses writes back to a
//! cache that parses to the same entries, and writing is a fixed point.
#![no_main]

use gpufence::ldso::cache::{Entry, parse, write};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut c) = parse(data) else {
        return;
    };
    // Strings with a NUL cannot be stored; parsed ones never have one.
    assert!(
        c.entries
            .iter()
            .all(|e| !e.key.contains(&0) && !e.value.contains(&0))
    );
    let Ok(bytes) = write(&c) else {
        return;
    };
    let back = parse(&bytes).expect("what gpufence writes parses");
    assert_eq!(back.entries.len(), c.entries.len());
    for (a, b) in back.entries.iter().zip(&c.entries) {
        assert_eq!(
            (&a.key, &a.value, a.flags, a.osversion, &a.hwcaps),
            (&b.key, &b.value, b.flags, b.osversion, &b.hwcaps)
        );
    }
    assert_eq!(write(&back).unwrap(), bytes, "write is a fixed point");
    // Adding the driver's entry keeps every other image entry, in order, and adds it once.
    let before = c.entries.clone();
    let new = Entry::new(
        "libcuda.so.1",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        0x303,
        0,
    );
    c.add(new.clone());
    let others = |v: &[Entry]| -> Vec<Entry> {
        v.iter()
            .filter(|e| (&e.key, &e.value) != (&new.key, &new.value))
            .cloned()
            .collect()
    };
    assert_eq!(others(&c.entries), others(&before));
    assert_eq!(c.entries.iter().filter(|e| **e == new).count(), 1);
    assert!(parse(&write(&c).unwrap()).is_ok());
});
