//! HAMi v2.10's `hami.io/vgpu-mig-allocations`. Input: the annotation value. No panic; what
//! parses has every reservation whole (size ≥ 1, a GPU UUID, a profile, runtime identity whole
//! or absent, no container/device twice) and parses the same again; a reservation resolves only
//! to a MIG device of the GPU it names, with its profile, and (without runtime identity) only to
//! one kubelet recorded.
#![no_main]

use gpufence::allocation::pod_dialects::hami_mig;
use libfuzzer_sys::fuzz_target;

#[path = "../../tests/alloc_support/mod.rs"]
mod alloc_support;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(list) = hami_mig::parse(value) else {
        return;
    };
    assert_eq!(
        hami_mig::parse(value).as_ref(),
        Ok(&list),
        "not deterministic"
    );
    let inv = alloc_support::inventory();
    let all: Vec<&str> = inv
        .gpus
        .iter()
        .flat_map(|g| g.mig_devices.iter().map(|m| m.uuid.as_str()))
        .collect();
    for (i, r) in list.iter().enumerate() {
        assert!(r.placement.1 >= 1 && !r.profile.is_empty(), "{r:?}");
        assert!(
            r.gpu_uuid
                .get(..4)
                .is_some_and(|p| p.eq_ignore_ascii_case("GPU-"))
        );
        assert!(
            !list[..i]
                .iter()
                .any(|p| (p.container, p.device) == (r.container, r.device))
        );
        for recorded in [&[][..], &all[..]] {
            let Ok(uuid) = hami_mig::resolve(r, &inv, recorded) else {
                continue;
            };
            let (g, m) = inv.mig_by_uuid(&uuid).expect("a MIG device of this node");
            assert!(g.uuid.eq_ignore_ascii_case(&r.gpu_uuid), "{r:?} -> {uuid}");
            assert!(
                m.profile.is_empty() || m.profile == r.profile,
                "{r:?} -> {uuid}"
            );
            match &r.runtime {
                Some(rt) => assert!(rt.mig_uuid.eq_ignore_ascii_case(&uuid)),
                None => assert!(recorded.contains(&uuid.as_str())),
            }
        }
    }
});
