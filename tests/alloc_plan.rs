//! The plan's shape: device nodes, cgroup rules, mounts in order, env, hooks, quota, host files,
//! foreign CDI edits; and determinism.

mod alloc_support;

use alloc_support::*;
use gpufence::config::{Dialect, ShimInject};
use gpufence::plan::{CONTAINER_SHIM_PATH, plan};
use gpufence::quota::Quota;

#[test]
fn full_plan_for_two_gpus() {
    let s = spec(
        &[
            ("gpufence.dev/devices", "1,0"),
            ("gpufence.dev/memory", "4Gi,2Gi"),
            ("gpufence.dev/cores", "50"),
            ("gpufence.dev/oversubscribe", "true"),
        ],
        &["PATH=/bin"],
    );
    let p = plan(&s, "ctr-a", &inventory(), &config(), &[]).unwrap();
    let paths: Vec<&str> = p
        .edits
        .device_nodes
        .iter()
        .map(|d| d.path.as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "/dev/nvidia1",
            "/dev/nvidia0",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidiactl"
        ]
    );
    let n0 = &p.edits.device_nodes[0];
    assert_eq!(
        (n0.major, n0.minor, n0.kind.as_deref()),
        (Some(195), Some(1), Some("c"))
    );
    assert_eq!(n0.host_path.as_deref(), Some("/sim/dev/nvidia1"));
    let rules: Vec<String> = p.cgroup_rules.iter().map(|r| r.to_string()).collect();
    assert_eq!(
        rules,
        [
            "c 195:1 rw",
            "c 195:0 rw",
            "c 510:0 rw",
            "c 510:1 rw",
            "c 195:255 rw"
        ]
    );

    let mounts: Vec<(&str, &str)> = p
        .edits
        .mounts
        .iter()
        .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
        .collect();
    // Everything else first, then what enforces the quota (so no other mount, redirected by an
    // image symlink, can land on it); parent-first by depth within each group (equal depths keep
    // the plan's order): a directory mount never hides one below it.
    assert_eq!(
        mounts,
        [
            ("/sim/driver/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"),
            (
                "/sim/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06"
            ),
            (
                "/sim/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.65.06",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.65.06"
            ),
            (
                "/sim/driver/lib/firmware/nvidia/580.65.06/gsp_ga10x.bin",
                "/lib/firmware/nvidia/580.65.06/gsp_ga10x.bin"
            ),
            ("/run/gpufence/ld.so.preload", "/etc/ld.so.preload"),
            ("tmpfs", "/run/gpufence"),
            ("/run/gpufence/ctr-a/quota", "/run/gpufence/quota"),
            (
                "/usr/lib/gpufence/libgpufence.so",
                "/usr/lib/gpufence/libgpufence.so"
            ),
        ]
    );
    let opts = |c: &str| {
        p.edits
            .mounts
            .iter()
            .find(|m| m.container_path == c)
            .unwrap()
            .options
            .clone()
    };
    assert_eq!(
        opts("/usr/bin/nvidia-smi"),
        ["ro", "nosuid", "nodev", "bind"]
    );
    assert_eq!(opts(CONTAINER_SHIM_PATH), ["ro", "nosuid", "nodev", "bind"]);
    // The container's own bounded tmpfs, never the host's state directory.
    let state = p
        .edits
        .mounts
        .iter()
        .find(|m| m.container_path == "/run/gpufence")
        .unwrap();
    assert_eq!(state.kind.as_deref(), Some("tmpfs"));
    assert_eq!(
        state.options,
        [
            "nosuid",
            "nodev",
            "noexec",
            "mode=1777",
            "size=1m",
            "nr_inodes=3"
        ]
    );
    assert_eq!(
        opts("/run/gpufence/quota"),
        ["ro", "nosuid", "nodev", "noexec", "bind"]
    );

    // The ld cache refresh is a typed part of the plan, not a hook among the edits: each
    // applier renders it its own way.
    assert!(p.edits.hooks.is_empty(), "{:?}", p.edits.hooks);
    assert_eq!(
        p.ld_cache.as_ref().unwrap().folders,
        ["/usr/lib/x86_64-linux-gnu"]
    );

    assert_eq!(
        p.edits.env,
        [
            format!("NVIDIA_VISIBLE_DEVICES={},{}", uuid(1), uuid(0)),
            "GPUFENCE_STATE=/run/gpufence".to_string(),
            format!("GPUFENCE_MEMORY_LIMIT_0={}", 4 * GIB),
            "GPUFENCE_CORES_0=50".to_string(),
            format!("GPUFENCE_MEMORY_LIMIT_1={}", 2 * GIB),
            "GPUFENCE_CORES_1=50".to_string(),
            "GPUFENCE_CORES_POLICY=hard".to_string(),
            "GPUFENCE_OVERSUBSCRIBE=1".to_string(),
        ]
    );
    let q = p.quota.as_ref().unwrap();
    assert!(q.oversubscribe);
    assert_eq!(q.devices.len(), 2);
    assert_eq!(
        (
            q.devices[0].ordinal,
            q.devices[0].uuid.as_str(),
            q.devices[0].memory
        ),
        (0, uuid(1).as_str(), Some(4 * GIB))
    );
    assert_eq!(p.state_dir.as_deref(), Some("/run/gpufence/ctr-a"));
    assert_eq!(p.host_files.len(), 2);
    assert_eq!(p.host_files[0].path, "/run/gpufence/ctr-a/quota");
    assert_eq!(p.host_files[0].mode, 0o444);
    assert_eq!(Quota::parse(&p.host_files[0].contents).unwrap(), *q);
    assert_eq!(p.host_files[1].path, "/run/gpufence/ld.so.preload");
    assert_eq!(p.host_files[1].contents, format!("{CONTAINER_SHIM_PATH}\n"));
    assert!(p.env_overrides.is_empty());
}

#[test]
fn mig_device_gets_parent_and_caps() {
    let s = spec(
        &[
            ("gpufence.dev/devices", "2:1,2:0"),
            ("gpufence.dev/memory", "5Gi"),
        ],
        &[],
    );
    let p = plan(&s, "m", &inventory(), &config(), &[]).unwrap();
    let paths: Vec<&str> = p
        .edits
        .device_nodes
        .iter()
        .map(|d| d.path.as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "/dev/nvidia2",
            "/dev/nvidia-caps/nvidia-cap110",
            "/dev/nvidia-caps/nvidia-cap111",
            "/dev/nvidia-caps/nvidia-cap100",
            "/dev/nvidia-caps/nvidia-cap101",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidiactl"
        ]
    );
    assert_eq!(p.cgroup_rules.len(), paths.len());
    let q = p.quota.unwrap();
    assert_eq!(q.devices[0].uuid, mig_uuid(2, 1));
    assert_eq!(q.devices[1].uuid, mig_uuid(2, 0));
}

#[test]
fn graphics_brings_modeset() {
    let s = spec(
        &[
            ("gpufence.dev/devices", "0"),
            ("gpufence.dev/capabilities", "graphics,compute"),
        ],
        &[],
    );
    let p = plan(&s, "g", &inventory(), &config(), &[]).unwrap();
    assert!(
        p.edits
            .device_nodes
            .iter()
            .any(|d| d.path == "/dev/nvidia-modeset")
    );
    let s = spec(&[("gpufence.dev/devices", "0")], &[]);
    let p = plan(&s, "g", &inventory(), &config(), &[]).unwrap();
    assert!(
        !p.edits
            .device_nodes
            .iter()
            .any(|d| d.path == "/dev/nvidia-modeset")
    );
    assert_eq!(
        p.allocation.unwrap().capabilities,
        gpufence::allocation::DEFAULT_CAPABILITIES.to_vec()
    );
}

#[test]
fn env_injection_and_hami_core_compat() {
    let mut c = config();
    c.shim.inject = ShimInject::Env;
    c.shim.library = "/usr/local/vgpu/libvgpu.so".into();
    let s = spec(
        &[
            ("gpufence.dev/devices", "0,1"),
            ("gpufence.dev/memory", "4Gi,1000"),
            ("gpufence.dev/cores", "25"),
        ],
        &["LD_PRELOAD=/opt/libfoo.so"],
    );
    let p = plan(&s, "h", &inventory(), &c, &[]).unwrap();
    assert!(
        !p.edits
            .mounts
            .iter()
            .any(|m| m.container_path == "/etc/ld.so.preload")
    );
    assert_eq!(
        p.host_files.len(),
        1,
        "no ld.so.preload file with env injection"
    );
    assert!(
        p.edits
            .mounts
            .iter()
            .any(|m| m.host_path == "/usr/local/vgpu/libvgpu.so"
                && m.container_path == CONTAINER_SHIM_PATH)
    );
    let env = &p.edits.env;
    assert!(
        env.contains(&format!("LD_PRELOAD={CONTAINER_SHIM_PATH}:/opt/libfoo.so")),
        "{env:?}"
    );
    assert!(env.contains(&"CUDA_DEVICE_MEMORY_LIMIT_0=4096m".to_string()));
    assert!(env.contains(&"CUDA_DEVICE_MEMORY_LIMIT_1=1000".to_string()));
    assert!(env.contains(&"CUDA_DEVICE_SM_LIMIT=25".to_string()));
    assert!(env.contains(&"CUDA_DEVICE_SM_LIMIT_1=25".to_string()));
    assert!(env.contains(&"CUDA_DEVICE_MEMORY_SHARED_CACHE=/run/gpufence/vgpu.cache".to_string()));
}

const FOREIGN: &str = r#"
cdiVersion: "0.5.0"
kind: vendor.com/nic
devices:
- name: nic0
  containerEdits:
    deviceNodes:
    - path: /dev/vnic0
      hostPath: /dev/vnic0
      type: c
      major: 240
      minor: 7
      permissions: rw
    env: [VNIC=0]
containerEdits:
  mounts:
  - hostPath: /opt/vnic/lib
    containerPath: /opt/vnic/lib
    options: [ro, bind]
  hooks:
  - hookName: createContainer
    path: /usr/bin/vnic-hook
"#;

#[test]
fn foreign_cdi_devices_are_applied_faithfully() {
    let specs = vec![
        foreign_spec(
            "/etc/cdi/vnic.yaml",
            0,
            &FOREIGN.replace("minor: 7", "minor: 1"),
        ),
        foreign_spec("/var/run/cdi/vnic.yaml", 1, FOREIGN),
    ];
    // Foreign only: its edits, no GPU, no shim, no quota.
    let s = spec(&[("cdi.k8s.io/vnic", "vendor.com/nic=nic0")], &[]);
    let p = plan(&s, "f", &inventory(), &config(), &specs).unwrap();
    let a = p.allocation.as_ref().unwrap();
    assert!(a.devices.is_empty());
    assert_eq!(
        a.foreign_cdi[0].spec_path, "/var/run/cdi/vnic.yaml",
        "the dynamic dir wins"
    );
    assert_eq!(p.edits.device_nodes.len(), 1);
    assert_eq!(p.cgroup_rules[0].to_string(), "c 240:7 rw");
    assert_eq!(p.edits.env, ["VNIC=0"]);
    assert_eq!(p.edits.mounts[0].container_path, "/opt/vnic/lib");
    assert_eq!(p.edits.hooks[0].path, "/usr/bin/vnic-hook");
    assert!(p.quota.is_none() && p.host_files.is_empty() && p.state_dir.is_none());

    // Together with a GPU: ours and theirs, parent-first.
    let s = spec(
        &[("cdi.k8s.io/vnic", "vendor.com/nic=nic0,gpufence.dev/gpu=0")],
        &[],
    );
    let p = plan(&s, "f", &inventory(), &config(), &specs).unwrap();
    assert_eq!(p.edits.device_nodes[0].path, "/dev/nvidia0");
    assert_eq!(p.edits.device_nodes.last().unwrap().path, "/dev/vnic0");
    assert_eq!(p.cgroup_rules.last().unwrap().to_string(), "c 240:7 rw");
    assert!(
        p.edits
            .mounts
            .iter()
            .any(|m| m.container_path == "/opt/vnic/lib")
    );
    // Parent-first within each group; gpufence's enforcement mounts after every other one.
    let keys: Vec<(bool, usize)> = p
        .edits
        .mounts
        .iter()
        .map(|m| {
            (
                gpufence::plan::is_reserved_destination(&m.container_path),
                m.container_path.matches('/').count(),
            )
        })
        .collect();
    assert!(keys.windows(2).all(|w| w[0] <= w[1]), "{keys:?}");
    assert!(p.quota.is_some());
}

#[test]
fn foreign_cdi_cannot_touch_enforcement() {
    for (from, to) in [
        (
            "containerPath: /opt/vnic/lib",
            "containerPath: /run/gpufence/quota",
        ),
        (
            "containerPath: /opt/vnic/lib",
            "containerPath: /etc/ld.so.preload",
        ),
        (
            "containerPath: /opt/vnic/lib",
            "containerPath: /usr/lib/gpufence/libgpufence.so",
        ),
        ("env: [VNIC=0]", "env: [LD_PRELOAD=/x.so]"),
        (
            "env: [VNIC=0]",
            "env: [GPUFENCE_MEMORY_LIMIT_0=999999999999]",
        ),
    ] {
        let specs = vec![foreign_spec(
            "/etc/cdi/vnic.yaml",
            0,
            &FOREIGN.replace(from, to),
        )];
        let s = spec(&[("cdi.k8s.io/vnic", "vendor.com/nic=nic0")], &[]);
        let e = plan(&s, "f", &inventory(), &config(), &specs).unwrap_err();
        assert!(e.to_string().contains("reserved for gpufence"), "{e}");
        assert_eq!(e.key, "/etc/cdi/vnic.yaml");
    }
}

#[test]
fn foreign_cdi_paths_are_validated() {
    // A LoadedSpec built without the loader is still checked.
    let mut spec_ = foreign_spec("/etc/cdi/vnic.yaml", 0, FOREIGN);
    spec_.spec.devices[0].container_edits.device_nodes[0].path = "/dev/../etc/shadow".into();
    let s = spec(&[("cdi.k8s.io/vnic", "vendor.com/nic=nic0")], &[]);
    let e = plan(&s, "f", &inventory(), &config(), &[spec_]).unwrap_err();
    assert!(e.to_string().contains(".."), "{e}");

    let mut spec_ = foreign_spec("/etc/cdi/vnic.yaml", 0, FOREIGN);
    spec_.spec.container_edits.mounts[0].host_path = "relative/lib".into();
    let e = plan(&s, "f", &inventory(), &config(), &[spec_]).unwrap_err();
    assert!(e.to_string().contains("not absolute"), "{e}");

    // No major/minor and nothing on the host filled them: refused.
    let mut spec_ = foreign_spec("/etc/cdi/vnic.yaml", 0, FOREIGN);
    spec_.spec.devices[0].container_edits.device_nodes[0].major = None;
    let e = plan(&s, "f", &inventory(), &config(), &[spec_]).unwrap_err();
    assert!(e.to_string().contains("major/minor"), "{e}");

    // Two specs of the same priority defining the device.
    let specs = vec![
        foreign_spec("/etc/cdi/a.yaml", 0, FOREIGN),
        foreign_spec("/etc/cdi/b.yaml", 0, FOREIGN),
    ];
    let e = plan(&s, "f", &inventory(), &config(), &specs).unwrap_err();
    assert!(e.to_string().contains("same priority"), "{e}");
}

#[test]
fn deterministic_and_json_round_trip() {
    let s = spec(
        &[
            ("gpufence.dev/devices", "0,2:0"),
            ("gpufence.dev/memory", "1Gi"),
            ("cdi.k8s.io/vnic", "vendor.com/nic=nic0"),
        ],
        &["NVIDIA_VISIBLE_DEVICES=all"],
    );
    let specs = vec![foreign_spec("/etc/cdi/vnic.yaml", 0, FOREIGN)];
    let a = plan(&s, "d", &inventory(), &trusting(&[Dialect::Hami]), &specs).unwrap();
    let b = plan(&s, "d", &inventory(), &trusting(&[Dialect::Hami]), &specs).unwrap();
    assert_eq!(a, b);
    let json = serde_json::to_string(&a).unwrap();
    let back: gpufence::plan::Plan = serde_json::from_str(&json).unwrap();
    assert_eq!(back, a);
    assert_eq!(serde_json::to_string(&back).unwrap(), json);
}

#[test]
fn no_allocation_grants_nothing() {
    let s = spec(&[("unrelated", "x")], &["NVIDIA_VISIBLE_DEVICES=all"]);
    let p = plan(&s, "n", &inventory(), &config(), &[]).unwrap();
    assert!(p.grants_nothing());
    assert!(p.edits.is_empty());
    assert!(p.cgroup_rules.is_empty() && p.host_files.is_empty() && p.state_dir.is_none());
}

#[test]
fn container_ids_that_name_node_wide_state_files_get_no_gpu() {
    let s = spec(&[("gpufence.dev/devices", "0")], &[]);
    for id in ["ld.so.preload", "ld-facts", "inventory.json", ".hidden"] {
        let e = plan(&s, id, &inventory(), &config(), &[]).unwrap_err();
        assert_eq!(e.key, "container id", "{id}: {e}");
        assert!(e.to_string().contains("reserved"), "{e}");
        // Without an allocation the id needs no state directory and is fine.
        assert!(plan(&spec(&[], &[]), id, &inventory(), &config(), &[]).is_ok());
    }
}
