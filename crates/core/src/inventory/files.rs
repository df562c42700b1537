//! Device nodes under `dev-root` and driver files under `driver-root`, found without NVML.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::{Capability, DeviceNode, DriverFile, FileKind, InventoryError};
use crate::config::Config;

/// Control device nodes, in the order they are exposed.
pub const CONTROL_NODES: [&str; 4] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

/// The device node at container path `path` (e.g. `/dev/nvidia0`), stat'ed under `dev-root`.
pub fn device_node(cfg: &Config, path: &str) -> Result<DeviceNode, InventoryError> {
    let mut n = DeviceNode {
        path: path.to_string(),
        host_path: cfg.dev_path(path),
        kind: 'c',
        major: 0,
        minor: 0,
    };
    restat(&mut n)?;
    Ok(n)
}

/// Re-read a node's device numbers from its host path (symlinks followed, as the driver's
/// udev rules may create them).
pub fn restat(n: &mut DeviceNode) -> Result<(), InventoryError> {
    let md = std::fs::metadata(&n.host_path).map_err(|source| InventoryError::Io {
        path: n.host_path.clone(),
        source,
    })?;
    let ft = md.file_type();
    n.kind = if ft.is_char_device() {
        'c'
    } else if ft.is_block_device() {
        'b'
    } else {
        return Err(InventoryError::NotCharDevice {
            path: n.host_path.clone(),
        });
    };
    let rdev = md.rdev();
    n.major = nix::sys::stat::major(rdev) as u32;
    n.minor = nix::sys::stat::minor(rdev) as u32;
    Ok(())
}

/// The control nodes present under `dev-root`.
pub fn control_nodes(cfg: &Config) -> Result<Vec<DeviceNode>, InventoryError> {
    let mut v = Vec::new();
    for p in CONTROL_NODES {
        match device_node(cfg, p) {
            Ok(n) => v.push(n),
            Err(InventoryError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                tracing::debug!(node = p, "control node absent");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(v)
}

/// A versioned driver library: name stem (before `.so.<version>`), capability, soname used when
/// the file carries none.
struct Lib {
    stem: &'static str,
    cap: Capability,
    soname: Option<&'static str>,
}

const fn lib(stem: &'static str, cap: Capability, soname: Option<&'static str>) -> Lib {
    Lib { stem, cap, soname }
}

use Capability::{Compute, Graphics, Ngx, Utility, Video};

/// The driver's libraries by capability (as the NVIDIA container toolkit groups them).
/// `None` soname = the versioned file name is its own soname.
const LIBS: &[Lib] = &[
    lib("libcuda.so", Compute, Some("libcuda.so.1")),
    lib("libcudadebugger.so", Compute, Some("libcudadebugger.so.1")),
    lib(
        "libnvidia-ptxjitcompiler.so",
        Compute,
        Some("libnvidia-ptxjitcompiler.so.1"),
    ),
    lib("libnvidia-nvvm.so", Compute, Some("libnvidia-nvvm.so.4")),
    lib(
        "libnvidia-opencl.so",
        Compute,
        Some("libnvidia-opencl.so.1"),
    ),
    lib("libnvidia-gpucomp.so", Compute, None),
    lib("libnvidia-pkcs11.so", Compute, None),
    lib("libnvidia-pkcs11-openssl3.so", Compute, None),
    lib("libnvidia-ml.so", Utility, Some("libnvidia-ml.so.1")),
    lib("libnvidia-cfg.so", Utility, Some("libnvidia-cfg.so.1")),
    lib("libnvcuvid.so", Video, Some("libnvcuvid.so.1")),
    lib("libnvidia-encode.so", Video, Some("libnvidia-encode.so.1")),
    lib(
        "libnvidia-opticalflow.so",
        Video,
        Some("libnvidia-opticalflow.so.1"),
    ),
    lib("libGLX_nvidia.so", Graphics, Some("libGLX_nvidia.so.0")),
    lib("libEGL_nvidia.so", Graphics, Some("libEGL_nvidia.so.0")),
    lib(
        "libGLESv2_nvidia.so",
        Graphics,
        Some("libGLESv2_nvidia.so.2"),
    ),
    lib(
        "libGLESv1_CM_nvidia.so",
        Graphics,
        Some("libGLESv1_CM_nvidia.so.1"),
    ),
    lib("libnvidia-glcore.so", Graphics, None),
    lib("libnvidia-eglcore.so", Graphics, None),
    lib("libnvidia-glsi.so", Graphics, None),
    lib("libnvidia-tls.so", Graphics, None),
    lib("libnvidia-rtcore.so", Graphics, None),
    lib("libnvidia-fbc.so", Graphics, Some("libnvidia-fbc.so.1")),
    lib("libnvoptix.so", Graphics, Some("libnvoptix.so.1")),
    lib("libnvidia-glvkspirv.so", Graphics, None),
    lib(
        "libnvidia-allocator.so",
        Graphics,
        Some("libnvidia-allocator.so.1"),
    ),
    lib("libnvidia-ngx.so", Ngx, Some("libnvidia-ngx.so.1")),
];

/// Library directories searched under `driver-root` (first match of a real directory wins).
const LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib",
    "/usr/lib/aarch64-linux-gnu",
];

/// Binaries by capability.
const BINARIES: &[(&str, Capability)] = &[
    ("nvidia-smi", Utility),
    ("nvidia-debugdump", Utility),
    ("nvidia-persistenced", Utility),
    ("nvidia-cuda-mps-control", Compute),
    ("nvidia-cuda-mps-server", Compute),
];

/// Daemon sockets / pipes (under `driver-root`, which is `/` on a real node).
const SOCKETS: &[(&str, Capability)] = &[
    ("/run/nvidia-persistenced/socket", Utility),
    ("/run/nvidia-fabricmanager/socket", Compute),
    ("/tmp/nvidia-mps", Compute),
];

/// Configuration/data files by capability.
const CONFIGS: &[(&str, Capability)] = &[
    ("/usr/share/vulkan/icd.d/nvidia_icd.json", Graphics),
    (
        "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
        Graphics,
    ),
    ("/usr/share/glvnd/egl_vendor.d/10_nvidia.json", Graphics),
    (
        "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        Graphics,
    ),
    ("/usr/share/nvidia/nvoptix.bin", Graphics),
];

/// The simulated node's description, installed beside the mock libraries (mocks find it there,
/// also inside containers). Never present on a real node.
pub const MOCK_NODE_FILE: &str = "gpufence-mock-node.json";
/// The simulated node's device timeline beside it (see `gpufence_mock_node::timeline`).
pub const MOCK_TIMELINE_FILE: &str = "gpufence-mock-timeline";

fn container_path(cfg: &Config, host: &Path) -> Option<String> {
    let rel = host.strip_prefix(&cfg.driver_root).ok()?;
    Some(format!("/{}", rel.display()))
}

fn file(cfg: &Config, host: PathBuf, kind: FileKind, cap: Capability) -> Option<DriverFile> {
    let container_path = container_path(cfg, &host)?;
    Some(DriverFile {
        host_path: host,
        container_path,
        kind,
        capability: cap,
        soname: None,
    })
}

/// Every driver file under `driver-root`, sorted by capability then container path.
pub fn driver_files(cfg: &Config, driver_version: &str) -> Vec<DriverFile> {
    let mut out = Vec::new();
    let suffix = format!(".{driver_version}");
    let mut seen_dirs: Vec<PathBuf> = Vec::new();
    for d in LIB_DIRS {
        let dir = cfg.driver_path(d);
        let Ok(canon) = dir.canonicalize() else {
            continue;
        };
        // `/lib` → `usr/lib` and similar: scan a real directory once, under its first name.
        if seen_dirs.contains(&canon) {
            continue;
        }
        seen_dirs.push(canon);
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        for name in names {
            let host = dir.join(&name);
            if name == MOCK_NODE_FILE {
                out.extend(file(cfg, host, FileKind::Config, Compute));
                continue;
            }
            if name == MOCK_TIMELINE_FILE {
                out.extend(file(cfg, host, FileKind::DeviceState, Compute));
                continue;
            }
            let Some(stem) = name.strip_suffix(&suffix) else {
                continue;
            };
            let Some(l) = LIBS.iter().find(|l| l.stem == stem) else {
                tracing::debug!(file = %host.display(), "versioned library not in the driver list");
                continue;
            };
            let soname = crate::ldso::soname::soname(&host)
                .or_else(|| l.soname.map(str::to_string))
                .unwrap_or_else(|| name.clone());
            if let Some(mut f) = file(cfg, host, FileKind::Library, l.cap) {
                f.soname = Some(soname);
                out.push(f);
            }
        }
    }
    for (b, cap) in BINARIES {
        for d in ["/usr/bin", "/usr/sbin", "/bin", "/sbin"] {
            let host = cfg.driver_path(&format!("{d}/{b}"));
            if std::fs::metadata(&host).is_ok_and(|m| m.is_file()) {
                out.extend(file(cfg, host, FileKind::Binary, *cap));
                break;
            }
        }
    }
    let fw = cfg.driver_path(&format!("/lib/firmware/nvidia/{driver_version}"));
    if let Ok(rd) = std::fs::read_dir(&fw) {
        let mut fws: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "bin"))
            .collect();
        fws.sort();
        for p in fws {
            out.extend(file(cfg, p, FileKind::Firmware, Compute));
        }
    }
    for (s, cap) in SOCKETS {
        let host = cfg.driver_path(s);
        if let Ok(m) = std::fs::symlink_metadata(&host)
            && (m.file_type().is_socket() || m.is_dir())
        {
            out.extend(file(cfg, host, FileKind::Socket, *cap));
        }
    }
    for (c, cap) in CONFIGS {
        let host = cfg.driver_path(c);
        if std::fs::metadata(&host).is_ok_and(|m| m.is_file()) {
            out.extend(file(cfg, host, FileKind::Config, *cap));
        }
    }
    out.sort_by(|a, b| (a.capability, &a.container_path).cmp(&(b.capability, &b.container_path)));
    out.dedup_by(|a, b| a.container_path == b.container_path);
    out
}
