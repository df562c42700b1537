//! Capability sets per step: the hook keeps only what the step in progress needs.

use caps::{CapSet, Capability as C, CapsHashSet};

/// A capability set could not be changed.
#[derive(Debug, thiserror::Error)]
#[error("capabilities: {0}")]
pub struct CapsError(pub String);

/// Host side: cgroup rules, BPF, reading the container's namespaces, host files, mount clones.
pub const HOST: &[C] = &[
    C::CAP_SYS_ADMIN,
    C::CAP_SYS_PTRACE,
    C::CAP_SYS_CHROOT,
    C::CAP_BPF,
    C::CAP_NET_ADMIN,
    C::CAP_MKNOD,
    C::CAP_CHOWN,
    C::CAP_FOWNER,
    C::CAP_DAC_OVERRIDE,
    C::CAP_DAC_READ_SEARCH,
    C::CAP_SETPCAP,
    C::CAP_SETUID,
    C::CAP_SETGID,
];

/// After `setns`: device nodes, mount targets, mounts (SETUID/SETGID: the fs ids of a
/// user-namespaced container's root).
pub const IN_NAMESPACE: &[C] = &[
    C::CAP_SYS_ADMIN,
    C::CAP_SYS_CHROOT,
    C::CAP_MKNOD,
    C::CAP_CHOWN,
    C::CAP_FOWNER,
    C::CAP_DAC_OVERRIDE,
    C::CAP_DAC_READ_SEARCH,
    C::CAP_SETPCAP,
    C::CAP_SETUID,
    C::CAP_SETGID,
];

/// The ld cache refresh (in-process, no exec): files in a rootfs owned by anyone.
pub const LDCACHE: &[C] = &[C::CAP_FOWNER, C::CAP_DAC_OVERRIDE, C::CAP_DAC_READ_SEARCH];

/// Reduce the effective, permitted and inheritable sets (and the bounding set, so a later exec
/// as root cannot regain more) to `keep` ∩ what the process has. Never adds a capability.
pub fn restrict(keep: &[C]) -> Result<(), CapsError> {
    let err = |e: caps::errors::CapsError| CapsError(e.to_string());
    let permitted = caps::read(None, CapSet::Permitted).map_err(err)?;
    let want: CapsHashSet = keep
        .iter()
        .copied()
        .filter(|c| permitted.contains(c))
        .collect();
    if permitted.contains(&C::CAP_SETPCAP) {
        for c in caps::all() {
            if !want.contains(&c) && caps::has_cap(None, CapSet::Bounding, c).unwrap_or(false) {
                caps::drop(None, CapSet::Bounding, c).map_err(err)?;
            }
        }
    }
    caps::set(None, CapSet::Inheritable, &CapsHashSet::new()).map_err(err)?;
    caps::set(None, CapSet::Effective, &want).map_err(err)?;
    caps::set(None, CapSet::Permitted, &want).map_err(err)?;
    Ok(())
}
