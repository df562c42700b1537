//! Time-slicing replicas (`sharing.replicas = "equal"`): a container that kubelet's checkpoint
//! records holding r of a GPU's N replicas (NVIDIA's device plugin: ids `<uuid>::<k>` or
//! `<index>::<k>`, every id of the resource under `RegisteredDevices`) gets r/N of the device's
//! memory and compute. The checkpoints are built in kubelet's real format (go-spew FNV-32a
//! checksum, protobuf `AllocResp`) and read by the same parser as the file on a node; the
//! allocation response is what the plugin returns (`NVIDIA_VISIBLE_DEVICES` naming the devices
//! without their replica suffix).

mod alloc_support;
mod prop_support;

use alloc_support::*;
use gpufence::allocation::{AllocationError, DeviceRef};
use gpufence::config::{Config, CoresPolicy, MpsConfig, ReplicasPolicy};
use gpufence::kubelet::{self, CONTAINERD_CONTAINER_NAME, CONTAINERD_POD_UID, checkpoint::Entry};
use gpufence::plan::Plan;
use proptest::prelude::*;

const POD: &str = "6f1c2a3b-0d4e-4f5a-9b8c-7d6e5f4a3b2c";
const GIB: u64 = 1 << 30;

/// What the device plugin returned from Allocate for `ids` of `resource`: the devices without
/// their replica suffix, deduplicated, in `NVIDIA_VISIBLE_DEVICES`.
fn plugin_entry(pod: &str, ctr: &str, resource: &str, ids: &[&str], nvd: &str) -> Entry {
    kubelet::entry(
        pod,
        ctr,
        resource,
        ids,
        kubelet::encode_alloc_resp(&[("NVIDIA_VISIBLE_DEVICES", nvd)], &[]),
    )
}

/// `RegisteredDevices` of a resource: `n` replicas of each `(device, n)` (`n = 0`: the device
/// itself, not replicated).
fn registered(devices: &[(&str, u32)]) -> Vec<String> {
    let mut out = Vec::new();
    for (d, n) in devices {
        if *n == 0 {
            out.push(d.to_string());
        }
        out.extend((0..*n).map(|k| format!("{d}::{k}")));
    }
    out
}

/// config.json of container `ctr` of pod `pod` as containerd writes it: the env kubelet passed.
fn container(pod: &str, ctr: &str, nvd: &str, annotations: &[(&str, &str)]) -> serde_json::Value {
    let mut ann = vec![
        (CONTAINERD_POD_UID, pod),
        (CONTAINERD_CONTAINER_NAME, ctr),
        ("io.kubernetes.cri.container-type", "container"),
    ];
    ann.extend_from_slice(annotations);
    spec(&ann, &[&format!("NVIDIA_VISIBLE_DEVICES={nvd}")])
}

fn plan(spec: &serde_json::Value, cp: &str, cfg: &Config) -> Result<Plan, AllocationError> {
    plan_with_checkpoint(spec, Some(cp), cfg)
}

/// (device, memory limit, cores, replicas held/of) per allocated device.
type Row = (DeviceRef, Option<u64>, Option<u8>, Option<(u32, u32)>);

fn rows(p: &Plan) -> Vec<Row> {
    p.allocation
        .as_ref()
        .map(|a| {
            a.devices
                .iter()
                .map(|d| {
                    let r = d.replica.as_ref().map(|r| (r.held, r.of));
                    (d.device, d.memory_limit, d.cores, r)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn burst(p: &Plan) -> bool {
    p.allocation.as_ref().unwrap().cores_burst
}

const GPU1: DeviceRef = DeviceRef::Gpu { index: 1 };

/// GPU 1 shared 4 ways as `nvidia.com/gpu`; this container holds `held`.
fn four_way(held: &[u32]) -> String {
    let u = uuid(1);
    let ids: Vec<String> = held.iter().map(|k| format!("{u}::{k}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    kubelet::checkpoint_json_registered(
        vec![plugin_entry(POD, "app", "nvidia.com/gpu", &ids, &u)],
        &[("nvidia.com/gpu", registered(&[(&u, 4)]))],
    )
}

#[test]
fn one_of_four_is_a_quarter_with_burst() {
    let s = container(POD, "app", &uuid(1), &[]);
    let p = plan(&s, &four_way(&[2]), &config()).unwrap();
    assert_eq!(
        rows(&p),
        vec![(GPU1, Some(20 * GIB), Some(25), Some((1, 4)))]
    );
    assert!(burst(&p));
    check_plan(&p, &inventory());
    // The quota handed to the shim carries it.
    let q = p.quota.as_ref().unwrap();
    assert_eq!(q.devices[0].memory, Some(20 * GIB));
    assert_eq!(q.devices[0].cores, Some(25));
    assert!(q.cores_burst);
    // gpufence plan, text and JSON.
    let text = gpufence::commands::plan::render(&p);
    assert!(
        text.contains(&format!(
            "replica 1 of 4 of {} (nvidia.com/gpu) → 20 GiB, 25 % burst",
            uuid(1)
        )),
        "{text}"
    );
    assert!(text.contains("kubelet.checkpoint"), "{text}");
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(
        json["allocation"]["devices"][0]["replica"],
        serde_json::json!({"resource": "nvidia.com/gpu", "held": 1, "of": 4,
            "memory": 20 * GIB, "cores": 25})
    );
}

#[test]
fn two_of_four_is_half_and_four_of_four_the_whole_gpu() {
    let s = container(POD, "app", &uuid(1), &[]);
    let p = plan(&s, &four_way(&[0, 3]), &config()).unwrap();
    assert_eq!(
        rows(&p),
        vec![(GPU1, Some(40 * GIB), Some(50), Some((2, 4)))]
    );
    let p = plan(&s, &four_way(&[0, 1, 2, 3]), &config()).unwrap();
    assert_eq!(rows(&p), vec![(GPU1, None, None, Some((4, 4)))]);
    assert!(!burst(&p));
}

#[test]
fn uneven_registrations_and_ids_without_replicas() {
    // GPU 0 shared 3 ways, GPU 1 4 ways, GPU 3 not shared: one resource.
    let (u0, u1, u3) = (uuid(0), uuid(1), uuid(3));
    let reg = registered(&[(&u0, 3), (&u1, 4), (&u3, 0)]);
    let a = format!("{u0}::1");
    let b = format!("{u1}::2");
    let cp = kubelet::checkpoint_json_registered(
        vec![
            plugin_entry(
                POD,
                "app",
                "nvidia.com/gpu",
                &[&a, &b],
                &format!("{u0},{u1}"),
            ),
            plugin_entry(POD, "whole", "nvidia.com/gpu", &[&u3], &u3),
        ],
        &[("nvidia.com/gpu", reg)],
    );
    let p = plan(
        &container(POD, "app", &format!("{u0},{u1}"), &[]),
        &cp,
        &config(),
    )
    .unwrap();
    assert_eq!(
        rows(&p),
        vec![
            (
                DeviceRef::Gpu { index: 0 },
                Some(80 * GIB / 3),
                Some(33),
                Some((1, 3))
            ),
            (GPU1, Some(20 * GIB), Some(25), Some((1, 4))),
        ]
    );
    // An id without replicas is the whole GPU, as today.
    let p = plan(&container(POD, "whole", &u3, &[]), &cp, &config()).unwrap();
    assert_eq!(
        rows(&p),
        vec![(DeviceRef::Gpu { index: 3 }, None, None, None)]
    );
}

#[test]
fn index_strategy_and_index_ids() {
    // deviceIDStrategy=index: the plugin's env names the index; kubelet's ids are UUIDs.
    let s = container(POD, "app", "1", &[]);
    let p = plan(&s, &four_way(&[1]), &config()).unwrap();
    assert_eq!(
        rows(&p),
        vec![(GPU1, Some(20 * GIB), Some(25), Some((1, 4)))]
    );
    // Ids in the index form (`<index>::<k>`).
    let cp = kubelet::checkpoint_json_registered(
        vec![plugin_entry(
            POD,
            "app",
            "nvidia.com/gpu",
            &["1::0", "1::1", "1::4"],
            "1",
        )],
        &[("nvidia.com/gpu", registered(&[("0", 8), ("1", 8)]))],
    );
    let p = plan(&s, &cp, &config()).unwrap();
    assert_eq!(
        rows(&p),
        vec![(GPU1, Some(30 * GIB), Some(37), Some((3, 8)))]
    );
}

#[test]
fn renamed_resource_next_to_whole_gpus() {
    // renameByDefault: replicas of GPU 1 as nvidia.com/gpu.shared, GPU 0 whole as nvidia.com/gpu.
    let (u0, u1) = (uuid(0), uuid(1));
    let id = format!("{u1}::1");
    let cp = kubelet::checkpoint_json_registered(
        vec![
            plugin_entry(POD, "app", "nvidia.com/gpu.shared", &[&id], &u1),
            plugin_entry("other-pod", "app", "nvidia.com/gpu", &[&u0], &u0),
        ],
        &[
            ("nvidia.com/gpu", registered(&[(&u0, 0)])),
            ("nvidia.com/gpu.shared", registered(&[(&u1, 2)])),
        ],
    );
    let p = plan(&container(POD, "app", &u1, &[]), &cp, &config()).unwrap();
    assert_eq!(
        rows(&p),
        vec![(GPU1, Some(40 * GIB), Some(50), Some((1, 2)))]
    );
    let text = gpufence::commands::plan::render(&p);
    assert!(
        text.contains("(nvidia.com/gpu.shared) → 40 GiB, 50 % burst"),
        "{text}"
    );
    let p = plan(&container("other-pod", "app", &u0, &[]), &cp, &config()).unwrap();
    assert_eq!(
        rows(&p),
        vec![(DeviceRef::Gpu { index: 0 }, None, None, None)]
    );
}

#[test]
fn mig_replicas_share_the_instance_memory_only() {
    let m = mig_uuid(2, 1);
    let id = format!("{m}::0");
    let cp = kubelet::checkpoint_json_registered(
        vec![plugin_entry(
            POD,
            "app",
            "nvidia.com/mig-1g.10gb",
            &[&id],
            &m,
        )],
        &[("nvidia.com/mig-1g.10gb", registered(&[(&m, 2)]))],
    );
    let p = plan(&container(POD, "app", &m, &[]), &cp, &config()).unwrap();
    let mig = DeviceRef::Mig { gpu: 2, mig: 1 };
    assert_eq!(rows(&p), vec![(mig, Some(5 * GIB), None, Some((1, 2)))]);
    assert!(!burst(&p));
    assert!(
        p.notes
            .iter()
            .any(|n| n.contains("MIG device isolates compute")),
        "{:?}",
        p.notes
    );
    // The index form of a MIG device (`2:1::k`), three ways.
    let cp = kubelet::checkpoint_json_registered(
        vec![plugin_entry(
            POD,
            "app",
            "nvidia.com/gpu",
            &["2:1::2"],
            "2:1",
        )],
        &[("nvidia.com/gpu", registered(&[("2:1", 3)]))],
    );
    let p = plan(&container(POD, "app", "2:1", &[]), &cp, &config()).unwrap();
    assert_eq!(
        rows(&p),
        vec![(mig, Some(10 * GIB / 3), None, Some((1, 3)))]
    );
}

#[test]
fn an_annotation_may_lower_the_share_never_raise_it() {
    let cp = four_way(&[0]);
    let lower = container(
        POD,
        "app",
        &uuid(1),
        &[
            ("gpufence.dev/memory", "8Gi"),
            ("gpufence.dev/cores", "10"),
            ("gpufence.dev/cores-policy", "hard"),
        ],
    );
    let p = plan(&lower, &cp, &config()).unwrap();
    assert_eq!(
        rows(&p),
        vec![(GPU1, Some(8 * GIB), Some(10), Some((1, 4)))]
    );
    assert!(!burst(&p));
    for (key, value, what) in [
        ("gpufence.dev/memory", "30Gi", "20 GiB"),
        ("gpufence.dev/cores", "50", "25 %"),
    ] {
        let raise = container(POD, "app", &uuid(1), &[(key, value)]);
        let e = plan(&raise, &cp, &config()).unwrap_err();
        assert_eq!(e.key, key, "{e}");
        assert!(e.why.contains(what) && e.why.contains("never raise"), "{e}");
    }
    // Burst where the operator made replica shares hard: a raise too.
    let mut hard = config();
    hard.sharing.replica_cores_policy = CoresPolicy::Hard;
    let p = plan(&container(POD, "app", &uuid(1), &[]), &cp, &hard).unwrap();
    assert!(!burst(&p));
    let b = container(
        POD,
        "app",
        &uuid(1),
        &[("gpufence.dev/cores-policy", "burst")],
    );
    let e = plan(&b, &cp, &hard).unwrap_err();
    assert_eq!(e.key, "gpufence.dev/cores-policy", "{e}");
}

#[test]
fn off_leaves_replicas_unlimited() {
    let mut off = config();
    off.sharing.replicas = ReplicasPolicy::Off;
    let p = plan(&container(POD, "app", &uuid(1), &[]), &four_way(&[0]), &off).unwrap();
    assert_eq!(rows(&p), vec![(GPU1, None, None, None)]);
    // An unreadable record does not matter to the replica shares then; the plugin's device
    // mounts still need kubelet's record under trust-annotations = "kubelet" (fail closed), and
    // pass where the node believes them.
    let s = with_mounts(
        container(POD, "app", "/var/run/nvidia-container-devices", &[]),
        &[&format!("/var/run/nvidia-container-devices/{}", uuid(1))],
    );
    let e = plan(&s, "{not a checkpoint", &off).unwrap_err();
    assert!(e.why.contains("cannot be used"), "{e}");
    off.allocation.trust_annotations = gpufence::config::TrustAnnotations::Believed;
    assert!(plan(&s, "{not a checkpoint", &off).is_ok());
}

#[test]
fn unknowable_shares_are_refused() {
    let u = uuid(1);
    // A replica kubelet does not register (the plugin now advertises 4, the container holds ::5).
    let id = format!("{u}::5");
    let cp = kubelet::checkpoint_json_registered(
        vec![plugin_entry(POD, "app", "nvidia.com/gpu", &[&id], &u)],
        &[("nvidia.com/gpu", registered(&[(&u, 4)]))],
    );
    let e = plan(&container(POD, "app", &u, &[]), &cp, &config()).unwrap_err();
    assert_eq!(e.key, "kubelet.checkpoint", "{e}");
    assert!(
        e.why.contains("::5") && e.why.contains("does not register"),
        "{e}"
    );
    // A replica of a device this node does not have.
    let cp = kubelet::checkpoint_json_registered(
        vec![plugin_entry(POD, "app", "nvidia.com/gpu", &["9::0"], "1")],
        &[("nvidia.com/gpu", registered(&[("9", 2)]))],
    );
    let e = plan(&container(POD, "app", "1", &[]), &cp, &config()).unwrap_err();
    assert!(e.why.contains("no GPU with index 9"), "{e}");
    // One device held under two names.
    let a = format!("{u}::0");
    let cp = kubelet::checkpoint_json_registered(
        vec![plugin_entry(
            POD,
            "app",
            "nvidia.com/gpu",
            &[&a, "1::1"],
            "1",
        )],
        &[("nvidia.com/gpu", registered(&[(&u, 2), ("1", 2)]))],
    );
    let e = plan(&container(POD, "app", "1", &[]), &cp, &config()).unwrap_err();
    assert!(e.why.contains("one share per device"), "{e}");
    // kubelet expected, its record unreadable: the plugin's devices are refused, naming why —
    // its env (trust-env) and its device mounts (the volume-mounts strategy) alike.
    let e = plan(&container(POD, "app", "1", &[]), "{bad", &config()).unwrap_err();
    assert_eq!(e.key, "NVIDIA_VISIBLE_DEVICES", "{e}");
    let s = with_mounts(
        container(POD, "app", "/var/run/nvidia-container-devices", &[]),
        &[&format!("/var/run/nvidia-container-devices/{u}")],
    );
    // Refused either way: by the trust check (the grant is unbacked) before the replica check
    // (the share cannot be known) would refuse it.
    let e = plan(&s, "{not a checkpoint", &config()).unwrap_err();
    assert!(
        e.why.contains("GPU 1") && e.why.contains("cannot be used"),
        "{e}"
    );
    // An annotation-borne GPU is allocation.trust-annotations' business: refused unbacked under
    // "kubelet" (the default), whole and unlimited where the node believes annotations.
    let s = container(POD, "app", "", &[("gpufence.dev/devices", "1")]);
    assert!(plan(&s, "{not a checkpoint", &config()).is_err());
    let mut believed = config();
    believed.allocation.trust_annotations = gpufence::config::TrustAnnotations::Believed;
    assert_eq!(
        rows(&plan(&s, "{not a checkpoint", &believed).unwrap()),
        vec![(GPU1, None, None, None)]
    );
    // A malformed replica id makes the record unusable.
    let cp = kubelet::checkpoint_json_registered(
        vec![plugin_entry(POD, "app", "nvidia.com/gpu", &["1::x"], "1")],
        &[("nvidia.com/gpu", vec!["1::x".into()])],
    );
    assert!(plan(&container(POD, "app", "1", &[]), &cp, &config()).is_err());
}

#[test]
fn plugin_mps_mode_gets_the_smaller_limits() {
    // The plugin's MPS mode uses the same replica ids; with gpufence's MPS configured for the
    // GPU the client limits come from the share, the quota backend still holds the memory.
    let mut cfg = config();
    cfg.sharing.mps = Some(MpsConfig {
        gpus: vec!["all".into()],
        ..MpsConfig::default()
    });
    let p = plan(&container(POD, "app", &uuid(1), &[]), &four_way(&[3]), &cfg).unwrap();
    let m = p.mps.as_ref().expect("mps plan");
    assert_eq!(m.active_thread_percentage, Some(25));
    assert_eq!(m.pinned_mem_limit.as_deref(), Some("0=20480M"));
    assert_eq!(p.quota.as_ref().unwrap().devices[0].memory, Some(20 * GIB));
}

/// A node's replica layout: per shared device (GPU 0, GPU 1, MIG 2:0), N, and which container
/// (0..6, or none) holds each replica.
fn layout() -> impl Strategy<Value = Vec<(u32, Vec<Option<usize>>)>> {
    prop::collection::vec(
        (1u32..=12).prop_flat_map(|n| {
            (
                Just(n),
                prop::collection::vec(prop::option::of(0usize..6), n as usize),
            )
        }),
        3,
    )
}

proptest! {
    #![proptest_config(prop_support::cases(64))]

    /// However kubelet spread the replicas, the shares of all containers of a device never sum
    /// above the device: memory and compute.
    #[test]
    fn shares_of_a_device_never_sum_above_it(l in layout(), index_ids in any::<bool>()) {
        let inv = inventory();
        let devices = [
            (DeviceRef::Gpu { index: 0 }, if index_ids { "0".to_string() } else { uuid(0) }, 80 * GIB),
            (GPU1, if index_ids { "1".to_string() } else { uuid(1) }, 80 * GIB),
            (DeviceRef::Mig { gpu: 2, mig: 0 }, mig_uuid(2, 0), 10 * GIB),
        ];
        let mut reg = Vec::new();
        let mut held: Vec<Vec<String>> = vec![Vec::new(); 6];
        let mut nvd: Vec<Vec<String>> = vec![Vec::new(); 6];
        for ((n, owners), (_, name, _)) in l.iter().zip(&devices) {
            reg.extend(registered(&[(name, *n)]));
            for (k, o) in owners.iter().enumerate() {
                if let Some(c) = o {
                    held[*c].push(format!("{name}::{k}"));
                    if !nvd[*c].contains(name) {
                        nvd[*c].push(name.clone());
                    }
                }
            }
        }
        let entries: Vec<Entry> = (0..6)
            .filter(|c| !held[*c].is_empty())
            .map(|c| {
                let ids: Vec<&str> = held[c].iter().map(String::as_str).collect();
                plugin_entry(POD, &format!("c{c}"), "nvidia.com/gpu", &ids, &nvd[c].join(","))
            })
            .collect();
        let cp = kubelet::checkpoint_json_registered(entries, &[("nvidia.com/gpu", reg)]);
        let mut mem = [0u64; 3];
        let mut cores = [0u32; 3];
        for c in (0..6).filter(|c| !held[*c].is_empty()) {
            let p = plan(&container(POD, &format!("c{c}"), &nvd[c].join(","), &[]), &cp, &config())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            check_plan(&p, &inv);
            for (d, m, k, r) in rows(&p) {
                let i = devices.iter().position(|x| x.0 == d).unwrap();
                let (h, of) = r.expect("every held device has its share");
                prop_assert_eq!(of, l[i].0);
                prop_assert_eq!(h as usize, held[c].iter().filter(|id| id.starts_with(&format!("{}::", devices[i].1))).count());
                mem[i] += m.unwrap_or(devices[i].2);
                cores[i] += u32::from(k.unwrap_or(100));
                if matches!(d, DeviceRef::Mig { .. }) {
                    prop_assert_eq!(k, None);
                }
            }
        }
        for i in 0..3 {
            prop_assert!(mem[i] <= devices[i].2, "device {i}: {} > {}", mem[i], devices[i].2);
            if i < 2 {
                prop_assert!(cores[i] <= 100, "device {i}: {} %", cores[i]);
            }
        }
    }

    /// The share itself: never above the device, monotone in r, exact for r = N.
    #[test]
    fn share_is_bounded_and_monotone(mem in 0u64..(1 << 50), of in 1u32..300, h in 0u32..300) {
        use gpufence::allocation::replicas::share;
        let h = h % (of + 1);
        let (m, c) = share(mem, h, of, false);
        prop_assert!(m <= mem);
        prop_assert!(c.unwrap() <= 100);
        if h < of {
            let (m2, _) = share(mem, h + 1, of, false);
            prop_assert!(m2 >= m);
        } else {
            prop_assert_eq!((m, c), (mem, Some(100)));
        }
        prop_assert_eq!(share(mem, h, of, true).1, None);
    }
}

/// Attack: kubelet records 1 of 4 replicas of GPU 2 (a MIG-enabled GPU, the plugin's MIG
/// strategy `none` sharing the whole GPU); the pod's annotation picks one of its MIG devices,
/// which the GPU's record backs — and the replica share, looked up by the MIG device only, was
/// not applied: the container got the whole instance with no quota (four holders, four times
/// over) instead of its quarter.
#[test]
fn a_mig_device_of_a_gpu_held_as_replicas_keeps_the_share() {
    let u = uuid(2);
    let id = format!("{u}::1");
    // The plugin's device id backs the GPU (its `cdi-cri` strategy: no env names it).
    let resp = kubelet::encode_alloc_resp(&[], &[]);
    let cp = kubelet::checkpoint_json_registered(
        vec![kubelet::entry(POD, "app", "nvidia.com/gpu", &[&id], resp)],
        &[("nvidia.com/gpu", registered(&[(&u, 4)]))],
    );
    let s = container(
        POD,
        "app",
        "void",
        &[("gpufence.dev/devices", &mig_uuid(2, 0))],
    );
    // A quarter of the instance: four holders of the GPU's replicas never sum above it.
    let p = plan(&s, &cp, &config()).unwrap();
    let mig = DeviceRef::Mig { gpu: 2, mig: 0 };
    assert_eq!(
        rows(&p),
        vec![(mig, Some(10 * GIB / 4), None, Some((1, 4)))]
    );
    // An annotation may not raise it.
    let raise = container(
        POD,
        "app",
        "void",
        &[
            ("gpufence.dev/devices", &mig_uuid(2, 0)),
            ("gpufence.dev/memory", "5Gi"),
        ],
    );
    let e = plan(&raise, &cp, &config()).unwrap_err();
    assert!(e.why.contains("never raise"), "{e}");
}
