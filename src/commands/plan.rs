//! `gpufence plan --bundle DIR [--json]`: the dry run. Reads `DIR/config.json`, the inventory
//! (cache, live device numbers) and the CDI specs, prints the normalised allocation and the edits
//! the runtime would make. Changes nothing (beyond refreshing the inventory cache).
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::exit::Exit;
use crate::plan::Plan;
use crate::plan::intake::{CdiSource, intake};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The OCI bundle (directory holding config.json).
    #[arg(long, short = 'b')]
    pub bundle: PathBuf,
    /// Print JSON (stable interface, docs/plan-json.md) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Container id used for the state directory (default: the bundle directory's name).
    #[arg(long)]
    pub id: Option<String>,
    /// CDI spec directory, lowest priority first (default: /etc/cdi then /var/run/cdi).
    #[arg(long = "cdi-dir", value_name = "DIR")]
    pub cdi_dirs: Vec<PathBuf>,
    /// kubelet's device-manager checkpoint to explain the decision with (default: the
    /// `kubelet.checkpoint` key), e.g. a copy taken from the node.
    #[arg(long = "kubelet-checkpoint", value_name = "FILE")]
    pub kubelet_checkpoint: Option<PathBuf>,
    /// kubelet's DRA state to explain the decision with (default: the `kubelet.dra-checkpoint`
    /// key), e.g. a copy taken from the node.
    #[arg(long = "dra-checkpoint", value_name = "FILE")]
    pub dra_checkpoint: Option<PathBuf>,
}

pub fn run(config: Option<&Path>, args: Args) -> Result<(), Exit> {
    let mut cfg = Config::load(config)?;
    if let Some(p) = &args.dra_checkpoint {
        cfg.kubelet.dra_checkpoint = p.clone();
    }
    crate::logging::init(&cfg);
    let config_json = args.bundle.join("config.json");
    let text = std::fs::read_to_string(&config_json)
        .map_err(|e| Exit::invalid(format!("{}: {e}", config_json.display())))?;
    let spec: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Exit::invalid(format!("{}: {e}", config_json.display())))?;
    let id = match args.id {
        Some(id) => id,
        None => std::fs::canonicalize(&args.bundle)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "plan".to_string()),
    };
    let cdi = if args.cdi_dirs.is_empty() {
        CdiSource {
            always: true,
            ..CdiSource::of(&cfg)
        }
    } else {
        CdiSource {
            dirs: args
                .cdi_dirs
                .iter()
                .enumerate()
                .map(|(i, d)| (d.clone(), u8::try_from(i).unwrap_or(u8::MAX)))
                .collect(),
            always: true,
        }
    };
    let load = |cfg: &Config| crate::inventory::load(cfg).map_err(|e| e.to_string());
    let mut intake = intake(
        &cfg,
        &spec,
        &id,
        load,
        &cdi,
        args.kubelet_checkpoint.as_deref(),
    )
    .map_err(|e| {
        tracing::warn!(container = %id, error = %e, "allocation refused");
        Exit::invalid(e)
    })?;
    // The driver folders' directory named, not made: a dry run changes nothing.
    crate::driverfolders::settle_intake(&cfg, &mut intake, crate::driverfolders::Mode::Name);
    let (plan, cdi_errors) = (intake.plan, intake.cdi_errors);
    tracing::info!(
        container = %id,
        devices = plan.allocation.as_ref().map_or(0, |a| a.devices.len()),
        "plan (dry run)"
    );
    let mut out = if args.json {
        serde_json::to_string_pretty(&plan).map_err(|e| Exit::env(format!("plan JSON: {e}")))?
    } else {
        let mut s = render(&plan);
        for e in &cdi_errors {
            let _ = writeln!(s, "warning: {e}");
        }
        s
    };
    if !out.ends_with('\n') {
        out.push('\n');
    }
    use std::io::Write;
    std::io::stdout()
        .write_all(out.as_bytes())
        .map_err(|e| Exit::env(format!("stdout: {e}")))
}

fn fmt_mem(m: Option<u64>) -> String {
    m.map_or_else(
        || "whole device".to_string(),
        |b| format!("{} ({b} bytes)", crate::quantity::format_bytes(b)),
    )
}

fn origin_name(o: crate::allocation::Origin) -> &'static str {
    match o {
        crate::allocation::Origin::Annotation => "annotation",
        crate::allocation::Origin::Kubelet => "env recorded in the kubelet checkpoint",
        crate::allocation::Origin::Env => "env (trust-env = true)",
        crate::allocation::Origin::Mount => "mount",
        crate::allocation::Origin::Device => "device node in the spec",
    }
}

/// What kubelet recorded and what GPU env was neutralised.
fn render_kubelet(s: &mut String, p: &Plan) {
    if let Some(k) = &p.kubelet {
        let _ = write!(s, "kubelet: {}", k.status);
        match (&k.checkpoint, &k.dra_state) {
            (Some(c), Some(d)) => {
                let _ = write!(s, " (checkpoint {c}; DRA state {d})");
            }
            (Some(c), None) => {
                let _ = write!(s, " ({c})");
            }
            (None, _) => {}
        }
        if let Some(w) = &k.why {
            let _ = write!(s, ": {w}");
        }
        let _ = writeln!(s);
        if let Some(r) = &k.record {
            let _ = writeln!(
                s,
                "  pod {} container {}{}",
                r.identity.pod_uid,
                r.identity.container_name,
                r.identity
                    .pod
                    .as_deref()
                    .map(|p| format!(" ({p})"))
                    .unwrap_or_default()
            );
            if r.resources.is_empty() {
                let _ = writeln!(s, "  no device plugin allocated anything to this container");
            }
            for g in &r.resources {
                let env: Vec<String> = g.envs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = writeln!(
                    s,
                    "  {}: devices {}; env {}",
                    g.resource,
                    g.device_ids.join(","),
                    env.join(" ")
                );
            }
            for c in &r.dra_claims {
                let _ = writeln!(
                    s,
                    "  DRA claim {}: CDI devices {}",
                    c.claim,
                    c.cdi_device_ids.join(",")
                );
            }
            if let Some(w) = &r.dra_unavailable {
                let _ = writeln!(s, "  DRA state cannot be used: {w}");
            }
        }
    }
    if !p.neutralised.is_empty() {
        let _ = writeln!(s, "neutralised:");
        for n in &p.neutralised {
            let _ = writeln!(
                s,
                "  {}={:?}{}: {}",
                n.key,
                n.value,
                n.replacement
                    .as_deref()
                    .map(|r| format!(" -> {r}"))
                    .unwrap_or_default(),
                n.why
            );
        }
    }
}

/// The human-readable form.
pub fn render(p: &Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "container {}", p.container_id);
    render_allocation(&mut s, p);
    render_kubelet(&mut s, p);
    render_edits(&mut s, p);
    render_quota(&mut s, p);
    for n in &p.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

/// The allocation and where each facet came from.
fn render_allocation(s: &mut String, p: &Plan) {
    match &p.allocation {
        None => {
            let _ = writeln!(s, "allocation: none (the container gets no GPU)");
        }
        Some(a) => {
            let dialects: Vec<&str> = a.dialects.iter().map(|d| d.name()).collect();
            let caps: Vec<&str> = a.capabilities.iter().map(|c| c.name()).collect();
            let _ = writeln!(
                s,
                "allocation (from {}): {} device(s), oversubscribe {}, capabilities {}",
                dialects.join("+"),
                a.devices.len(),
                if a.oversubscribe { "yes" } else { "no" },
                caps.join(",")
            );
            for (i, d) in a.devices.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "  [{i}] {}  memory {}  cores {}  backed by {}",
                    crate::allocation::devices::describe(&d.device, &d.uuid),
                    fmt_mem(d.memory_limit),
                    d.cores
                        .map_or_else(|| "unlimited".to_string(), |c| format!("{c}%")),
                    d.backing
                );
                if let Some(r) = &d.replica {
                    let _ = writeln!(s, "      {}", r.describe(&d.uuid, Some(a.cores_burst)));
                }
            }
            for f in &a.foreign_cdi {
                let _ = writeln!(
                    s,
                    "  CDI {} (from {})  backed by {}",
                    f.name, f.spec_path, f.backing
                );
            }
            if !a.sources.is_empty() {
                let _ = writeln!(s, "taken from:");
                for src in &a.sources {
                    let _ = writeln!(
                        s,
                        "  {:<13} {} {}: {}={:?}",
                        src.facet,
                        src.dialect,
                        origin_name(src.origin),
                        src.key,
                        src.value
                    );
                }
            }
        }
    }
}

/// The edits every applier renders, and the plan's typed parts the appliers render their own
/// way (the ld cache refresh, the driver folders layout).
fn render_edits(s: &mut String, p: &Plan) {
    let e = &p.edits;
    if !e.device_nodes.is_empty() {
        let _ = writeln!(s, "device nodes:");
        for d in &e.device_nodes {
            let _ = writeln!(
                s,
                "  {}  {} {}:{}  host {}",
                d.path,
                d.kind.as_deref().unwrap_or("?"),
                d.major.map_or("?".to_string(), |v| v.to_string()),
                d.minor.map_or("?".to_string(), |v| v.to_string()),
                d.host_path.as_deref().unwrap_or(&d.path)
            );
        }
    }
    if !p.cgroup_rules.is_empty() {
        let _ = writeln!(s, "cgroup device rules (allow):");
        for r in &p.cgroup_rules {
            let _ = writeln!(s, "  {r}");
        }
    }
    if !e.mounts.is_empty() {
        let _ = writeln!(s, "mounts:");
        for m in &e.mounts {
            let _ = writeln!(
                s,
                "  {} <- {}  ({})",
                m.container_path,
                m.host_path,
                m.options.join(",")
            );
        }
    }
    if !e.env.is_empty() {
        let _ = writeln!(s, "env:");
        for v in &e.env {
            let _ = writeln!(s, "  {v}");
        }
    }
    if !e.hooks.is_empty() {
        let _ = writeln!(s, "hooks:");
        for h in &e.hooks {
            let _ = writeln!(s, "  {}: {} {}", h.hook_name, h.path, h.args.join(" "));
        }
    }
    if !e.additional_gids.is_empty() {
        let gids: Vec<String> = e.additional_gids.iter().map(|g| g.to_string()).collect();
        let _ = writeln!(s, "additional gids: {}", gids.join(","));
    }
    if let Some(l) = p.layout_ld_cache() {
        let nri = if p.driver_folders.is_some() {
            "NRI: LD_LIBRARY_PATH"
        } else {
            "NRI: a createContainer hook"
        };
        let _ = writeln!(
            s,
            "ld cache: refreshed for {} (runtime: before runc, in-process; hook: in the container's namespace; {nri})",
            l.folders.join(", ")
        );
    }
    if let Some(f) = &p.driver_folders {
        let state = if f.prepared {
            "prepared"
        } else {
            "made by the first create"
        };
        let _ = writeln!(
            s,
            "driver layout \"folders\": {} driver file binds served by {} folder binds from {} ({state}; per-file binds if it cannot be made):",
            f.files, f.folders, f.dir
        );
        for m in &f.mounts {
            let _ = writeln!(
                s,
                "  {} <- {}  ({})",
                m.container_path,
                m.host_path,
                m.options.join(",")
            );
        }
        for v in &f.env {
            let _ = writeln!(s, "  env {v}");
        }
        if let Some(v) = &f.library_path {
            let _ = writeln!(
                s,
                "  env {v} (NRI only; the runtime and hook mode write the ld cache)"
            );
        }
    }
}

/// The quota, its backends, MPS and the host side.
fn render_quota(s: &mut String, p: &Plan) {
    if let Some(q) = &p.quota {
        let _ = writeln!(
            s,
            "quota (oversubscribe {}):",
            if q.oversubscribe { "yes" } else { "no" }
        );
        for d in &q.devices {
            let _ = writeln!(
                s,
                "  device {} {}  memory {}  cores {}",
                d.ordinal,
                d.uuid,
                fmt_mem(d.memory),
                d.cores
                    .map_or_else(|| "unlimited".to_string(), |c| format!("{c}%"))
            );
        }
    }
    if let Some(i) = &p.isolation {
        let _ = writeln!(s, "isolation: {i}");
    }
    if !p.memory_backends.is_empty() {
        let _ = writeln!(s, "memory quota enforced by:");
        for b in &p.memory_backends {
            let _ = writeln!(
                s,
                "  device {} {}  {}  ({})",
                b.ordinal,
                b.uuid,
                b.backend.name(),
                b.why
            );
        }
    }
    if let Some(m) = &p.mps {
        let _ = writeln!(
            s,
            "MPS ({}): daemon pipe {} -> {}, shm {} -> /dev/shm",
            m.requested_by, m.pipe_dir, m.container_pipe_dir, m.shm_dir
        );
        if let Some(d) = &m.defaults {
            let _ = writeln!(
                s,
                "  daemon defaults: active thread percentage {}, pinned memory limits {}",
                d.active_thread_percentage,
                d.pinned_mem_limits.join(",")
            );
        }
    }
    if let Some(d) = &p.state_dir {
        let _ = writeln!(s, "state directory: {d}");
    }
    if !p.host_files.is_empty() {
        let _ = writeln!(s, "host files:");
        for f in &p.host_files {
            let _ = writeln!(s, "  {} (mode {:o})", f.path, f.mode);
        }
    }
    if !p.env_overrides.is_empty() {
        let _ = writeln!(s, "env overrides:");
        for o in &p.env_overrides {
            let _ = writeln!(s, "  {o}");
        }
    }
}
