//! A small NRI plugin of the project's own, built on the NRI wire crate (`gpufence-nri-stub`,
//! through `gpufence::nri`), standing for the plugins that hand containers GPUs beside gpufence:
//! for each container it adds what its pod's annotations ask, as NVIDIA's NRI plugin (toolkit
//! v1.20) injects the CDI devices a pod names in `nvidia.cdi.k8s.io/container.<name>`:
//! * `nvidia.cdi.k8s.io/container.<name>: <CDI device>[,<CDI device>…]` — CDI devices;
//! * `test.<plugin>/device.<name>: <path>=<major>:<minor>` — a character device node;
//! * `test.<plugin>/env.<name>: KEY=VALUE[;KEY=VALUE…]` — env (koordlet's
//!   `NVIDIA_VISIBLE_DEVICES`, its HAMi-core `LD_PRELOAD`).
//!
//! `<plugin>` is the name it registers with: `injector` (index 10, before gpufence's 90: what
//! it adds is in the container gpufence decides for) and `late-injector` (95, after gpufence:
//! only the validation sees it). Only `injector` acts on NVIDIA's annotation.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpufence::nri::api::{
    self, CdiDevice, ContainerAdjustment, KeyValue, LinuxContainerAdjustment, LinuxDevice,
};
use gpufence::nri::{Gone, Handler, Plugin, PluginConfig, Stopper, Transport};

pub const CDI_PREFIX: &str = "nvidia.cdi.k8s.io/container.";

/// The annotation key asking injector `plugin` for a device node for container `ctr`.
pub fn device_key(plugin: &str, ctr: &str) -> String {
    format!("test.{plugin}/device.{ctr}")
}

/// The annotation key asking injector `plugin` for env for container `ctr`.
pub fn env_key(plugin: &str, ctr: &str) -> String {
    format!("test.{plugin}/env.{ctr}")
}

pub struct Injector {
    name: String,
    syncs: AtomicUsize,
}

/// `/dev/nvidia0=195:0` → the node.
fn device(spec: &str) -> Result<LinuxDevice, String> {
    let bad = || format!("{spec:?} is not <path>=<major>:<minor>");
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
        let asked = |key: String| pod.annotations.get(&key);
        let mut adj = ContainerAdjustment::default();
        let cdi = asked(format!("{CDI_PREFIX}{}", ctr.name)).filter(|_| self.name == "injector");
        if let Some(names) = cdi {
            adj.cdi_devices = names
                .split(',')
                .map(|n| CdiDevice {
                    name: n.trim().to_string(),
                })
                .collect();
        }
        if let Some(spec) = asked(device_key(&self.name, &ctr.name)) {
            adj.linux = Some(LinuxContainerAdjustment {
                devices: vec![device(spec)?],
                ..Default::default()
            });
        }
        if let Some(env) = asked(env_key(&self.name, &ctr.name)) {
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

/// Injector `name` with `index` on NRI socket `socket`, registered (waited for): stop it with
/// the [`Stopper`], then join the thread.
pub fn start(socket: &Path, name: &str, index: &str) -> (Stopper, std::thread::JoinHandle<()>) {
    let injector = Arc::new(Injector {
        name: name.to_string(),
        syncs: AtomicUsize::new(0),
    });
    let cfg = PluginConfig {
        transport: Transport::Socket(socket.to_path_buf()),
        name: name.into(),
        index: index.into(),
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
