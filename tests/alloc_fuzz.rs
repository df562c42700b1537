//! Bounded fuzzing (proptest) of every parser of untrusted input: annotations, env, mounts,
//! quantities, CDI names and annotation keys, CDI spec files. Runs inside `cargo test` in a
//! few seconds; raise `GPUFENCE_FUZZ_CASES` (e.g. 100000) for a longer run.
//!
//! Properties:
//! * nothing panics, whatever the input;
//! * a plan never grants a device node, quota entry or cgroup rule the allocation does not name;
//! * a plan without an allocation grants nothing (no device nodes, no driver files, no shim);
//! * errors are one line and short.

mod alloc_support;
mod prop_support;

use std::collections::BTreeSet;

use alloc_support::*;
use gpufence::config::{Config, Dialect, MemoryUnit, ShimInject, TrustEnv};
use gpufence::plan::{Plan, plan};
use prop_support::cases;
use proptest::prelude::*;

/// Strings that look like what the parsers expect, mixed with anything at all.
fn value() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("0".to_string()),
        Just("1".to_string()),
        Just("2:0".to_string()),
        Just("2:1".to_string()),
        Just("3:0".to_string()),
        Just("all".to_string()),
        Just("none".to_string()),
        Just("void".to_string()),
        Just(uuid(0)),
        Just(uuid(1)),
        Just(mig_uuid(2, 1)),
        Just("GPU-".to_string()),
        Just("-1".to_string()),
        Just("no-gpu-has-4GiB-to-run".to_string()),
        Just("gpufence.dev/gpu=0".to_string()),
        Just("gpufence.dev/gpu=2:1".to_string()),
        Just("vendor.com/nic=nic0".to_string()),
        "[0-9]{1,3}(Ki|Mi|Gi|G|M|m|k|g|e3)?",
        "[0-9]{1,25}",
        "[ -~]{0,12}",
        any::<String>(),
    ];
    prop_oneof![
        3 => prop::collection::vec(token, 1..4).prop_map(|v| v.join(",")),
        1 => any::<String>(),
        1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

const ANN_KEYS: [&str; 10] = [
    "gpufence.dev/devices",
    "gpufence.dev/memory",
    "gpufence.dev/cores",
    "gpufence.dev/cores-policy",
    "gpufence.dev/oversubscribe",
    "gpufence.dev/capabilities",
    "cdi.k8s.io/a",
    "cdi.k8s.io/b-1",
    "aliyun.com/gpu-count",
    "gpufence.dev/other",
];
const ENV_KEYS: [&str; 12] = [
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_MEMORY_LIMIT_1",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DEVICE_SM_LIMIT_1",
    "CUDA_OVERSUBSCRIBE",
    "ALIYUN_COM_GPU_MEM_IDX",
    "ALIYUN_COM_GPU_MEM_CONTAINER",
    "ALIYUN_COM_GPU_MEM_DEV",
    "LD_PRELOAD",
];

/// Values shaped for one key (mostly valid), so the fuzzer also reaches successful plans.
fn shaped(key: &'static str) -> BoxedStrategy<String> {
    let dev = prop::sample::select(vec!["0", "1", "2:0", "2:1", "3"]);
    let devs = prop::collection::vec(dev, 1..3).prop_map(|v| v.join(","));
    match key {
        "gpufence.dev/devices" => devs.boxed(),
        "gpufence.dev/memory" => prop_oneof!["[1-9](Gi|Mi|G)", Just("10Gi".to_string())].boxed(),
        "gpufence.dev/cores" => (1u8..=100).prop_map(|c| c.to_string()).boxed(),
        "gpufence.dev/cores-policy" => prop::sample::select(vec![
            "hard".to_string(),
            "burst".to_string(),
            "soft".to_string(),
        ])
        .boxed(),
        "gpufence.dev/oversubscribe" => {
            prop::sample::select(vec!["true".to_string(), "false".to_string()]).boxed()
        }
        "gpufence.dev/capabilities" => prop::sample::select(vec![
            "compute,utility".to_string(),
            "all".to_string(),
            "graphics".to_string(),
        ])
        .boxed(),
        "cdi.k8s.io/a" | "cdi.k8s.io/b-1" => prop::collection::vec(
            prop::sample::select(vec![
                "vendor.com/nic=nic0",
                "gpufence.dev/gpu=0",
                "gpufence.dev/gpu=2:1",
                "gpufence.dev/gpu=all",
            ]),
            1..3,
        )
        .prop_map(|v| v.join(","))
        .boxed(),
        "aliyun.com/gpu-count" => (1u8..3).prop_map(|c| c.to_string()).boxed(),
        "NVIDIA_VISIBLE_DEVICES" => prop_oneof![
            devs,
            Just(uuid(0)),
            Just(format!("{},{}", uuid(0), uuid(1))),
            Just("all".to_string()),
            Just("void".to_string())
        ]
        .boxed(),
        "CUDA_DEVICE_MEMORY_LIMIT"
        | "CUDA_DEVICE_MEMORY_LIMIT_0"
        | "CUDA_DEVICE_MEMORY_LIMIT_1" => "[0-9]{1,4}[mg]".boxed(),
        "CUDA_DEVICE_SM_LIMIT" | "CUDA_DEVICE_SM_LIMIT_1" => {
            (0u8..=120).prop_map(|c| c.to_string()).boxed()
        }
        "ALIYUN_COM_GPU_MEM_IDX" => {
            prop::sample::select(vec!["0".to_string(), "1".to_string(), "0,1".to_string()]).boxed()
        }
        "ALIYUN_COM_GPU_MEM_CONTAINER" | "ALIYUN_COM_GPU_MEM_DEV" => {
            (1u8..90).prop_map(|c| c.to_string()).boxed()
        }
        _ => value().boxed(),
    }
}

fn entry(keys: &'static [&'static str]) -> impl Strategy<Value = (&'static str, String)> {
    prop::sample::select(keys)
        .prop_flat_map(|k| prop_oneof![2 => shaped(k), 1 => value()].prop_map(move |v| (k, v)))
}

fn input() -> impl Strategy<Value = serde_json::Value> {
    (
        prop::collection::vec(entry(&ANN_KEYS), 0..4),
        prop::collection::vec(entry(&ENV_KEYS), 0..5),
        prop::collection::vec(
            prop_oneof![
                Just("/var/run/nvidia-container-devices/0".to_string()),
                Just(format!("/var/run/nvidia-container-devices/{}", uuid(1))),
                Just("/var/run/nvidia-container-devices/all".to_string()),
                "/var/run/nvidia-container-devices/[ -~]{0,10}",
                Just("/data".to_string()),
            ],
            0..2,
        ),
    )
        .prop_map(|(ann, env, mounts)| {
            let ann: Vec<(&str, &str)> = ann.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let env: Vec<&str> = env.iter().map(|s| s.as_str()).collect();
            let m: Vec<&str> = mounts.iter().map(|s| s.as_str()).collect();
            with_mounts(spec(&ann, &env), &m)
        })
}

fn config_strategy() -> impl Strategy<Value = Config> {
    (
        prop::sample::subsequence(Dialect::ALL.to_vec(), 0..=5),
        prop_oneof![
            Just(TrustEnv::All(false)),
            Just(TrustEnv::All(true)),
            prop::sample::subsequence(
                vec![Dialect::Hami, Dialect::Gpushare, Dialect::Nvidia],
                0..=3
            )
            .prop_map(TrustEnv::Dialects),
        ],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(dialects, trust, env_inject, hami_core, mib)| {
            let mut c = config();
            c.allocation.dialects = dialects;
            c.allocation.trust_env = trust;
            if env_inject {
                c.shim.inject = ShimInject::Env;
            }
            if hami_core {
                c.shim.library = "/usr/local/vgpu/libvgpu.so".into();
            }
            if mib {
                c.gpushare.memory_unit = MemoryUnit::MiB;
            }
            c
        })
}

/// The plan grants only what the allocation names (see `alloc_support::check_plan`).
fn check_invariants(p: &Plan) -> Result<(), TestCaseError> {
    check_plan(p, &inventory());
    Ok(())
}

proptest! {
    #![proptest_config(cases(400))]

    #[test]
    fn plan_never_panics_and_never_over_grants(s in input(), c in config_strategy(), id in prop_oneof![Just("ctr".to_string()), "[ -~]{0,8}"]) {
        let specs = foreign_specs();
        match plan(&s, &id, &inventory(), &c, &specs) {
            Ok(p) => {
                check_invariants(&p)?;
                // Deterministic.
                prop_assert_eq!(plan(&s, &id, &inventory(), &c, &specs).unwrap(), p);
            }
            Err(e) => {
                let line = e.to_string();
                prop_assert!(!line.contains('\n'), "{line}");
                prop_assert!(line.len() < 2000, "{} bytes", line.len());
            }
        }
    }

    #[test]
    fn valid_gpufence_allocations_grant_exactly_their_devices(
        devs in prop::sample::subsequence(vec!["0", "1", "2:0", "2:1", "3"], 1..=5),
        mem_gib in 1u64..=10,
        cores in 1u8..=100,
    ) {
        let list = devs.join(",");
        let mem = format!("{mem_gib}Gi");
        let cores = cores.to_string();
        let with_cores = spec(&[("gpufence.dev/devices", &list), ("gpufence.dev/memory", &mem), ("gpufence.dev/cores", &cores)], &["NVIDIA_VISIBLE_DEVICES=all"]);
        let mig = devs.iter().any(|d| d.contains(':'));
        let r = plan(&with_cores, "v", &inventory(), &config(), &[]);
        if mig {
            // a compute share on a MIG device is refused, naming the cores annotation
            let e = r.unwrap_err().to_string();
            prop_assert!(e.starts_with("gpufence.dev/cores=") && e.contains("MIG"), "{}", e);
        } else {
            check_invariants(&r.unwrap())?;
        }
        let s = spec(&[("gpufence.dev/devices", &list), ("gpufence.dev/memory", &mem)], &["NVIDIA_VISIBLE_DEVICES=all"]);
        let p = plan(&s, "v", &inventory(), &config(), &[]).unwrap();
        check_invariants(&p)?;
        let a = p.allocation.as_ref().unwrap();
        prop_assert_eq!(a.devices.len(), devs.len());
        for d in &a.devices {
            prop_assert_eq!(d.memory_limit, Some(mem_gib * GIB));
        }
        // Untrusted NVIDIA_VISIBLE_DEVICES=all did not widen anything.
        let gpu_nodes = p.edits.device_nodes.iter().filter(|n| n.path.strip_prefix("/dev/nvidia").is_some_and(|s| s.parse::<u32>().is_ok())).count();
        let parents: BTreeSet<&str> = devs.iter().map(|d| d.split(':').next().unwrap()).collect();
        prop_assert_eq!(gpu_nodes, parents.len());
    }

}

proptest! {
    #![proptest_config(cases(24))]

    #[test]
    fn huge_and_binary_values_fail_fast(n in 1usize..(1 << 20), b in any::<u8>()) {
        let v = String::from_utf8_lossy(&vec![b; n]).into_owned();
        let s = spec(&[("gpufence.dev/devices", &v), ("cdi.k8s.io/x", &v)], &[]);
        let t = std::time::Instant::now();
        let r = plan(&s, "h", &inventory(), &config(), &[]);
        prop_assert!(t.elapsed().as_millis() < 1000);
        if let Err(e) = r {
            prop_assert!(e.to_string().len() < 2000);
        }
    }
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn quantity_parsers_never_panic(s in value()) {
        let _ = gpufence::quantity::parse_k8s_bytes(&s);
        let _ = gpufence::quantity::parse_hami_bytes(&s);
    }

    #[test]
    fn k8s_quantity_round_trips(n in any::<u64>()) {
        prop_assert_eq!(gpufence::quantity::parse_k8s_bytes(&n.to_string()), Ok(n));
        let f = gpufence::quantity::format_bytes(n);
        prop_assert_eq!(gpufence::quantity::parse_k8s_bytes(&f), Ok(n));
    }

    #[test]
    fn hami_quantity_matches_suffix(n in 0u64..(1 << 30), sfx in prop::sample::select(vec![("", 0u32), ("k", 10), ("M", 20), ("g", 30)])) {
        let want = n.checked_mul(1 << sfx.1);
        prop_assert_eq!(gpufence::quantity::parse_hami_bytes(&format!("{n}{}", sfx.0)).ok(), want);
    }

    #[test]
    fn cdi_names_never_panic_and_round_trip(s in prop_oneof!["[a-z][a-z0-9._-]{0,8}/[a-z][a-z0-9._-]{0,8}=[a-zA-Z0-9][a-zA-Z0-9:._-]{0,8}", any::<String>(), value()]) {
        if let Ok(q) = gpufence::cdi::parse::parse_qualified_name(&s) {
            prop_assert_eq!(q.to_string(), s.clone());
            prop_assert!(gpufence::cdi::parse::parse_qualified_name(&q.to_string()).is_ok());
        }
        let _ = gpufence::cdi::parse::validate_annotation_key(&format!("cdi.k8s.io/{s}"));
        let _ = gpufence::cdi::parse::parse_annotation_value(&s);
        let _ = gpufence::cdi::parse::parse_kind(&s);
    }
}

const SPEC_YAML: &str = "cdiVersion: \"0.7.0\"\nkind: vendor.com/nic\nannotations:\n  a: b\ndevices:\n- name: nic0\n  containerEdits:\n    deviceNodes:\n    - path: /dev/vnic0\n      hostPath: /dev/vnic0\n      type: c\n      major: 240\n      minor: 0\n      permissions: rw\n    env: [A=1]\n    mounts:\n    - {hostPath: /a, containerPath: /b, type: bind, options: [ro]}\n    hooks:\n    - {hookName: createContainer, path: /bin/true, args: [x], timeout: 5}\ncontainerEdits:\n  additionalGids: [1]\n  intelRdt: {closID: x}\n";

proptest! {
    #![proptest_config(cases(600))]

    /// Mutated spec files (byte flips, truncation, insertions) never panic the loader, and
    /// whatever it accepts passes validation and the version check.
    #[test]
    fn spec_files_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 0..6),
        json in any::<bool>(),
    ) {
        let base: String = if json {
            let v: serde_json::Value = yaml_to_json(SPEC_YAML);
            serde_json::to_string(&v).unwrap()
        } else {
            SPEC_YAML.to_string()
        };
        let mut bytes = base.into_bytes();
        for (idx, b, op) in edits {
            if bytes.is_empty() { break; }
            let i = idx.index(bytes.len());
            match op {
                0 => bytes[i] = b,
                1 => bytes.truncate(i),
                _ => bytes.insert(i, b),
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        let path = std::path::Path::new(if json { "f.json" } else { "f.yaml" });
        if let Ok(spec) = gpufence::cdi::parse::parse_spec(&text, path) {
            prop_assert!(gpufence::cdi::parse::validate_spec(&spec).is_ok());
        }
    }
}

fn yaml_to_json(y: &str) -> serde_json::Value {
    let s: gpufence::cdi::Spec =
        gpufence::cdi::parse::parse_spec(y, std::path::Path::new("x.yaml")).unwrap();
    serde_json::to_value(&s).unwrap()
}

#[test]
fn the_sample_spec_is_valid() {
    let s = gpufence::cdi::parse::parse_spec(SPEC_YAML, std::path::Path::new("x.yaml")).unwrap();
    assert_eq!(gpufence::cdi::parse::minimum_version(&s), "0.7.0");
}

#[test]
fn a_megabyte_of_commas_fails_fast() {
    let v = ",".repeat(1 << 20);
    for key in [
        "gpufence.dev/devices",
        "cdi.k8s.io/x",
        "gpufence.dev/memory",
    ] {
        let mut ann = vec![(key, v.as_str())];
        if key == "gpufence.dev/memory" {
            ann.push(("gpufence.dev/devices", "0"));
        }
        let s = spec(&ann, &[]);
        let t = std::time::Instant::now();
        let e = plan(&s, "h", &inventory(), &config(), &[]).unwrap_err();
        let took = t.elapsed();
        eprintln!("took {took:?}: {e}");
        assert_eq!(e.key, key);
        assert!(took.as_millis() < 500, "{took:?}");
    }
}

/// The random inputs above reach every outcome (so the properties are not vacuous): plans with
/// gpufence devices, foreign-only plans, no allocation, and errors.
#[test]
fn fuzz_inputs_reach_every_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config as RunnerConfig, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        RunnerConfig::default(),
        proptest::test_runner::TestRng::deterministic_rng(RunnerConfig::default().rng_algorithm),
    );
    let strat = (input(), config_strategy());
    let specs = foreign_specs();
    let (mut devices, mut foreign_only, mut nothing, mut errors) = (0, 0, 0, 0);
    for _ in 0..1500 {
        let (s, c) = strat.new_tree(&mut runner).unwrap().current();
        match plan(&s, "ctr", &inventory(), &c, &specs) {
            Ok(p) => match &p.allocation {
                Some(a) if !a.devices.is_empty() => devices += 1,
                Some(_) => foreign_only += 1,
                None => nothing += 1,
            },
            Err(_) => errors += 1,
        }
    }
    eprintln!("devices {devices}, foreign only {foreign_only}, nothing {nothing}, errors {errors}");
    assert!(devices >= 15, "devices {devices}");
    assert!(foreign_only >= 1, "foreign only {foreign_only}");
    assert!(nothing >= 100, "nothing {nothing}");
    assert!(errors >= 100, "errors {errors}");
}
