//! `gpufence-sim`: a whole simulated GPU node for tests and the demo.
//!
//! `gpufence-sim node --dir DIR --gpus N [--mig-gpu I|all] [--memory-mib M]` creates (and prints
//! only the path of `DIR/config.toml` on stdout):
//!
//! ```text
//! DIR/dev/nvidia0..N-1                     c 195 <i>
//! DIR/dev/nvidiactl                        c 195 255
//! DIR/dev/nvidia-modeset                   c 195 254
//! DIR/dev/nvidia-uvm, nvidia-uvm-tools     c 509 0, c 509 1
//! DIR/dev/nvidia-caps/nvidia-cap1, -cap2   c 510 1, 2 (MIG config / monitor)
//! DIR/dev/nvidia-caps/nvidia-cap<m>        c 510 m, one per MIG gi and ci access (m from 3)
//! DIR/proc/driver/nvidia/version           the kernel module's version text
//! DIR/proc/driver/nvidia/capabilities/mig/{config,monitor}
//! DIR/proc/driver/nvidia/capabilities/gpu<i>/mig/gi<g>/access, …/gi<g>/ci<c>/access
//! DIR/driver/usr/lib/x86_64-linux-gnu/     libnvidia-ml.so.<ver> (mock NVML) + .so.1 link,
//!                                          libcuda.so.<ver> (mock CUDA) + .so.1 + .so links,
//!                                          stand-in libraries of every capability,
//!                                          gpufence-mock-node.json,
//!                                          gpufence-mock-timeline (0666: the GPUs' device
//!                                          timeline, node-wide state of the mock driver)
//! DIR/driver/usr/bin/nvidia-smi            prints each GPU's memory through NVML (dlopen)
//! DIR/driver/usr/bin/nvidia-cuda-mps-control  mock MPS control daemon and client (gpufence_mock_node::mps)
//! DIR/driver/lib/firmware/nvidia/<ver>/gsp_ga10x.bin, gsp_tu10x.bin
//! DIR/node.json                            the node description (GPUFENCE_MOCK_NODE format)
//! DIR/state/                               gpufence state-dir
//! DIR/driver-folders/                      runtime.driver-folders (the folders layout's hard links)
//! DIR/config.toml                          points gpufence at all of the above
//! ```
//!
//! GPUs are "NVIDIA H100 80GB HBM3" with 81559 MiB (or `--memory-mib`), compute capability 9.0,
//! deterministic UUIDs and PCI bus ids. `--mig-gpu I` (a comma list, or `all`) enables MIG with
//! seven 1g.10gb instances (9984 MiB, GPU instances 7–13, compute instance 0).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::exit::Exit;
use crate::ldso::soname as elf;

/// Driver version of the simulated node.
pub const DRIVER_VERSION: &str = "580.65.06";
/// CUDA driver API version of the simulated node: what a real driver of `DRIVER_VERSION`'s
/// branch reports (580 → 13.0; 570 → 12.8, 550 → 12.4). NVIDIA's CUDA 13 runtime refuses a
/// driver below 13.0.
pub const CUDA_DRIVER_VERSION: i32 = 13000;
pub const GPU_NAME: &str = "NVIDIA H100 80GB HBM3";
pub const GPU_MEMORY_MIB: u64 = 81559;
pub const NVIDIA_MAJOR: u32 = 195;
pub const UVM_MAJOR: u32 = 509;
pub const CAPS_MAJOR: u32 = 510;
/// MIG instances per GPU when MIG is on, and their profile.
pub const MIG_PER_GPU: u32 = 7;
pub const MIG_PROFILE: &str = "1g.10gb";
pub const MIG_MEMORY_MIB: u64 = 9984;
/// Library directory under the driver root.
pub const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";

#[derive(clap::Parser, Debug)]
#[command(name = "gpufence-sim", about = "Build a simulated GPU node")]
pub enum Cli {
    /// Build a simulated node in DIR and print the path of its config.toml.
    Node {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
        gpus: u32,
        /// GPU index (or comma list, or `all`) to put in MIG mode with 7 × 1g.10gb instances.
        #[arg(long)]
        mig_gpu: Option<String>,
        /// Memory of each GPU in MiB.
        #[arg(long)]
        memory_mib: Option<u64>,
    },
    /// Write a kubelet device-manager checkpoint (sealed with kubelet's checksum) recording what
    /// device plugins allocated, as kubelet would after admitting the pods.
    KubeletCheckpoint {
        #[arg(long)]
        output: PathBuf,
        /// One entry as JSON: {"pod":UID,"container":NAME,"resource":NAME,"ids":[…],"env":{…}}.
        #[arg(long = "entry", value_name = "JSON")]
        entries: Vec<String>,
        /// `RegisteredDevices` of one resource, `RESOURCE=ID,ID,…` (every id the device plugin
        /// advertises, e.g. time-slicing replicas `GPU-…::0`…); without any, the entries' ids.
        #[arg(long = "register", value_name = "RESOURCE=IDS")]
        registered: Vec<String>,
    },
}

/// `gpufence-sim kubelet-checkpoint --entry`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SimEntry {
    pod: String,
    container: String,
    resource: String,
    ids: Vec<String>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mknod {path}: {source} (creating device nodes needs root / CAP_MKNOD)")]
    Mknod { path: PathBuf, source: nix::Error },
    #[error("--mig-gpu {0:?}: expected a GPU index below --gpus, a comma list of them, or `all`")]
    MigGpu(String),
    #[error(
        "{0} not found next to gpufence-sim: build the whole workspace first (`cargo build --workspace`)"
    )]
    MissingArtifact(PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SimError + '_ {
    move |source| SimError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What to build.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub gpus: u32,
    pub mig: Vec<bool>,
    pub memory_mib: u64,
}

impl NodeSpec {
    pub fn new(
        gpus: u32,
        mig_gpu: Option<&str>,
        memory_mib: Option<u64>,
    ) -> Result<Self, SimError> {
        let mut mig = vec![false; gpus as usize];
        if let Some(sel) = mig_gpu {
            if sel.trim() == "all" {
                mig.iter_mut().for_each(|m| *m = true);
            } else {
                for part in sel.split(',') {
                    let i: usize = part
                        .trim()
                        .parse()
                        .map_err(|_| SimError::MigGpu(sel.to_string()))?;
                    *mig.get_mut(i)
                        .ok_or_else(|| SimError::MigGpu(sel.to_string()))? = true;
                }
            }
        }
        Ok(NodeSpec {
            gpus,
            mig,
            memory_mib: memory_mib.unwrap_or(GPU_MEMORY_MIB),
        })
    }
}

pub fn gpu_uuid(i: u32) -> String {
    format!(
        "GPU-{:08x}-{:04x}-4f1e-9a3c-{:012x}",
        0x6f7a_3c00 + i,
        0x5e10 + i,
        0x00d1_5ca1_ab1e_u64 + u64::from(i)
    )
}

pub fn mig_uuid(gpu: u32, j: u32) -> String {
    format!(
        "MIG-{:08x}-{:04x}-5b2d-8c4e-{:012x}",
        0x7a11_0000 + gpu * 16 + j,
        0x1000 + gpu,
        0x00c0_ffee_0000_u64 + u64::from(gpu * 16 + j)
    )
}

/// PCI bus id of GPU `i` (HGX H100 bus numbers, a new domain every 8 GPUs), in index order.
pub fn pci_bus_id(i: u32) -> String {
    const BUS: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    format!("{:08x}:{:02x}:00.0", i / 8, BUS[(i % 8) as usize])
}

/// The node description (mock node JSON).
pub fn node_json(spec: &NodeSpec, dev_root: &Path) -> serde_json::Value {
    let gpus: Vec<_> = (0..spec.gpus)
        .map(|i| {
            let mig: Vec<_> = if spec.mig[i as usize] {
                (0..MIG_PER_GPU)
                    .map(|j| {
                        json!({"uuid": mig_uuid(i, j), "gi": 7 + j, "ci": 0,
                               "profile": MIG_PROFILE, "memory_mib": MIG_MEMORY_MIB})
                    })
                    .collect()
            } else {
                Vec::new()
            };
            json!({
                "uuid": gpu_uuid(i), "name": GPU_NAME, "memory_mib": spec.memory_mib, "minor": i,
                "pci_bus_id": pci_bus_id(i), "compute_capability": [9, 0], "mig": mig,
                "mig_mode": if spec.mig[i as usize] { "enabled" } else { "disabled" },
            })
        })
        .collect();
    json!({
        "driver_version": DRIVER_VERSION,
        "cuda_driver_version": CUDA_DRIVER_VERSION,
        "dev_root": dev_root.display().to_string(),
        "gpus": gpus,
    })
}

/// Stand-in driver libraries: (file stem, soname); all get the `.so.<ver>` suffix.
pub const STANDIN_LIBS: &[(&str, &str)] = &[
    (
        "libnvidia-ptxjitcompiler.so",
        "libnvidia-ptxjitcompiler.so.1",
    ),
    ("libnvidia-nvvm.so", "libnvidia-nvvm.so.4"),
    ("libnvidia-cfg.so", "libnvidia-cfg.so.1"),
    ("libnvidia-encode.so", "libnvidia-encode.so.1"),
    ("libnvcuvid.so", "libnvcuvid.so.1"),
    ("libnvidia-opticalflow.so", "libnvidia-opticalflow.so.1"),
    ("libGLX_nvidia.so", "libGLX_nvidia.so.0"),
    ("libEGL_nvidia.so", "libEGL_nvidia.so.0"),
    ("libnvidia-glcore.so", "libnvidia-glcore.so"),
];

fn mknod(path: &Path, major: u32, minor: u32) -> Result<(), SimError> {
    use nix::sys::stat::{Mode, SFlag, makedev};
    let _ = std::fs::remove_file(path);
    nix::sys::stat::mknod(
        path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(u64::from(major), u64::from(minor)),
    )
    .map_err(|source| SimError::Mknod {
        path: path.to_path_buf(),
        source,
    })?;
    // mknod's mode is masked by the umask: make the node world read-write as the driver does.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(io(path))
}

fn write(path: &Path, contents: impl AsRef<[u8]>) -> Result<(), SimError> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(io(d))?;
    }
    std::fs::write(path, contents).map_err(io(path))
}

fn symlink(target: &str, link: &Path) -> Result<(), SimError> {
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).map_err(io(link))
}

fn install(src: &Path, dst: &Path, mode: u32) -> Result<(), SimError> {
    if !src.is_file() {
        return Err(SimError::MissingArtifact(src.to_path_buf()));
    }
    let _ = std::fs::remove_file(dst);
    std::fs::copy(src, dst).map_err(io(dst))?;
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(mode)).map_err(io(dst))
}

/// Build artifacts the node installs, looked up next to the running executable.
#[derive(Debug, Clone)]
pub struct Artifacts {
    pub mock_nvml: PathBuf,
    pub mock_cuda: PathBuf,
    pub nvidia_smi: PathBuf,
    /// Mock `nvidia-cuda-mps-control`.
    pub mps_control: PathBuf,
    pub gpufence: PathBuf,
    pub shim: PathBuf,
}

impl Artifacts {
    pub fn beside(dir: &Path) -> Self {
        Artifacts {
            mock_nvml: dir.join("libgpufence_mock_nvml.so"),
            mock_cuda: dir.join("libgpufence_mock_cuda.so"),
            nvidia_smi: dir.join("gpufence-mock-nvidia-smi"),
            mps_control: dir.join("gpufence-mock-mps-control"),
            gpufence: dir.join("gpufence"),
            shim: dir.join("libgpufence.so"),
        }
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|c| c.is_file())
    })
}

/// Build the node in `dir`; returns the path of its `config.toml`.
pub fn build_node(dir: &Path, spec: &NodeSpec, art: &Artifacts) -> Result<PathBuf, SimError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let dir = dir.canonicalize().map_err(io(dir))?;
    let dev = dir.join("dev");
    let caps = dev.join("nvidia-caps");
    std::fs::create_dir_all(&caps).map_err(io(&caps))?;

    // Device nodes.
    for i in 0..spec.gpus {
        mknod(&dev.join(format!("nvidia{i}")), NVIDIA_MAJOR, i)?;
    }
    mknod(&dev.join("nvidiactl"), NVIDIA_MAJOR, 255)?;
    mknod(&dev.join("nvidia-modeset"), NVIDIA_MAJOR, 254)?;
    mknod(&dev.join("nvidia-uvm"), UVM_MAJOR, 0)?;
    mknod(&dev.join("nvidia-uvm-tools"), UVM_MAJOR, 1)?;

    // /proc/driver/nvidia.
    let procdrv = dir.join("proc/driver/nvidia");
    write(
        &procdrv.join("version"),
        format!(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {DRIVER_VERSION}  Sun Jul 27 07:09:35 UTC 2025\n\
             GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n"
        ),
    )?;
    let access = |minor: u32| {
        format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    };
    let capdir = procdrv.join("capabilities");
    write(&capdir.join("mig/config"), access(1))?;
    write(&capdir.join("mig/monitor"), access(2))?;
    mknod(&caps.join("nvidia-cap1"), CAPS_MAJOR, 1)?;
    mknod(&caps.join("nvidia-cap2"), CAPS_MAJOR, 2)?;
    let mut next_minor = 3;
    for i in 0..spec.gpus {
        if !spec.mig[i as usize] {
            continue;
        }
        for j in 0..MIG_PER_GPU {
            let gi = capdir.join(format!("gpu{i}/mig/gi{}", 7 + j));
            for (file, minor) in [
                (gi.join("access"), next_minor),
                (gi.join("ci0/access"), next_minor + 1),
            ] {
                write(&file, access(minor))?;
                mknod(&caps.join(format!("nvidia-cap{minor}")), CAPS_MAJOR, minor)?;
            }
            next_minor += 2;
        }
    }

    // Driver root.
    let driver = dir.join("driver");
    let lib = driver.join(LIB_DIR);
    std::fs::create_dir_all(&lib).map_err(io(&lib))?;
    let v = DRIVER_VERSION;
    install(
        &art.mock_nvml,
        &lib.join(format!("libnvidia-ml.so.{v}")),
        0o755,
    )?;
    symlink(
        &format!("libnvidia-ml.so.{v}"),
        &lib.join("libnvidia-ml.so.1"),
    )?;
    install(&art.mock_cuda, &lib.join(format!("libcuda.so.{v}")), 0o755)?;
    symlink(&format!("libcuda.so.{v}"), &lib.join("libcuda.so.1"))?;
    symlink("libcuda.so.1", &lib.join("libcuda.so"))?;
    for (stem, soname) in STANDIN_LIBS {
        let p = lib.join(format!("{stem}.{v}"));
        // A soname without a version suffix means "the versioned file name itself".
        let soname = if soname.ends_with(".so") {
            format!("{soname}.{v}")
        } else {
            soname.to_string()
        };
        write(&p, elf::minimal_shared_object(&soname))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).map_err(io(&p))?;
    }
    let bin = driver.join("usr/bin");
    std::fs::create_dir_all(&bin).map_err(io(&bin))?;
    install(&art.nvidia_smi, &bin.join("nvidia-smi"), 0o755)?;
    install(
        &art.mps_control,
        &bin.join("nvidia-cuda-mps-control"),
        0o755,
    )?;
    let fw = driver.join(format!("lib/firmware/nvidia/{v}"));
    for f in ["gsp_ga10x.bin", "gsp_tu10x.bin"] {
        write(&fw.join(f), format!("simulated GSP firmware {f} {v}\n"))?;
    }

    // Node description and the device timeline every process of the node shares.
    // Created empty and world-writable; the first mock driver to map it sizes it.
    let timeline = lib.join(crate::inventory::files::MOCK_TIMELINE_FILE);
    write(&timeline, b"")?;
    std::fs::set_permissions(&timeline, std::fs::Permissions::from_mode(0o666))
        .map_err(io(&timeline))?;
    let mut node = node_json(spec, &dir);
    node["timeline"] = timeline.display().to_string().into();
    let node = serde_json::to_string_pretty(&node).expect("json");
    write(&lib.join(gpufence_mock_node_file()), &node)?;
    write(&dir.join("node.json"), &node)?;
    let state = dir.join("state");
    std::fs::create_dir_all(&state).map_err(io(&state))?;

    let mut t = toml::Table::new();
    let s = |p: &Path| toml::Value::String(p.display().to_string());
    t.insert("driver-root".into(), s(&driver));
    t.insert("dev-root".into(), s(&dir));
    t.insert("proc-root".into(), s(&dir));
    t.insert("nvml-library".into(), s(&lib.join("libnvidia-ml.so.1")));
    t.insert("state-dir".into(), s(&state));
    t.insert("gpufence-binary".into(), s(&art.gpufence));
    // The driver folders (hard links of the driver's files) beside the simulated driver: on its
    // filesystem, never in the host's /var/lib.
    let mut r = toml::Table::new();
    r.insert("driver-folders".into(), s(&dir.join("driver-folders")));
    if let Some(runc) = find_on_path("runc") {
        r.insert("path".into(), s(&runc));
    }
    t.insert("runtime".into(), toml::Value::Table(r));
    let mut shim = toml::Table::new();
    shim.insert("library".into(), s(&art.shim));
    t.insert("shim".into(), toml::Value::Table(shim));
    let mut log = toml::Table::new();
    log.insert("file".into(), s(&dir.join("gpufence.log")));
    t.insert("log".into(), toml::Value::Table(log));
    let cfg = dir.join("config.toml");
    write(
        &cfg,
        format!(
            "# Simulated GPU node made by gpufence-sim ({} GPUs)\n{}",
            spec.gpus,
            toml::to_string(&t).expect("toml")
        ),
    )?;
    Ok(cfg)
}

fn gpufence_mock_node_file() -> &'static str {
    "gpufence-mock-node.json"
}

pub fn run(cli: Cli) -> Result<(), Exit> {
    match cli {
        Cli::Node {
            dir,
            gpus,
            mig_gpu,
            memory_mib,
        } => {
            let spec =
                NodeSpec::new(gpus, mig_gpu.as_deref(), memory_mib).map_err(Exit::invalid)?;
            let exe =
                std::env::current_exe().map_err(|e| Exit::env(format!("current_exe: {e}")))?;
            let art = Artifacts::beside(exe.parent().unwrap_or(Path::new("/")));
            let cfg = build_node(&dir, &spec, &art).map_err(|e| match e {
                SimError::MigGpu(_) => Exit::invalid(e),
                e => Exit::env(e),
            })?;
            println!("{}", cfg.display());
            Ok(())
        }
        Cli::KubeletCheckpoint {
            output,
            entries,
            registered,
        } => {
            let mut out = Vec::new();
            for e in &entries {
                let e: SimEntry = serde_json::from_str(e)
                    .map_err(|err| Exit::invalid(format!("--entry {e}: {err}")))?;
                let env: Vec<(&str, &str)> = e
                    .env
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                let ids: Vec<&str> = e.ids.iter().map(String::as_str).collect();
                out.push(crate::kubelet::entry(
                    &e.pod,
                    &e.container,
                    &e.resource,
                    &ids,
                    crate::kubelet::encode_alloc_resp(&env, &[]),
                ));
            }
            let json = if registered.is_empty() {
                crate::kubelet::checkpoint_json(out)
            } else {
                let mut reg: Vec<(&str, Vec<String>)> = Vec::new();
                for r in &registered {
                    let (res, ids) = r.split_once('=').ok_or_else(|| {
                        Exit::invalid(format!("--register {r}: expected RESOURCE=ID,ID,…"))
                    })?;
                    reg.push((res, ids.split(',').map(str::to_string).collect()));
                }
                crate::kubelet::checkpoint_json_registered(out, &reg)
            };
            std::fs::write(&output, json)
                .map_err(|e| Exit::env(format!("{}: {e}", output.display())))
        }
    }
}

// The decision's and the node's modules under the crate's own paths (`crate::plan`, …).
use gpufence_core::{exit, inventory, kubelet, ldso};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_version_is_the_driver_branchs() {
        assert_eq!(
            CUDA_DRIVER_VERSION,
            gpufence_mock_node::cuda_version_of_driver(DRIVER_VERSION)
        );
    }

    #[test]
    fn mig_selection() {
        assert_eq!(
            NodeSpec::new(4, Some("1"), None).unwrap().mig,
            [false, true, false, false]
        );
        assert_eq!(
            NodeSpec::new(2, Some("all"), None).unwrap().mig,
            [true, true]
        );
        assert_eq!(
            NodeSpec::new(3, Some("0,2"), None).unwrap().mig,
            [true, false, true]
        );
        assert!(NodeSpec::new(2, Some("2"), None).is_err());
        assert!(NodeSpec::new(2, Some("x"), None).is_err());
    }

    #[test]
    fn ids_are_distinct_and_ordered() {
        let ids: Vec<_> = (0..16).map(pci_bus_id).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        let uuids: std::collections::HashSet<_> = (0..16).map(gpu_uuid).collect();
        assert_eq!(uuids.len(), 16);
        let node = node_json(
            &NodeSpec::new(2, Some("1"), Some(1024)).unwrap(),
            Path::new("/x"),
        );
        // The mocks' strict parser (deny_unknown_fields) accepts what the sim writes.
        let parsed = gpufence_mock_node::parse(&node.to_string()).unwrap();
        assert_eq!(parsed.gpus[1].mig.len(), 7);
        assert_eq!(
            parsed.gpus[0].mig_mode(),
            gpufence_mock_node::MigMode::Disabled
        );
        assert_eq!(parsed.gpus[1].mig[6].gi, 13);
        assert_eq!(parsed.dev_root.as_deref(), Some("/x"));
    }
}
