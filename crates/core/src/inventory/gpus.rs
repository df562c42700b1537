//! GPUs and MIG devices from NVML (nvml-wrapper, loaded from `nvml-library`).

use std::ffi::OsStr;
use std::path::PathBuf;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use super::{DeviceNode, Gpu, Inventory, InventoryError, MigDevice, files};
use crate::config::Config;

fn nvml_err(cfg: &Config, what: &str) -> impl Fn(NvmlError) -> InventoryError + use<> {
    let library = cfg.nvml_library.clone();
    let what = what.to_string();
    move |e| InventoryError::Nvml {
        library: library.clone(),
        message: if what.is_empty() {
            e.to_string()
        } else {
            format!("{what}: {e}")
        },
    }
}

pub(super) fn scan(cfg: &Config) -> Result<Inventory, InventoryError> {
    let nvml = Nvml::builder()
        .lib_path(OsStr::new(&cfg.nvml_library))
        .init()
        .map_err(nvml_err(cfg, "init"))?;
    let driver_version = nvml
        .sys_driver_version()
        .map_err(nvml_err(cfg, "driver version"))?;
    let cuda_driver_version = nvml
        .sys_cuda_driver_version()
        .map_err(nvml_err(cfg, "CUDA driver version"))?;
    let count = nvml.device_count().map_err(nvml_err(cfg, "device count"))?;
    let mut gpus = Vec::with_capacity(count as usize);
    for index in 0..count {
        let e = |what: &str| nvml_err(cfg, &format!("GPU {index}: {what}"));
        let d = nvml.device_by_index(index).map_err(e("handle"))?;
        let minor = d.minor_number().map_err(e("minor number"))?;
        let cc = d
            .cuda_compute_capability()
            .map_err(e("compute capability"))?;
        let (mig_capable, mig_enabled) = match d.mig_mode() {
            Ok(m) => (true, m.current == 1),
            Err(NvmlError::NotSupported) => (false, false),
            Err(err) => return Err(e("MIG mode")(err)),
        };
        let mut mig_devices = Vec::new();
        if mig_enabled {
            let max = d.mig_device_count().map_err(e("MIG device count"))?;
            for j in 0..max {
                let m = match d.mig_device_by_index(j) {
                    Ok(m) => m,
                    Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                    Err(err) => return Err(e(&format!("MIG device {j}"))(err)),
                };
                let me = |what: &str| nvml_err(cfg, &format!("GPU {index} MIG {j}: {what}"));
                let (gi, ci) = instance_ids(&nvml, &m).map_err(me("instance ids"))?;
                let name = m.name().map_err(me("name"))?;
                let profile = name
                    .rsplit_once(" MIG ")
                    .map(|(_, p)| p.to_string())
                    .unwrap_or_default();
                mig_devices.push(MigDevice {
                    index: j,
                    uuid: m.uuid().map_err(me("UUID"))?,
                    gi,
                    ci,
                    profile,
                    memory_bytes: m.memory_info().map_err(me("memory"))?.total,
                    caps: mig_caps(cfg, minor, gi, ci)?,
                });
            }
        }
        gpus.push(Gpu {
            index,
            minor,
            uuid: d.uuid().map_err(e("UUID"))?,
            name: d.name().map_err(e("name"))?,
            memory_bytes: d.memory_info().map_err(e("memory"))?.total,
            pci_bus_id: d.pci_info().map_err(e("PCI info"))?.bus_id,
            compute_capability: (cc.major.max(0) as u32, cc.minor.max(0) as u32),
            mig_enabled,
            mig_capable,
            mig_devices,
            node: files::device_node(cfg, &format!("/dev/nvidia{minor}"))?,
        });
    }
    Ok(Inventory {
        driver_version,
        cuda_driver_version,
        gpus,
        control_nodes: Vec::new(),
        driver_files: Vec::new(),
        memory_limits: Default::default(),
    })
}

/// GPU and compute instance ids of a MIG device (not wrapped by nvml-wrapper).
fn instance_ids(nvml: &Nvml, m: &nvml_wrapper::Device) -> Result<(u32, u32), NvmlError> {
    let lib = nvml.lib();
    let gi_fn = lib
        .nvmlDeviceGetGpuInstanceId
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let ci_fn = lib
        .nvmlDeviceGetComputeInstanceId
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let (mut gi, mut ci) = (0u32, 0u32);
    // SAFETY: the handle is live for the lifetime of `m`; the out-pointers are valid u32s.
    unsafe {
        nvml_wrapper::error::nvml_try(gi_fn(m.handle(), &mut gi))?;
        nvml_wrapper::error::nvml_try(ci_fn(m.handle(), &mut ci))?;
    }
    Ok((gi, ci))
}

/// The `nvidia-caps` nodes a MIG device needs: its GPU instance's and compute instance's access
/// capability, whose minors the driver publishes under
/// `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>[/ci<ci>]/access`.
fn mig_caps(cfg: &Config, minor: u32, gi: u32, ci: u32) -> Result<Vec<DeviceNode>, InventoryError> {
    let base = format!("/proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}");
    [format!("{base}/access"), format!("{base}/ci{ci}/access")]
        .iter()
        .map(|p| {
            let path = cfg.proc_path(p);
            let cap_minor = parse_cap_minor(&path)?;
            files::device_node(cfg, &format!("/dev/nvidia-caps/nvidia-cap{cap_minor}"))
        })
        .collect()
}

/// `DeviceFileMinor: N` of a capability access file.
pub(super) fn parse_cap_minor(path: &PathBuf) -> Result<u32, InventoryError> {
    let text = std::fs::read_to_string(path).map_err(|source| InventoryError::Io {
        path: path.clone(),
        source,
    })?;
    parse_cap_minor_text(&text).ok_or_else(|| InventoryError::Parse {
        path: path.clone(),
        message: "no `DeviceFileMinor: N` line".to_string(),
    })
}

pub(super) fn parse_cap_minor_text(text: &str) -> Option<u32> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "DeviceFileMinor").then(|| v.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_minor() {
        assert_eq!(
            parse_cap_minor_text("DeviceFileMinor: 12\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
            Some(12)
        );
        assert_eq!(parse_cap_minor_text("DeviceFileMode: 292\n"), None);
        assert_eq!(parse_cap_minor_text("DeviceFileMinor: x\n"), None);
    }

    proptest::proptest! {
        #[test]
        fn cap_minor_never_panics(s in ".{0,200}") {
            let _ = parse_cap_minor_text(&s);
        }
    }
}
