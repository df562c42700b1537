//! A small NRI plugin of the project's own, built on the NRI wire crate (`gpufence-nri-stub`,
//! through `gpufence::nri`), standing for the plugins that hand containers GPUs beside gpufence:
//! for each container it adds what its pod's annotations ask, as NVIDIA's NRI plugin (toolkit
//! v1.20) injects the CDI devices a pod names in `nvidia.cdi.k8s.io/container.<name>`:
//! * `nvidia.cdi.k8s.io/container.<name>: <CDI device>[,<CDI device>…]` — CDI devices;
//! * `test.injector/device.<name>: <path>=<major>:<minor>` — a character device node;
//! * `test.injector/env.<name>: KEY=VALUE[;KEY=VALUE…]` — env (koordlet's
//!   `NVIDIA_VISIBLE_DEVICES`, its HAMi-core `LD_PRELOAD`).
//!
//! It registers as `injector` with index 10, before gpufence (90).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpufence::nri::api::{
    self, CdiDevice, ContainerAdjustment, KeyValue, LinuxContainerAdjustment, LinuxDevice,
};
use gpufence::nri::{Gone, Handler, Plugin, PluginConfig, Stopper, Transport};

pub const CDI_PREFIX: &str = "nvidia.cdi.k8s.io/container.";
pub const DEVICE_PREFIX: &str = "test.injector/device.";
pub const ENV_PREFIX: &str = "test.injector/env.";
/// How NRI names it as the owner of what it adds.
pub const OWNER: &str = "10-injector";

#[derive(Default)]
pub struct Injector {
    syncs: AtomicUsize,
}

/// `/dev/nvidia0=195:0` → the node.
fn device(spec: &str) -> Result<LinuxDevice, String> {
    let bad = || format!("{DEVICE_PREFIX}: {spec:?} is not <path>=<major>:<minor>");
    let (path, numbers) = spec.split_once('=').ok_or_else(bad)?;
    let (major, minor) = numbers.split_once(':').ok_or_else(bad)?;
    Ok(LinuxDevice {
        path: path.to_string(),
        r#type: "c".into(),
        major: major.parse().map_err(|_| bad())?,
        minor: minor.parse().map_err(|_| bad())?,
        file_mode: Some(api::OptionalFileMode { value: 0o666 }),
        ..Default::default()
    })
}

impl Handler for Injector {
    fn create_container(
        &self,
        pod: &api::PodSandbox,
        ctr: &api::Container,
    ) -> Result<ContainerAdjustment, String> {
        let asked = |prefix: &str| pod.annotations.get(&format!("{prefix}{}", ctr.name));
        let mut adj = ContainerAdjustment::default();
        if let Some(names) = asked(CDI_PREFIX) {
            adj.cdi_devices = names
                .split(',')
                .map(|n| CdiDevice {
                    name: n.trim().to_string(),
                })
                .collect();
        }
        if let Some(spec) = asked(DEVICE_PREFIX) {
            adj.linux = Some(LinuxContainerAdjustment {
                devices: vec![device(spec)?],
                ..Default::default()
            });
        }
        if let Some(env) = asked(ENV_PREFIX) {
            for e in env.split(';') {
                let (key, value) = e.split_once('=').unwrap_or((e, ""));
                adj.env.push(KeyValue {
                    key: key.to_string(),
                    value: value.to_string(),
                });
            }
        }
        Ok(adj)
    }

    fn container_gone(&self, _id: &str, _why: Gone) {}

    fn synchronize(&self, _pods: &[api::PodSandbox], _containers: &[api::Container]) {
        self.syncs.fetch_add(1, Ordering::SeqCst);
    }
}

/// The injector on NRI socket `socket`, registered (waited for): stop it with the [`Stopper`],
/// then join the thread.
pub fn start(socket: &Path) -> (Stopper, std::thread::JoinHandle<()>) {
    let injector = Arc::new(Injector::default());
    let cfg = PluginConfig {
        transport: Transport::Socket(socket.to_path_buf()),
        name: "injector".into(),
        index: "10".into(),
    };
    let plugin = Plugin::new(cfg, Arc::clone(&injector) as Arc<dyn Handler>).unwrap();
    let stop = plugin.stopper();
    let t = std::thread::spawn(move || plugin.run().unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    while injector.syncs.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the injector did not register");
        std::thread::sleep(Duration::from_millis(50));
    }
    (stop, t)
}
