//! The plan fuzz target's fixed inputs (the hand-built inventory of the allocation tests, a
//! config chosen by the input's first bytes, one foreign CDI spec) and its invariants: the same
//! ones `tests/alloc_fuzz.rs` checks with proptest, as plain assertions.

use std::collections::BTreeSet;

use gpufence::allocation::DeviceRef;
use gpufence::config::{Config, Dialect, MemoryUnit, ShimInject, TrustEnv};
use gpufence::inventory::Inventory;
use gpufence::plan::Plan;

#[path = "../../tests/alloc_support/mod.rs"]
mod alloc_support;

pub use alloc_support::inventory;

/// A node config from two selector bytes: which dialects are enabled, which are trusted from the
/// environment, shim injection, HAMi-core library, gpushare memory unit.
pub fn config(a: u8, b: u8) -> Config {
    let mut c = alloc_support::config();
    c.allocation.dialects = Dialect::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| a & (1 << i) == 0)
        .map(|(_, d)| *d)
        .collect();
    c.allocation.trust_env = match (a >> 5) & 3 {
        0 => TrustEnv::All(false),
        1 => TrustEnv::All(true),
        2 => TrustEnv::Dialects(vec![Dialect::Hami, Dialect::Gpushare, Dialect::Nvidia]),
        _ => TrustEnv::Dialects(
            [Dialect::Hami, Dialect::Gpushare, Dialect::Nvidia]
                .into_iter()
                .enumerate()
                .filter(|(i, _)| b & (1 << i) != 0)
                .map(|(_, d)| d)
                .collect(),
        ),
    };
    if a & 0x80 != 0 {
        c.shim.inject = ShimInject::Env;
    }
    if b & 0x08 != 0 {
        c.shim.library = "/usr/local/vgpu/libvgpu.so".into();
    }
    if b & 0x10 != 0 {
        c.gpushare.memory_unit = MemoryUnit::MiB;
    }
    c
}

/// A foreign (non-gpufence) CDI spec, so `cdi.k8s.io/*` annotations can name other kinds.
pub fn foreign_specs() -> Vec<gpufence::cdi::LoadedSpec> {
    vec![alloc_support::foreign_spec(
        "/etc/cdi/nic.yaml",
        0,
        "cdiVersion: \"0.5.0\"\nkind: vendor.com/nic\ndevices:\n- name: nic0\n  containerEdits:\n    deviceNodes:\n    - {path: /dev/vnic0, type: c, major: 240, minor: 0}\n",
    )]
}

/// The plan grants only what the allocation names; without an allocation it grants nothing.
pub fn check(p: &Plan, inv: &Inventory) {
    let Some(a) = &p.allocation else {
        assert!(p.grants_nothing(), "no allocation but grants: {p:?}");
        assert!(p.edits.is_empty(), "no allocation but edits: {p:?}");
        assert!(p.cgroup_rules.is_empty() && p.host_files.is_empty() && p.state_dir.is_none());
        for o in &p.env_overrides {
            assert!(o.ends_with("=void"), "override {o:?} without an allocation");
        }
        return;
    };
    let mut allowed: BTreeSet<String> = inv.control_nodes.iter().map(|n| n.path.clone()).collect();
    let mut uuids: BTreeSet<String> = BTreeSet::new();
    for d in &a.devices {
        uuids.insert(d.uuid.clone());
        match d.device {
            DeviceRef::Gpu { index } => {
                let g = inv.gpu_by_index(index).expect("allocated GPU in inventory");
                assert_eq!(g.uuid, d.uuid);
                allowed.insert(g.node.path.clone());
            }
            DeviceRef::Mig { gpu, mig } => {
                let g = inv.gpu_by_index(gpu).expect("MIG parent in inventory");
                assert!(g.mig_enabled, "MIG device on a GPU without MIG");
                let m = g
                    .mig_devices
                    .iter()
                    .find(|m| m.index == mig)
                    .expect("MIG device in inventory");
                assert_eq!(m.uuid, d.uuid);
                allowed.insert(g.node.path.clone());
                allowed.extend(m.caps.iter().map(|c| c.path.clone()));
            }
        }
        if let Some(m) = d.memory_limit {
            assert!(m > 0, "zero memory limit granted");
        }
        if let Some(c) = d.cores {
            assert!((1..=100).contains(&c), "cores {c}");
        }
    }
    for f in &a.foreign_cdi {
        allowed.extend(f.edits.device_nodes.iter().map(|n| n.path.clone()));
    }
    for n in &p.edits.device_nodes {
        assert!(
            allowed.contains(&n.path),
            "{} granted but not allocated",
            n.path
        );
        if let Some(i) = n
            .path
            .strip_prefix("/dev/nvidia")
            .and_then(|s| s.parse::<u32>().ok())
        {
            let named = a.devices.iter().any(|d| match d.device {
                DeviceRef::Gpu { index } => index == i,
                DeviceRef::Mig { gpu, .. } => gpu == i,
            });
            assert!(named, "GPU node {} not named by the allocation", n.path);
        }
    }
    assert_eq!(p.cgroup_rules.len(), p.edits.device_nodes.len());
    if a.devices.is_empty() {
        assert!(p.quota.is_none() && p.host_files.is_empty());
        assert!(
            !p.edits
                .mounts
                .iter()
                .any(|m| m.container_path == gpufence::plan::CONTAINER_SHIM_PATH),
            "shim mounted without a GPU"
        );
    } else {
        let q = p.quota.as_ref().expect("GPU allocation without a quota");
        assert_eq!(q.devices.len(), a.devices.len());
        for (i, d) in q.devices.iter().enumerate() {
            assert_eq!(d.ordinal as usize, i);
            assert!(uuids.contains(&d.uuid), "quota for unallocated {}", d.uuid);
        }
        assert_eq!(gpufence::quota::Quota::parse(&q.render()).as_ref(), Ok(q));
        let nvd = p
            .edits
            .env
            .iter()
            .find_map(|e| e.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
            .expect("NVIDIA_VISIBLE_DEVICES set for a GPU allocation");
        for u in nvd.split(',') {
            assert!(
                uuids.contains(u),
                "NVIDIA_VISIBLE_DEVICES names unallocated {u}"
            );
        }
    }
}
