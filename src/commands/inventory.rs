//! `gpufence inventory [--json]`.
use std::fmt::Write as _;
use std::path::Path;

use crate::config::Config;
use crate::exit::Exit;
use crate::inventory::{Capability, Inventory};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Ignore the cache: take a fresh inventory through NVML (and refresh the cache).
    #[arg(long)]
    pub refresh: bool,
}

pub fn run(config: Option<&Path>, args: Args) -> Result<(), Exit> {
    let cfg = Config::load(config)?;
    crate::logging::init(&cfg);
    if args.refresh {
        let _ = std::fs::remove_file(cfg.state_dir.join(crate::inventory::CACHE_FILE));
    }
    let inv = crate::inventory::load(&cfg)?;
    let out = if args.json {
        let mut s = serde_json::to_string_pretty(&inv).expect("inventory serialises");
        s.push('\n');
        s
    } else {
        render(&inv)
    };
    use std::io::Write;
    std::io::stdout()
        .write_all(out.as_bytes())
        .map_err(|e| Exit::env(format!("stdout: {e}")))
}

fn mib(b: u64) -> u64 {
    b >> 20
}

/// The human-readable table.
pub fn render(inv: &Inventory) -> String {
    let mut s = String::new();
    let cuda = inv.cuda_driver_version;
    let _ = writeln!(
        s,
        "Driver {}  CUDA {}.{}  GPUs {}",
        inv.driver_version,
        cuda / 1000,
        (cuda % 1000) / 10,
        inv.gpus.len()
    );
    for g in &inv.gpus {
        let mig = match (g.mig_capable, g.mig_enabled) {
            (false, _) => "MIG n/a",
            (true, false) => "MIG off",
            (true, true) => "MIG on",
        };
        let _ = writeln!(
            s,
            "GPU {:<2} {}  {}  {} MiB  {}  cc {}.{}  {}  {} ({} {}:{})",
            g.index,
            g.uuid,
            g.name,
            mib(g.memory_bytes),
            g.pci_bus_id,
            g.compute_capability.0,
            g.compute_capability.1,
            mig,
            g.node.path,
            g.node.kind,
            g.node.major,
            g.node.minor
        );
        for m in &g.mig_devices {
            let caps: Vec<&str> = m.caps.iter().map(|c| c.path.as_str()).collect();
            let _ = writeln!(
                s,
                "  MIG {}:{}  {}  {}  {} MiB  gi {} ci {}  {}",
                g.index,
                m.index,
                m.uuid,
                m.profile,
                mib(m.memory_bytes),
                m.gi,
                m.ci,
                caps.join(",")
            );
        }
    }
    let ml = &inv.memory_limits;
    let _ = writeln!(
        s,
        "Driver memory limits (quota.backend driver): cgroup {}, NVML {}, GPUs {}",
        ml.cgroup.name(),
        if ml.nvml_exports {
            "exports nvmlDeviceSetMemoryLimits_v1"
        } else {
            "without nvmlDeviceSetMemoryLimits_v1"
        },
        if ml.gpus.is_empty() {
            "none".to_string()
        } else {
            ml.gpus.join(",")
        }
    );
    let _ = writeln!(s, "Device nodes:");
    for n in &inv.control_nodes {
        let _ = writeln!(
            s,
            "  {:<24} {} {}:{}  {}",
            n.path,
            n.kind,
            n.major,
            n.minor,
            n.host_path.display()
        );
    }
    let _ = writeln!(s, "Driver files:");
    for cap in Capability::ALL {
        let files: Vec<_> = inv
            .driver_files
            .iter()
            .filter(|f| f.capability == cap)
            .collect();
        if files.is_empty() {
            continue;
        }
        let _ = writeln!(s, "  {}:", cap.name());
        for f in files {
            let kind = format!("{:?}", f.kind).to_lowercase();
            match &f.soname {
                Some(so) => {
                    let _ = writeln!(s, "    {:<8} {}  (soname {so})", kind, f.container_path);
                }
                None => {
                    let _ = writeln!(s, "    {:<8} {}", kind, f.container_path);
                }
            }
        }
    }
    s
}
