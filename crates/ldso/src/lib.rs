//! The container's ld cache, written without running `ldconfig`: the glibc `ld.so.cache`
//! format ([`cache`], pure) and what ldconfig reads from a shared object ([`elf`]). The
//! in-rootfs reading and writing is `gpufence_node::enter::ldcache`.

pub mod cache;
pub mod elf;
pub mod soname;
