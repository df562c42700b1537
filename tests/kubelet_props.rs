//! Property tests of kubelet's checkpoint as an input (bounded; `GPUFENCE_FUZZ_CASES` raises the
//! number of cases):
//! * a checkpoint sealed as kubelet seals it parses back to the same value, whatever its entries;
//! * changing any one byte of it never yields a different accepted checkpoint (the checksum or
//!   the strict parser refuses it);
//! * arbitrary bytes never panic the parser or the protobuf decoder;
//! * whatever the checkpoint and the container's env, a container is granted GPUs from env only
//!   where kubelet recorded a device plugin's env for that very container, and only those.

mod alloc_support;
mod prop_support;

use alloc_support::*;
use gpufence::kubelet::{
    self, KubeletSource, PodIdentity,
    checkpoint::{Checkpoint, Entry},
};
use prop_support::cases;
use proptest::prelude::*;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9-]{0,12}",
        Just("u".to_string()),
        Just("c".to_string()),
        "\\PC{0,6}",
    ]
}

fn list() -> impl Strategy<Value = Option<Vec<String>>> {
    prop::option::of(prop::collection::vec(text(), 0..3))
}

fn env_value() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u32..4).prop_map(uuid),
        Just("all".to_string()),
        (0u32..4).prop_map(|i| i.to_string()),
        Just("3000m".to_string()),
        Just("30".to_string()),
    ]
}

fn env_key() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "CUDA_DEVICE_SM_LIMIT",
        "ALIYUN_COM_GPU_MEM_IDX",
        "ALIYUN_COM_GPU_MEM_CONTAINER",
        "OTHER",
    ])
    .prop_map(str::to_string)
}

fn alloc_resp() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        prop::collection::vec((env_key(), env_value()), 0..4).prop_map(|kv| {
            let kv: Vec<(&str, &str)> = kv.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            Some(kubelet::encode_alloc_resp(&kv, &[]))
        }),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..12)),
    ]
}

fn entry() -> impl Strategy<Value = Entry> {
    (
        text(),
        text(),
        prop::sample::select(vec!["nvidia.com/gpu", "aliyun.com/gpu-mem", "x/y"]),
        prop::option::of(prop::collection::vec((-2i64..3, list()), 0..3)),
        alloc_resp(),
    )
        .prop_map(
            |(pod_uid, container_name, r, device_ids, alloc_resp)| Entry {
                pod_uid,
                container_name,
                resource_name: r.to_string(),
                device_ids: device_ids.map(|mut m| {
                    m.sort_by_key(|(k, _)| *k);
                    m.dedup_by_key(|(k, _)| *k);
                    m
                }),
                alloc_resp,
            },
        )
}

fn checkpoint() -> impl Strategy<Value = Checkpoint> {
    (
        prop::option::of(prop::collection::vec(entry(), 0..4)),
        prop::option::of(prop::collection::vec((text(), list()), 0..3)),
    )
        .prop_map(|(entries, registered)| {
            Checkpoint {
                entries,
                registered: registered.map(|mut r| {
                    r.sort_by(|a, b| a.0.cmp(&b.0));
                    r.dedup_by(|a, b| a.0 == b.0);
                    r
                }),
                checksum: 0,
            }
            .seal()
        })
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn sealed_checkpoints_round_trip(cp in checkpoint()) {
        let json = cp.to_json();
        prop_assert_eq!(Checkpoint::parse(json.as_bytes()), Ok(cp));
    }

    #[test]
    fn one_changed_byte_is_never_another_accepted_checkpoint(
        cp in checkpoint(), at in any::<prop::sample::Index>(), b in any::<u8>()
    ) {
        let mut bytes = cp.to_json().into_bytes();
        let i = at.index(bytes.len());
        prop_assume!(bytes[i] != b);
        bytes[i] = b;
        if let Ok(other) = Checkpoint::parse(&bytes) {
            prop_assert_eq!(other, cp);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = Checkpoint::parse(&data);
        let id = PodIdentity { pod_uid: "u".into(), container_name: "c".into(), pod: None };
        let _ = kubelet::from_checkpoint_bytes(&data, &id, "/cp");
        use prost::Message as _;
        let _ = kubelet::proto::ContainerAllocateResponse::decode(data.as_slice());
    }

    #[test]
    fn env_grants_only_what_kubelet_recorded_for_this_container(
        cp in checkpoint(),
        env in prop::collection::vec((env_key(), env_value()), 0..5),
    ) {
        let id = PodIdentity { pod_uid: "u".into(), container_name: "c".into(), pod: None };
        let source = kubelet::from_checkpoint_bytes(cp.to_json().as_bytes(), &id, "/cp");
        let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let env: Vec<&str> = env.iter().map(String::as_str).collect();
        let s = spec(
            &[("io.kubernetes.cri.sandbox-uid", "u"), ("io.kubernetes.cri.container-name", "c")],
            &env,
        );
        let inv = inventory();
        if let Ok(p) = gpufence::plan::plan_with(&s, "ctr-1", &inv, &config(), &[], &source) {
            check_plan(&p, &inv);
            if let Some(a) = &p.allocation {
                let KubeletSource::Record(r) = &source else {
                    return Err(TestCaseError::fail(format!("granted without a record: {a:?}")));
                };
                let recorded = r.env().unwrap();
                for d in &a.devices {
                    let named = recorded.iter().any(|(k, (v, _))| {
                        (*k == "NVIDIA_VISIBLE_DEVICES"
                            && v.split(',').any(|t| t == "all" || t == d.uuid || inv.gpus.iter().any(|g| g.uuid == d.uuid && t == g.index.to_string())))
                            || (*k == "ALIYUN_COM_GPU_MEM_IDX"
                                && inv.gpus.iter().any(|g| g.uuid == d.uuid && v.split(',').any(|t| t == g.index.to_string())))
                    });
                    prop_assert!(named, "{} granted, recorded {:?}", d.uuid, recorded);
                }
            }
        }
    }
}
