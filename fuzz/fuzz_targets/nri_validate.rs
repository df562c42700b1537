//! What the runtime sends `gpufence nri` to validate (NRI's ValidateContainerAdjustment: the
//! container, every plugin's adjustment merged, the owners' records, the plugins consulted),
//! decoded and judged as the plugin does (`nri::validate` against the node's facts, with no CDI
//! directory so nothing is read from disk): no panic, the verdict one line, and a GPU node
//! another plugin adds never passes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message as _;

use gpufence::inventory::{DeviceNode, Gpu, Inventory};
use gpufence::nri::api::{self, ValidateContainerAdjustmentRequest};
use gpufence::nri::facts::NodeFacts;
use gpufence::nri::validate::{self, Decided};

const ME: &str = "90-gpufence";

fn inventory() -> Inventory {
    let node = |p: &str, minor| DeviceNode {
        path: p.to_string(),
        host_path: p.into(),
        kind: 'c',
        major: 195,
        minor,
    };
    let gpu = |i: u32| Gpu {
        index: i,
        minor: i,
        uuid: gpufence::sim::gpu_uuid(i),
        name: "sim".into(),
        memory_bytes: 1 << 34,
        pci_bus_id: gpufence::sim::pci_bus_id(i),
        compute_capability: (9, 0),
        mig_enabled: false,
        mig_capable: false,
        mig_devices: vec![],
        node: node(&format!("/dev/nvidia{i}"), i),
    };
    Inventory {
        driver_version: "580.65.06".into(),
        cuda_driver_version: 12080,
        gpus: vec![gpu(0), gpu(1)],
        control_nodes: vec![node("/dev/nvidiactl", 255)],
        driver_files: vec![],
        memory_limits: Default::default(),
    }
}

/// No grant, or GPU 1 with its node, rule and quota variable.
fn decided(granted: bool) -> Decided {
    if !granted {
        return Decided::default();
    }
    let answer = api::ContainerAdjustment {
        env: vec![api::KeyValue {
            key: "GPUFENCE_MEMORY_LIMIT_0".into(),
            value: "1073741824".into(),
        }],
        linux: Some(api::LinuxContainerAdjustment {
            devices: vec![api::LinuxDevice {
                path: "/dev/nvidia1".into(),
                r#type: "c".into(),
                major: 195,
                minor: 1,
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    Decided {
        env: [(
            "NVIDIA_VISIBLE_DEVICES".to_string(),
            gpufence::sim::gpu_uuid(1),
        )]
        .into_iter()
        .collect(),
        devices: vec![gpufence::sim::gpu_uuid(1)],
        answer,
        allocation: None,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, payload)) = data.split_first() else {
        return;
    };
    let Ok(mut req) = ValidateContainerAdjustmentRequest::decode(payload) else {
        return;
    };
    let mut facts = NodeFacts::new(
        &gpufence::config::Config::default(),
        vec![195, 511],
        Some(inventory()),
    );
    facts.cdi_dirs.clear();
    let d = decided(mode & 1 == 1);
    if let Err(e) = validate::validate(&req, ME, Some(&d), &facts) {
        assert!(!e.to_string().contains('\n'), "{e}");
    }
    // Another plugin's GPU node on top: always refused.
    let id = req
        .container
        .as_ref()
        .map(|c| c.id.clone())
        .unwrap_or_default();
    req.adjust
        .get_or_insert_with(Default::default)
        .linux
        .get_or_insert_with(Default::default)
        .devices
        .push(api::LinuxDevice {
            path: "/dev/nvidia0".into(),
            r#type: "c".into(),
            major: 195,
            minor: 0,
            ..Default::default()
        });
    if let Some(o) = req.owners.as_mut() {
        o.owners
            .entry(id)
            .or_default()
            .compound
            .entry(api::Field::Devices as i32)
            .or_default()
            .owners
            .insert("/dev/nvidia0".into(), "10-injector".into());
    }
    assert!(validate::validate(&req, ME, Some(&d), &facts).is_err());
});
