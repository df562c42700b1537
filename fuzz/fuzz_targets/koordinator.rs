//! Koordinator's `scheduling.koordinator.sh/device-allocated` and koordlet's env beside it,
//! planned for a CRI container. Input: one selector byte (its low two bits: trust-annotations
//! "kubelet", "admission", true), then the annotation value, then (after the first newline) one
//! env entry per line. No panic, the same answer twice; a GPU only where the mode believes the
//! annotation (never under "kubelet" with nothing recorded), only whole GPUs its `gpu` list names
//! by minor; koordlet's `NVIDIA_VISIBLE_DEVICES` of a granted pod agrees with the plan; no
//! HAMi-core preload left in the plan's env; an error is one line.
#![no_main]

use gpufence::allocation::DeviceRef;
use gpufence::allocation::koordinator::{self, koordlet_env_agrees};
use gpufence::config::TrustAnnotations;
use gpufence::kubelet::{CONTAINERD_CONTAINER_NAME, CONTAINERD_POD_UID, KubeletSource};
use libfuzzer_sys::fuzz_target;

#[path = "../common/plan_check.rs"]
mod plan_check;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let (value, env) = text.split_once('\n').unwrap_or((text, ""));
    let parsed = koordinator::parse(value);
    assert_eq!(parsed, koordinator::parse(value), "not deterministic");
    let mut config = plan_check::config(0, 0);
    config.allocation.trust_annotations = match sel & 3 {
        0 => TrustAnnotations::Kubelet,
        1 => TrustAnnotations::Admission,
        _ => TrustAnnotations::Believed,
    };
    let env: Vec<&str> = env.lines().collect();
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "env": env, "cwd": "/"},
        "root": {"path": "rootfs"},
        "annotations": {
            CONTAINERD_POD_UID: "0b5e2c1d-7a3f-4e6b-8c9d-1e2f3a4b5c6d",
            CONTAINERD_CONTAINER_NAME: "app",
            koordinator::ALLOCATED: value,
        },
    });
    let inv = plan_check::inventory();
    let specs = plan_check::foreign_specs();
    let run = || {
        gpufence::plan::plan_with(
            &spec,
            "ctr-1",
            &inv,
            &config,
            &specs,
            &KubeletSource::Absent,
        )
    };
    let plan = run();
    assert_eq!(plan, run(), "not deterministic");
    match plan {
        Ok(p) => {
            plan_check::check(&p, &inv);
            assert!(
                p.edits.env.iter().all(|e| !e.contains("libvgpu")),
                "{:?}",
                p.edits.env
            );
            let Some(a) = &p.allocation else { return };
            // Only the annotation grants here (no record, no trusted env).
            assert_ne!(
                config.allocation.trust_annotations,
                TrustAnnotations::Kubelet
            );
            let minors: Vec<u32> = parsed
                .expect("granted from a parsed annotation")
                .iter()
                .map(|g| g.minor)
                .collect();
            for d in &a.devices {
                let DeviceRef::Gpu { index } = d.device else {
                    panic!("Koordinator grants whole GPUs: {d:?}");
                };
                assert!(minors.contains(&inv.gpu_by_index(index).unwrap().minor));
            }
            for e in &env {
                if let Some(v) = e.strip_prefix("NVIDIA_VISIBLE_DEVICES=")
                    && !v.is_empty()
                    && v.split(',').all(|t| {
                        let t = t.trim();
                        !t.is_empty() && t.len() <= 9 && t.bytes().all(|b| b.is_ascii_digit())
                    })
                {
                    assert!(
                        koordlet_env_agrees(a, &inv, "NVIDIA_VISIBLE_DEVICES", v),
                        "{e}"
                    );
                }
            }
        }
        Err(e) => {
            let line = e.to_string();
            assert!(!line.contains('\n'), "multi-line error: {line}");
        }
    }
});
