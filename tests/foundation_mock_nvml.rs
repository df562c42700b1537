//! The mock NVML through nvml-wrapper (the consumer gpufence uses): NVML's error codes for bad
//! indices, GPUs without MIG and unpopulated MIG slots, the visibility rule (a GPU whose device
//! node is missing is not enumerated), and init failing on a node file that does not parse.
//! One test function: `GPUFENCE_MOCK_NODE` is process-wide. Needs root (mknod).

mod common;

use std::ffi::OsStr;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

#[test]
fn mock_nvml_behaves_like_nvml() {
    if common::skip_unless(&[]) {
        return;
    }
    let dir = common::scratch("mocknvml");
    std::fs::create_dir_all(dir.join("dev")).unwrap();
    for i in 0..3u64 {
        nix::sys::stat::mknod(
            &dir.join(format!("dev/nvidia{i}")),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(195, i),
        )
        .unwrap();
    }
    let node = serde_json::json!({
        "driver_version": "580.65.06", "cuda_driver_version": 12080,
        "dev_root": dir.display().to_string(),
        "gpus": [
            {"uuid": "GPU-a", "name": "NVIDIA A10", "memory_mib": 22731, "minor": 0,
             "pci_bus_id": "00000000:17:00.0", "compute_capability": [8, 6], "mig": []},
            {"uuid": "GPU-b", "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "minor": 1,
             "pci_bus_id": "00000000:2a:00.0", "compute_capability": [9, 0],
             "mig": [{"uuid": "MIG-b0", "gi": 7, "ci": 0, "profile": "1g.10gb", "memory_mib": 9984},
                     {"uuid": "MIG-b1", "gi": 8, "ci": 0, "profile": "1g.10gb", "memory_mib": 9984}]},
            {"uuid": "GPU-c", "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "minor": 2,
             "pci_bus_id": "00000000:3a:00.0", "compute_capability": [9, 0], "mig": [],
             "mig_mode": "disabled"}
        ]
    });
    let node_file = dir.join("node.json");
    std::fs::write(&node_file, node.to_string()).unwrap();
    // SAFETY: single-threaded at this point of this test binary (one test function).
    unsafe { std::env::set_var("GPUFENCE_MOCK_NODE", &node_file) };
    let lib = common::cdylib("libgpufence_mock_nvml.so");

    {
        let nvml = Nvml::builder().lib_path(OsStr::new(&lib)).init().unwrap();
        assert_eq!(nvml.sys_driver_version().unwrap(), "580.65.06");
        assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12080);
        assert_eq!(nvml.device_count().unwrap(), 3);
        assert!(matches!(
            nvml.device_by_index(3),
            Err(NvmlError::InvalidArg)
        ));
        let a = nvml.device_by_index(0).unwrap();
        assert_eq!(a.name().unwrap(), "NVIDIA A10");
        assert_eq!(a.memory_info().unwrap().total, 22731 << 20);
        assert_eq!(a.pci_info().unwrap().bus_id, "00000000:17:00.0");
        let cc = a.cuda_compute_capability().unwrap();
        assert_eq!((cc.major, cc.minor), (8, 6));
        assert!(
            matches!(a.mig_mode(), Err(NvmlError::NotSupported)),
            "GPU without MIG"
        );
        assert!(matches!(a.mig_device_count(), Err(NvmlError::NotSupported)));
        let c = nvml.device_by_index(2).unwrap();
        assert_eq!(c.mig_mode().unwrap().current, 0);
        let b = nvml.device_by_uuid("GPU-b").unwrap();
        assert_eq!(b.index().unwrap(), 1);
        assert_eq!(b.mig_mode().unwrap().current, 1);
        assert_eq!(b.mig_device_count().unwrap(), 7);
        let m = b.mig_device_by_index(1).unwrap();
        assert_eq!(m.uuid().unwrap(), "MIG-b1");
        assert_eq!(m.name().unwrap(), "NVIDIA H100 80GB HBM3 MIG 1g.10gb");
        assert_eq!(m.memory_info().unwrap().total, 9984 << 20);
        assert!(m.mig_is_mig_device_handle().unwrap());
        assert_eq!(m.mig_parent_device().unwrap().uuid().unwrap(), "GPU-b");
        assert!(
            matches!(b.mig_device_by_index(2), Err(NvmlError::NotFound)),
            "empty slot"
        );
        assert!(
            matches!(b.mig_device_by_index(7), Err(NvmlError::InvalidArg)),
            "beyond max"
        );
        assert_eq!(
            nvml.device_by_pci_bus_id("0000:3A:00.0")
                .unwrap()
                .uuid()
                .unwrap(),
            "GPU-c"
        );
        assert!(matches!(
            nvml.device_by_uuid("GPU-zzz"),
            Err(NvmlError::NotFound)
        ));
    } // drop → nvmlShutdown

    // Visibility: a GPU whose node is gone is not enumerated, and indices close up.
    std::fs::remove_file(dir.join("dev/nvidia0")).unwrap();
    {
        let nvml = Nvml::builder().lib_path(OsStr::new(&lib)).init().unwrap();
        assert_eq!(nvml.device_count().unwrap(), 2);
        assert_eq!(nvml.device_by_index(0).unwrap().uuid().unwrap(), "GPU-b");
    }

    // A node file that does not parse: init fails with an NVML error, no panic.
    std::fs::write(&node_file, "{\"gpus\": 1}").unwrap();
    match Nvml::builder().lib_path(OsStr::new(&lib)).init() {
        Err(NvmlError::Unknown) => {}
        other => panic!("expected NVML_ERROR_UNKNOWN, got {:?}", other.map(|_| ())),
    }
}
