//! kubelet's device-manager checkpoint (a host file gpufence trusts for env-borne allocations):
//! strict parse + checksum, then the allocation it leads to for a HAMi container whose
//! config.json asks for more than any record gives.
//! Invariants: no panic; an accepted checkpoint re-serialises to one that parses to the same
//! value; a grant never exceeds what the checkpoint records for this very container, nor the
//! time-slicing replica share it records (`<id>::<k>` ids).
#![no_main]

use libfuzzer_sys::fuzz_target;

use gpufence::kubelet::{self, KubeletSource, PodIdentity, checkpoint::Checkpoint};

#[path = "../common/plan_check.rs"]
mod plan_check;

fuzz_target!(|data: &[u8]| {
    if let Ok(cp) = Checkpoint::parse(data) {
        let again = Checkpoint::parse(cp.to_json().as_bytes()).expect("re-serialised checkpoint");
        assert_eq!(again, cp);
    }
    let id = PodIdentity {
        pod_uid: "u".into(),
        container_name: "c".into(),
        pod: None,
    };
    let source = kubelet::from_checkpoint_bytes(data, &id, "/cp");
    let inv = plan_check::inventory();
    let specs = plan_check::foreign_specs();
    let spec = serde_json::json!({
        "process": {"env": [
            "NVIDIA_VISIBLE_DEVICES=all",
            format!("NVIDIA_VISIBLE_DEVICES={}", inv.gpus[1].uuid),
            "CUDA_DEVICE_MEMORY_LIMIT_0=1m",
            "ALIYUN_COM_GPU_MEM_IDX=0",
        ]},
        "annotations": {
            "io.kubernetes.cri.sandbox-uid": "u",
            "io.kubernetes.cri.container-name": "c",
        },
    });
    let config = plan_check::config(0, 0);
    let mut config = config;
    config.allocation.trust_env = gpufence::config::TrustEnv::default();
    match gpufence::plan::plan_with(&spec, "ctr-1", &inv, &config, &specs, &source) {
        Ok(p) => {
            plan_check::check(&p, &inv);
            if let Some(a) = &p.allocation {
                let KubeletSource::Record(r) = &source else {
                    panic!("granted {a:?} without a record");
                };
                assert_eq!(r.identity, id);
                let env = r.env().expect("record env");
                let recorded: Vec<&str> = env
                    .iter()
                    .filter(|(k, _)| {
                        **k == "NVIDIA_VISIBLE_DEVICES" || **k == "ALIYUN_COM_GPU_MEM_IDX"
                    })
                    .map(|(_, (v, _))| *v)
                    .collect();
                assert!(
                    !recorded.is_empty(),
                    "granted {a:?} without recorded GPU env"
                );
                for d in &a.devices {
                    let Some(s) = &d.replica else { continue };
                    assert!(s.held <= s.of, "{s:?}");
                    if s.held < s.of {
                        assert!(d.memory_limit.is_some_and(|m| m <= s.memory), "{d:?}");
                    }
                }
            }
        }
        Err(e) => {
            let line = e.to_string();
            assert!(!line.contains('\n'), "multi-line error: {line}");
        }
    }
});
