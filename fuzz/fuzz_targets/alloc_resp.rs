//! The protobuf `ContainerAllocateResponse` of kubelet's checkpoint (`AllocResp`), decoded with
//! the prost types generated from the device plugin API: no panic; what decodes re-encodes to
//! bytes that decode to the same value; sealed into a checkpoint it yields exactly its env.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message as _;

use gpufence::kubelet::{self, KubeletSource, PodIdentity, proto::ContainerAllocateResponse};

fuzz_target!(|data: &[u8]| {
    let Ok(resp) = ContainerAllocateResponse::decode(data) else {
        return;
    };
    let again = ContainerAllocateResponse::decode(resp.encode_to_vec().as_slice()).unwrap();
    assert_eq!(again, resp);
    let json = kubelet::checkpoint_json(vec![kubelet::entry(
        "u",
        "c",
        "nvidia.com/gpu",
        &["d"],
        data.to_vec(),
    )]);
    let id = PodIdentity {
        pod_uid: "u".into(),
        container_name: "c".into(),
        pod: None,
    };
    match kubelet::from_checkpoint_bytes(json.as_bytes(), &id, "/cp") {
        KubeletSource::Record(r) => assert_eq!(r.resources[0].envs, resp.envs),
        other => panic!("a sealed checkpoint with a decodable AllocResp: {other:?}"),
    }
});
