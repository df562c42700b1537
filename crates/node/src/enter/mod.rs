//! What runs inside (or reaches into) a container's namespaces and rootfs: paths resolved only
//! beneath the rootfs ([`safepath`]), detached mounts attached by fd ([`mounts`]), the capability
//! sets per step ([`caps`]), the ld cache refresh ([`ldcache`]) and user-namespace mappings
//! ([`userns`]). Used by the two appliers, `gpufence-runtime` and `gpufence hook`; imports
//! nothing from them.

pub mod caps;
pub mod ldcache;
pub mod mounts;
pub mod safepath;
pub mod sys;
pub mod tmpfs;
pub mod userns;
