//! Koordinator (issue 34): koord-scheduler's `scheduling.koordinator.sh/device-allocated` pod
//! annotation read for the container's GPUs (by device minor), memory and compute; believed
//! under `trust-annotations = "admission"`, refused under `"kubelet"` with a line naming the
//! mode; koordlet's env (`NVIDIA_VISIBLE_DEVICES=<minors>`, unindexed `CUDA_DEVICE_*`) agreeing
//! with it; its HAMi-core preload neutralised.

mod alloc_support;

use alloc_support::*;
use gpufence::allocation::backing::Backing;
use gpufence::allocation::koordinator::{self, koordlet_env_agrees};
use gpufence::allocation::{AllocationError, Origin};
use gpufence::config::{Config, ShimInject, TrustAnnotations};
use gpufence::inventory::Inventory;
use gpufence::kubelet::{CONTAINERD_CONTAINER_NAME, CONTAINERD_POD_UID, KubeletSource};
use gpufence::plan::Plan;

const POD: &str = "0b5e2c1d-7a3f-4e6b-8c9d-1e2f3a4b5c6d";
/// koordlet's HAMi-core library path (`--hami-core-library-directory-path` default).
const KOORDLET_LIBVGPU: &str = "/usr/local/vgpu/libvgpu.so";

fn inventory_minors() -> Inventory {
    inventory_with_minors(10)
}

fn koord_value(entries: &[(u32, &str)]) -> String {
    let gpus: Vec<String> = entries
        .iter()
        .map(|(minor, resources)| format!(r#"{{"minor":{minor},"resources":{{{resources}}}}}"#))
        .collect();
    format!(
        r#"{{"gpu":[{}],"rdma":[{{"minor":0,"id":"0000:09:00.0","resources":{{"koordinator.sh/rdma":100}}}}]}}"#,
        gpus.join(",")
    )
}

/// GPU of minor 11 (index 1), 8 GiB and half its compute, as the issue's pod.
fn half_of_gpu1() -> String {
    koord_value(&[(
        11,
        r#""koordinator.sh/gpu-core":50,"koordinator.sh/gpu-memory-ratio":10,"koordinator.sh/gpu-memory":"8Gi""#,
    )])
}

fn pod_container(ctr: &str, value: &str, env: &[&str]) -> serde_json::Value {
    spec(
        &[
            (CONTAINERD_POD_UID, POD),
            (CONTAINERD_CONTAINER_NAME, ctr),
            (koordinator::ALLOCATED, value),
        ],
        env,
    )
}

fn mode(m: TrustAnnotations) -> Config {
    let mut c = config();
    c.allocation.trust_annotations = m;
    c
}

fn run(s: &serde_json::Value, c: &Config) -> Result<Plan, AllocationError> {
    gpufence::plan::plan_with(
        s,
        "ctr-1",
        &inventory_minors(),
        c,
        &[],
        &KubeletSource::Absent,
    )
}

fn devices(p: &Plan) -> Vec<(u32, Option<u64>, Option<u8>)> {
    let limits = gpu_limits(p);
    assert!(!limits.is_empty(), "no GPU granted: {p:?}");
    limits
}

/// koordlet's env for a `koordinator.sh/gpu-isolation-provider: HAMi-core` pod.
fn koordlet_env(minors: &str, bytes: u64, core: u32) -> Vec<String> {
    vec![
        "PATH=/usr/bin".to_string(),
        format!("NVIDIA_VISIBLE_DEVICES={minors}"),
        format!("CUDA_DEVICE_MEMORY_LIMIT={bytes}"),
        format!("CUDA_DEVICE_SM_LIMIT={core}"),
        format!("LD_PRELOAD={KOORDLET_LIBVGPU}"),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn admission_believes_the_annotation_by_minor_with_memory_and_compute() {
    let p = run(
        &pod_container("app", &half_of_gpu1(), &["NVIDIA_VISIBLE_DEVICES=all"]),
        &mode(TrustAnnotations::Admission),
    )
    .unwrap();
    assert_eq!(devices(&p), vec![(1, Some(8 * GIB), Some(50))]);
    let a = p.allocation.as_ref().unwrap();
    assert_eq!(a.devices[0].backing, Backing::Admission);
    assert_eq!(a.dialects, [gpufence::config::Dialect::Koordinator]);
    // Exactly GPU 1's node (minor 11), nothing else of the GPUs.
    let gpu_nodes: Vec<&str> = p
        .edits
        .device_nodes
        .iter()
        .map(|d| d.path.as_str())
        .filter(|p| p.starts_with("/dev/nvidia") && p[11..].bytes().all(|b| b.is_ascii_digit()))
        .collect();
    assert_eq!(gpu_nodes, ["/dev/nvidia11"]);
    // The ratio alone is a share of the GPU (80 GiB × 25 %); 100 % is the whole GPU.
    let ratio = koord_value(&[(10, r#""koordinator.sh/gpu-memory-ratio":25"#)]);
    let p = run(
        &pod_container("app", &ratio, &[]),
        &mode(TrustAnnotations::Admission),
    )
    .unwrap();
    assert_eq!(devices(&p), vec![(0, Some(20 * GIB), None)]);
    let whole = koord_value(&[
        (
            10,
            r#""koordinator.sh/gpu-core":100,"koordinator.sh/gpu-memory-ratio":100,"koordinator.sh/gpu-memory":"80Gi""#,
        ),
        (
            11,
            r#""koordinator.sh/gpu-core":100,"koordinator.sh/gpu-memory-ratio":100,"koordinator.sh/gpu-memory":"80Gi""#,
        ),
    ]);
    let p = run(
        &pod_container("app", &whole, &[]),
        &mode(TrustAnnotations::Admission),
    )
    .unwrap();
    assert_eq!(devices(&p), vec![(0, None, None), (1, None, None)]);
    // Every container of the pod gets the pod's GPUs, as koordlet gives them its env.
    let p = run(
        &pod_container("sidecar", &half_of_gpu1(), &[]),
        &mode(TrustAnnotations::Admission),
    )
    .unwrap();
    assert_eq!(devices(&p), vec![(1, Some(8 * GIB), Some(50))]);
}

#[test]
fn kubelet_mode_refuses_with_the_mode_koordinator_needs() {
    let e = run(&pod_container("app", &half_of_gpu1(), &[]), &config()).unwrap_err();
    assert_eq!(e.key, koordinator::ALLOCATED, "{e}");
    assert!(
        e.why
            .contains("Koordinator needs allocation.trust-annotations = \"admission\""),
        "{e}"
    );
    assert!(!e.to_string().contains('\n'));
}

#[test]
fn other_device_types_and_no_gpu_grant_nothing() {
    let rdma_only =
        r#"{"rdma":[{"minor":0,"id":"0000:09:00.0","resources":{"koordinator.sh/rdma":100}}]}"#;
    for c in [config(), mode(TrustAnnotations::Admission)] {
        let p = run(
            &pod_container("app", rdma_only, &["NVIDIA_VISIBLE_DEVICES=all"]),
            &c,
        )
        .unwrap();
        assert!(p.grants_nothing(), "{p:?}");
    }
    // Refused: unknown minor, malformed JSON, a misspelled limit.
    for (bad, why) in [
        (koord_value(&[(99, "")]), "no GPU with device minor 99"),
        ("{\"gpu\":[".to_string(), "not JSON"),
        (
            koord_value(&[(10, r#""koordinator.sh/gpu-memroy":"8Gi""#)]),
            "unknown GPU resource",
        ),
        (
            koord_value(&[(10, r#""koordinator.sh/gpu-memory":"100Gi""#)]),
            "exceeds the memory",
        ),
    ] {
        let e = run(
            &pod_container("app", &bad, &[]),
            &mode(TrustAnnotations::Admission),
        )
        .unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }
}

#[test]
fn koordlets_env_agrees_or_refuses_and_its_hami_core_preload_is_neutralised() {
    let c = mode(TrustAnnotations::Admission);
    let env = koordlet_env("11", 8 * GIB, 50);
    let p = run(&pod_container("app", &half_of_gpu1(), &strs(&env)), &c).unwrap();
    assert_eq!(devices(&p), vec![(1, Some(8 * GIB), Some(50))]);
    let a = p.allocation.as_ref().unwrap();
    assert!(
        a.sources
            .iter()
            .any(|s| s.origin == Origin::Env && s.key == "CUDA_DEVICE_MEMORY_LIMIT"),
        "{:?}",
        a.sources
    );
    assert!(
        p.env_overrides.contains(&"LD_PRELOAD=".to_string()),
        "{:?}",
        p.env_overrides
    );
    assert!(
        p.notes.iter().any(|n| n.contains("HAMi-core")),
        "{:?}",
        p.notes
    );
    // The plan's visible devices replace koordlet's minors.
    assert!(
        p.edits
            .env
            .contains(&format!("NVIDIA_VISIBLE_DEVICES={}", uuid(1)))
    );
    // Disagreements: another GPU, another quota, another compute share.
    for (env, names) in [
        (koordlet_env("10", 8 * GIB, 50), "NVIDIA_VISIBLE_DEVICES"),
        (koordlet_env("11", 4 * GIB, 50), "CUDA_DEVICE_MEMORY_LIMIT"),
        (koordlet_env("11", 8 * GIB, 30), "CUDA_DEVICE_SM_LIMIT"),
    ] {
        let e = run(&pod_container("app", &half_of_gpu1(), &strs(&env)), &c).unwrap_err();
        assert!(
            e.key == names && e.why.contains(koordinator::ALLOCATED),
            "{e}"
        );
    }
    // With the shim injected by env, LD_PRELOAD is gpufence's shim without HAMi-core.
    let mut env_inject = c.clone();
    env_inject.shim.inject = ShimInject::Env;
    let env = koordlet_env("11", 8 * GIB, 50);
    let p = run(
        &pod_container("app", &half_of_gpu1(), &strs(&env)),
        &env_inject,
    )
    .unwrap();
    let pre: Vec<&String> = p
        .edits
        .env
        .iter()
        .filter(|e| e.starts_with("LD_PRELOAD="))
        .collect();
    assert_eq!(pre.len(), 1);
    assert!(!pre[0].contains("libvgpu"), "{pre:?}");
}

#[test]
fn koordlet_env_agrees_is_what_the_nri_validator_lets_pass() {
    let c = mode(TrustAnnotations::Admission);
    let p = run(&pod_container("app", &half_of_gpu1(), &[]), &c).unwrap();
    let a = p.allocation.as_ref().unwrap();
    let inv = inventory_minors();
    assert!(koordlet_env_agrees(a, &inv, "NVIDIA_VISIBLE_DEVICES", "11"));
    assert!(koordlet_env_agrees(
        a,
        &inv,
        "CUDA_DEVICE_MEMORY_LIMIT",
        &(8 * GIB).to_string()
    ));
    assert!(koordlet_env_agrees(
        a,
        &inv,
        "CUDA_DEVICE_MEMORY_LIMIT",
        "8g"
    ));
    assert!(koordlet_env_agrees(a, &inv, "CUDA_DEVICE_SM_LIMIT", "50"));
    for (k, v) in [
        ("NVIDIA_VISIBLE_DEVICES", "1"),
        ("NVIDIA_VISIBLE_DEVICES", "10,11"),
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "4294967296"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "0"),
        ("CUDA_DEVICE_SM_LIMIT", "100"),
        ("LD_PRELOAD", KOORDLET_LIBVGPU),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ] {
        assert!(!koordlet_env_agrees(a, &inv, k, v), "{k}={v}");
    }
}
