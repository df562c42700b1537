//! Properties of the scheduler dialects of issue 34: Koordinator's annotation and koordlet's
//! env, HAMi v2.10's MIG reservations, HAMi-core's unindexed limits. The parsers never panic;
//! what koord-scheduler and HAMi write parses back to what was written; a Koordinator pod gets
//! exactly the GPUs its minors name, and only under "admission"; koordlet's own env always
//! agrees and another GPU's never does; the HAMi env reader gives every device what HAMi-core
//! would.

mod alloc_support;
mod prop_support;

use alloc_support::*;
use gpufence::allocation::koordinator::{self, GpuGrant, koordlet_env_agrees, without_hami_core};
use gpufence::allocation::pod_dialects::hami_mig::{self, MigReservation, MigRuntime};
use gpufence::allocation::{AllocationError, DeviceRef};
use gpufence::config::{Config, Dialect, TrustAnnotations};
use gpufence::inventory::Inventory;
use gpufence::kubelet::{CONTAINERD_CONTAINER_NAME, CONTAINERD_POD_UID, KubeletSource};
use gpufence::plan::Plan;
use proptest::prelude::*;

fn inventory_minors() -> Inventory {
    inventory_with_minors(20)
}
const WHOLE_GPUS: [u32; 3] = [0, 1, 3];

/// A quantity as koord-scheduler's JSON may carry it: a number or a string.
fn quantity(n: u64, as_string: bool) -> serde_json::Value {
    if as_string {
        serde_json::Value::String(n.to_string())
    } else {
        serde_json::json!(n)
    }
}

fn grant_json(g: &GpuGrant, strings: bool) -> serde_json::Value {
    let mut r = serde_json::Map::new();
    if let Some(c) = g.core {
        r.insert(
            "koordinator.sh/gpu-core".into(),
            quantity(c.into(), strings),
        );
    }
    if let Some(m) = g.memory {
        r.insert("koordinator.sh/gpu-memory".into(), quantity(m, strings));
    }
    if let Some(x) = g.memory_ratio {
        r.insert(
            "koordinator.sh/gpu-memory-ratio".into(),
            quantity(x.into(), strings),
        );
    }
    serde_json::json!({"minor": g.minor, "resources": r})
}

fn annotation(grants: &[GpuGrant], strings: bool) -> String {
    serde_json::json!({
        "gpu": grants.iter().map(|g| grant_json(g, strings)).collect::<Vec<_>>(),
        "rdma": [{"minor": 0, "id": "0000:09:00.0", "resources": {"koordinator.sh/rdma": 100}}],
    })
    .to_string()
}

/// One share for every GPU of the pod (Koordinator's multi-GPU requests are uniform), on 1–3
/// distinct whole GPUs of the inventory.
fn grants() -> impl Strategy<Value = Vec<GpuGrant>> {
    (
        proptest::sample::subsequence(WHOLE_GPUS.to_vec(), 1..=3).prop_shuffle(),
        prop::option::of(0u32..=100),
        prop::option::of(1u64..=(80 << 10)),
        prop::option::of(1u32..=100),
    )
        .prop_map(|(gpus, core, mib, ratio)| {
            gpus.into_iter()
                .map(|i| GpuGrant {
                    minor: 20 + i,
                    core,
                    memory: mib.map(|m| m << 20),
                    memory_ratio: ratio,
                })
                .collect()
        })
}

fn pod(value: &str, env: &[String]) -> serde_json::Value {
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    spec(
        &[
            (CONTAINERD_POD_UID, "0b5e2c1d-7a3f-4e6b-8c9d-1e2f3a4b5c6d"),
            (CONTAINERD_CONTAINER_NAME, "app"),
            (koordinator::ALLOCATED, value),
        ],
        &env,
    )
}

fn plan(s: &serde_json::Value, c: &Config) -> Result<Plan, AllocationError> {
    gpufence::plan::plan_with(
        s,
        "ctr-1",
        &inventory_minors(),
        c,
        &[],
        &KubeletSource::Absent,
    )
}

fn admission() -> Config {
    let mut c = config();
    c.allocation.trust_annotations = TrustAnnotations::Admission;
    c
}

/// koordlet's env for these grants, as `InjectContainerGPUEnv` writes it (HAMi-core pods).
fn koordlet_env(grants: &[GpuGrant]) -> Vec<String> {
    let minors: Vec<String> = grants.iter().map(|g| g.minor.to_string()).collect();
    let mut env = vec![format!("NVIDIA_VISIBLE_DEVICES={}", minors.join(","))];
    let first = &grants[0];
    if first.memory_ratio.is_some_and(|r| r < 100)
        && let Some(m) = first.memory
    {
        env.push(format!("CUDA_DEVICE_MEMORY_LIMIT={m}"));
        if let Some(c) = first.core {
            env.push(format!("CUDA_DEVICE_SM_LIMIT={c}"));
        }
        env.push("LD_PRELOAD=/usr/local/vgpu/libvgpu.so".into());
    }
    env
}

fn mig_reservations() -> impl Strategy<Value = Vec<MigReservation>> {
    prop::collection::vec(
        (
            0usize..4,
            0usize..4,
            "GPU-[0-9a-f]{8}",
            "[1-7]g\\.[0-9]{1,2}gb",
            (0u32..8, 1u32..8),
            prop::option::of(("MIG-[0-9a-f]{8}", 0u32..16, 0u32..8)),
        ),
        0..6,
    )
    .prop_map(|v| {
        let mut out: Vec<MigReservation> = Vec::new();
        for (container, device, gpu_uuid, profile, placement, rt) in v {
            if out
                .iter()
                .any(|r| (r.container, r.device) == (container, device))
            {
                continue;
            }
            out.push(MigReservation {
                container,
                device,
                gpu_uuid,
                profile,
                placement,
                runtime: rt.map(|(mig_uuid, gpu_instance, compute_instance)| MigRuntime {
                    mig_uuid,
                    gpu_instance,
                    compute_instance,
                }),
            });
        }
        out
    })
}

fn mig_json(r: &[MigReservation]) -> String {
    let list: Vec<serde_json::Value> = r
        .iter()
        .map(|r| {
            let mut v = serde_json::json!({
                "containerIndex": r.container, "deviceIndex": r.device, "gpuUUID": r.gpu_uuid,
                "profile": r.profile,
                "placement": {"start": r.placement.0, "size": r.placement.1},
            });
            if let Some(rt) = &r.runtime {
                v["migUUID"] = rt.mig_uuid.clone().into();
                v["gpuInstanceID"] = rt.gpu_instance.into();
                v["computeInstanceID"] = rt.compute_instance.into();
            }
            v
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

proptest! {
    #![proptest_config(prop_support::cases(128))]

    #[test]
    fn parsers_never_panic(s in any::<String>(), j in "[\\[\\]{}\":,0-9a-z. -]{0,64}") {
        for v in [&s, &j] {
            let _ = koordinator::parse(v);
            let _ = hami_mig::parse(v);
            let _ = without_hami_core(v);
        }
    }

    #[test]
    fn what_koord_scheduler_writes_parses_back(g in grants(), strings in any::<bool>()) {
        prop_assert_eq!(koordinator::parse(&annotation(&g, strings)).unwrap(), g);
    }

    #[test]
    fn a_koordinator_pod_gets_exactly_its_minors_only_under_admission(
        g in grants(), strings in any::<bool>()
    ) {
        let value = annotation(&g, strings);
        let inv = inventory_minors();
        let got = plan(&pod(&value, &[]), &admission());
        // A quota larger than the GPU is refused; everything else is granted exactly.
        let too_big = g.iter().any(|x| x.quota(80 << 30).is_some_and(|q| q > 80 << 30));
        match got {
            Err(e) => prop_assert!(too_big, "{}", e),
            Ok(p) => {
                prop_assert!(!too_big);
                let a = p.allocation.as_ref().unwrap();
                let minors: Vec<u32> = a.devices.iter().map(|d| match d.device {
                    DeviceRef::Gpu { index } => inv.gpu_by_index(index).unwrap().minor,
                    DeviceRef::Mig { .. } => u32::MAX,
                }).collect();
                prop_assert_eq!(minors, g.iter().map(|x| x.minor).collect::<Vec<_>>());
                for (d, x) in a.devices.iter().zip(&g) {
                    prop_assert_eq!(d.memory_limit, x.quota(80 << 30));
                    prop_assert_eq!(d.cores, x.cores());
                }
            }
        }
        // Under "kubelet", with nothing recorded: never a GPU.
        prop_assert!(plan(&pod(&value, &[]), &config()).is_err());
    }

    #[test]
    fn koordlets_own_env_agrees_and_another_gpus_does_not(g in grants()) {
        let value = annotation(&g, false);
        let env = koordlet_env(&g);
        let Ok(p) = plan(&pod(&value, &env), &admission()) else {
            // Only a quota beyond the GPU is refused.
            prop_assert!(g[0].quota(80 << 30).is_some_and(|q| q > 80 << 30));
            return Ok(());
        };
        let a = p.allocation.as_ref().unwrap();
        let inv = inventory_minors();
        for e in &env {
            let (k, v) = e.split_once('=').unwrap();
            prop_assert_eq!(koordlet_env_agrees(a, &inv, k, v), k != "LD_PRELOAD", "{}", e);
        }
        prop_assert!(p.edits.env.iter().all(|e| !e.contains("libvgpu")));
        // koordlet naming a GPU the annotation does not: refused.
        let other = WHOLE_GPUS.iter().map(|i| 20 + i).find(|m| g.iter().all(|x| x.minor != *m));
        if let Some(m) = other {
            let mut env = env.clone();
            env[0] = format!("NVIDIA_VISIBLE_DEVICES={m}");
            prop_assert!(plan(&pod(&value, &env), &admission()).is_err());
            prop_assert!(!koordlet_env_agrees(a, &inv, "NVIDIA_VISIBLE_DEVICES", &m.to_string()));
        }
    }

    #[test]
    fn what_hami_writes_as_mig_reservations_parses_back(r in mig_reservations()) {
        prop_assert_eq!(hami_mig::parse(&mig_json(&r)).unwrap(), r);
    }

    #[test]
    fn hami_env_limits_are_what_hami_core_reads(
        indexed in prop::collection::vec(prop::option::of(prop_oneof![Just(0u64), 1u64..4096]), 2),
        unindexed in prop::option::of(prop_oneof![Just(0u64), 1u64..4096]),
        sm_indexed in prop::collection::vec(prop::option::of(0u32..=120), 2),
        sm_unindexed in prop::option::of(0u32..=120),
    ) {
        let mut env = vec![format!(
            "NVIDIA_VISIBLE_DEVICES={},{}", uuid(0), uuid(1)
        )];
        for (i, m) in indexed.iter().enumerate() {
            if let Some(m) = m {
                env.push(format!("CUDA_DEVICE_MEMORY_LIMIT_{i}={m}m"));
            }
        }
        if let Some(m) = unindexed {
            env.push(format!("CUDA_DEVICE_MEMORY_LIMIT={m}m"));
        }
        for (i, c) in sm_indexed.iter().enumerate() {
            if let Some(c) = c {
                env.push(format!("CUDA_DEVICE_SM_LIMIT_{i}={c}"));
            }
        }
        if let Some(c) = sm_unindexed {
            env.push(format!("CUDA_DEVICE_SM_LIMIT={c}"));
        }
        let env_refs: Vec<&str> = env.iter().map(String::as_str).collect();
        let p = gpufence::plan::plan(&spec(&[], &env_refs), "ctr-1", &inventory(),
            &trusting(&[Dialect::Hami]), &[]).unwrap();
        // HAMi-core's do_init_device_memory_limits / _sm_limits.
        let pick = |own: Option<u64>, all: Option<u64>| match own.filter(|v| *v != 0) {
            Some(v) => v,
            None => all.unwrap_or(0),
        };
        let any_limit = env.len() > 1;
        for i in 0..2 {
            let mem = pick(indexed[i], unindexed);
            let sm = pick(sm_indexed[i].map(u64::from), sm_unindexed.map(u64::from));
            let want_mem = (mem != 0).then_some(mem << 20);
            let want_sm = u8::try_from(sm).ok().filter(|c| (1..100).contains(c));
            match &p.allocation {
                Some(a) => {
                    prop_assert_eq!(a.devices[i].memory_limit, want_mem, "device {}: {:?}", i, env);
                    prop_assert_eq!(a.devices[i].cores, want_sm, "device {}: {:?}", i, env);
                }
                None => prop_assert!(!any_limit, "{:?}", env),
            }
        }
    }

    #[test]
    fn without_hami_core_keeps_every_other_library(
        libs in prop::collection::vec("/[a-z]{1,6}/libx[a-z]{0,5}\\.so(\\.[0-9])?", 0..4),
        at in 0usize..5,
        sep in prop::sample::select(vec![":", " "]),
    ) {
        let mut all = libs.clone();
        all.insert(at.min(all.len()), "/usr/local/vgpu/libvgpu.so".to_string());
        let rest = without_hami_core(&all.join(sep)).unwrap();
        let kept: Vec<&str> = rest.split(':').filter(|e| !e.is_empty()).collect();
        prop_assert_eq!(kept, libs.iter().map(String::as_str).collect::<Vec<_>>());
        prop_assert_eq!(without_hami_core(&libs.join(sep)), None);
    }
}
