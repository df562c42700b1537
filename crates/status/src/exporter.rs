//! `gpufence exporter --listen ADDR`: the state directory as Prometheus metrics on `/metrics`
//! (OpenMetrics text, which Prometheus scrapes natively), built at each scrape by a
//! `prometheus-client` [`Collector`] from the same reader as `gpufence ps`. A plain synchronous
//! HTTP server answers one request at a time; the exporter is its own long-running process and
//! never on the container-create path.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use super::read::{ContainerStatus, snapshot};
use super::refusals;
use crate::exit::Exit;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to serve /metrics on, e.g. 0.0.0.0:9404 or 127.0.0.1:9404.
    #[arg(long, default_value = "127.0.0.1:9404")]
    pub listen: String,
}

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Scrape-time view of one state directory.
#[derive(Debug)]
pub struct StateCollector {
    pub state_dir: PathBuf,
}

type Labels = Vec<(&'static str, String)>;

/// Per-device labels: namespace, pod, container, gpu_uuid, gpu_index. A container outside
/// Kubernetes is named by its id, so two of them never share a series.
fn device_labels(c: &ContainerStatus, d: &super::read::DeviceStatus) -> Labels {
    vec![
        ("namespace", c.namespace.clone().unwrap_or_default()),
        ("pod", c.pod.clone().unwrap_or_default()),
        (
            "container",
            c.container.clone().unwrap_or_else(|| c.id.clone()),
        ),
        ("gpu_uuid", d.uuid.clone()),
        ("gpu_index", d.index.clone()),
    ]
}

fn family<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    kind: prometheus_client::metrics::MetricType,
    series: &[(Labels, M)],
) -> Result<(), std::fmt::Error> {
    let mut f = enc.encode_descriptor(name, help, unit, kind)?;
    for (labels, m) in series {
        m.encode(f.encode_family(labels)?)?;
    }
    Ok(())
}

impl StateCollector {
    /// The series of the running containers (newest first where a label set repeats, e.g. a
    /// restarted container whose old state is still being deleted).
    fn containers(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::MetricType::{Counter, Gauge};
        let mut list = snapshot(&self.state_dir).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "state directory unreadable");
            Vec::new()
        });
        list.sort_by(|a, b| b.created.cmp(&a.created).then(a.id.cmp(&b.id)));
        let (mut used, mut limit, mut peak, mut refused, mut last, mut compute) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        let (mut held, mut registered) = (vec![], vec![]);
        let mut allocated: BTreeMap<(String, String), u64> = BTreeMap::new();
        let mut seen = HashSet::new();
        for c in &list {
            for d in &c.devices {
                if let Some(l) = d.limit {
                    let sum = allocated
                        .entry((d.uuid.clone(), d.index.clone()))
                        .or_default();
                    *sum = sum.saturating_add(l);
                }
                let labels = device_labels(c, d);
                if !seen.insert(labels.clone()) {
                    continue;
                }
                if let Some(l) = d.limit {
                    limit.push((labels.clone(), ConstGauge::new(l as f64)));
                }
                if let Some(r) = d.replicas {
                    held.push((labels.clone(), ConstGauge::new(i64::from(r.held))));
                    registered.push((labels.clone(), ConstGauge::new(i64::from(r.of))));
                }
                if c.error.is_some() {
                    continue; // usage unknown: no usage series rather than wrong ones
                }
                used.push((labels.clone(), ConstGauge::new(d.usage.used as f64)));
                if let Some(p) = d.usage.peak {
                    peak.push((labels.clone(), ConstGauge::new(p as f64)));
                }
                if let Some(r) = d.usage.refusals {
                    refused.push((labels.clone(), ConstCounter::new(r)));
                }
                if let Some(ns) = d.usage.compute_ns {
                    compute.push((labels.clone(), ConstCounter::new(ns as f64 / 1e9)));
                }
                if let Some(b) = d.usage.last_refused {
                    last.push((labels, ConstGauge::new(b as f64)));
                }
            }
        }
        replica_families(enc, &held, &registered)?;
        let bytes = Some(&Unit::Bytes);
        family(
            enc,
            "gpufence_container_gpu_memory_used",
            "Device memory charged to the container by libgpufence.so.",
            bytes,
            Gauge,
            &used,
        )?;
        family(
            enc,
            "gpufence_container_gpu_memory_limit",
            "The container's memory quota on the device.",
            bytes,
            Gauge,
            &limit,
        )?;
        family(
            enc,
            "gpufence_container_gpu_memory_peak",
            "Highest device memory charged to the container since it started.",
            bytes,
            Gauge,
            &peak,
        )?;
        family(
            enc,
            "gpufence_container_gpu_alloc_refusals",
            "Device memory allocations refused by the quota.",
            None,
            Counter,
            &refused,
        )?;
        family(
            enc,
            "gpufence_container_gpu_alloc_last_refused",
            "Size of the container's most recent refused allocation on the device.",
            bytes,
            Gauge,
            &last,
        )?;
        family(
            enc,
            "gpufence_container_gpu_compute",
            "Device time the container's kernel launches were charged under its compute share (gpufence.dev/cores).",
            Some(&Unit::Seconds),
            Counter,
            &compute,
        )?;
        let node: Vec<(Labels, ConstGauge<f64>)> = allocated
            .into_iter()
            .map(|((uuid, index), v)| {
                (
                    vec![("gpu_uuid", uuid), ("gpu_index", index)],
                    ConstGauge::new(v as f64),
                )
            })
            .collect();
        family(
            enc,
            "gpufence_node_gpu_memory_allocated",
            "Sum of the memory quotas of the running containers per device (above the device's memory: oversubscribed).",
            bytes,
            Gauge,
            &node,
        )
    }
}

/// Time-slicing replicas per container and device (kubelet's record, `sharing.replicas`).
fn replica_families(
    enc: &mut DescriptorEncoder,
    held: &[(Labels, ConstGauge<i64>)],
    registered: &[(Labels, ConstGauge<i64>)],
) -> Result<(), std::fmt::Error> {
    use prometheus_client::metrics::MetricType::Gauge;
    family(
        enc,
        "gpufence_container_gpu_replicas",
        "Time-slicing replicas of the device the container holds (kubelet's record); its share is this over gpufence_container_gpu_replicas_registered.",
        None,
        Gauge,
        held,
    )?;
    family(
        enc,
        "gpufence_container_gpu_replicas_registered",
        "Time-slicing replicas of the device kubelet registers (the device plugin's replicas).",
        None,
        Gauge,
        registered,
    )
}

impl Collector for StateCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.containers(&mut enc)?;
        let (unfenced, refused): (Vec<_>, Vec<_>) = refusals::read(&self.state_dir)
            .into_iter()
            .partition(|(r, _)| *r == refusals::Reason::Unfenced);
        let refusals: Vec<(Labels, ConstCounter<u64>)> = refused
            .into_iter()
            .map(|(r, n)| {
                (
                    vec![("reason", r.as_str().to_string())],
                    ConstCounter::new(n),
                )
            })
            .collect();
        family(
            &mut enc,
            "gpufence_create_refusals",
            "Container creations refused by gpufence, by reason.",
            None,
            prometheus_client::metrics::MetricType::Counter,
            &refusals,
        )?;
        let unfenced: Vec<(Labels, ConstCounter<u64>)> = unfenced
            .into_iter()
            .map(|(_, n)| (vec![("applier", "nri".to_string())], ConstCounter::new(n)))
            .collect();
        family(
            &mut enc,
            "gpufence_unfenced_containers",
            "Running containers found holding a GPU without gpufence's fence (NRI, after the \
             fact: created while the runtime had dropped the plugin), fenced or stopped.",
            None,
            prometheus_client::metrics::MetricType::Counter,
            &unfenced,
        )
    }
}

/// One scrape's body.
pub fn scrape(state_dir: &Path) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(StateCollector {
        state_dir: state_dir.to_path_buf(),
    }));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

pub fn run(config: Option<&Path>, args: Args) -> Result<(), Exit> {
    let cfg = crate::config::Config::load(config)?;
    crate::logging::init(&cfg);
    let server = tiny_http::Server::http(&args.listen)
        .map_err(|e| Exit::env(format!("--listen {}: {e}", args.listen)))?;
    eprintln!(
        "gpufence exporter: serving {}/metrics from {}",
        server.server_addr(),
        cfg.state_dir.display()
    );
    for req in server.incoming_requests() {
        let (status, body, kind) = respond(&cfg.state_dir, req.method(), req.url());
        let header = tiny_http::Header::from_bytes("Content-Type", kind).ok();
        let mut resp = tiny_http::Response::from_string(body).with_status_code(status);
        if let Some(h) = header {
            resp = resp.with_header(h);
        }
        if let Err(e) = req.respond(resp) {
            tracing::debug!(error = %e, "scrape client went away");
        }
    }
    Ok(())
}

/// Status, body and content type for a request; never panics into the server loop.
fn respond(state_dir: &Path, method: &tiny_http::Method, url: &str) -> (u16, String, &'static str) {
    use tiny_http::Method::{Get, Head};
    let path = url.split('?').next().unwrap_or("");
    match (method, path) {
        (Get | Head, "/metrics") => match std::panic::catch_unwind(|| scrape(state_dir)) {
            Ok(Ok(body)) => (200, body, CONTENT_TYPE),
            _ => (500, "metrics could not be encoded\n".into(), "text/plain"),
        },
        (Get | Head, "/") => (200, "gpufence exporter: /metrics\n".into(), "text/plain"),
        (Get | Head, _) => (404, "not found\n".into(), "text/plain"),
        _ => (405, "method not allowed\n".into(), "text/plain"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_node_names_every_family() {
        let d = tempfile::tempdir().unwrap();
        let body = scrape(&d.path().join("none")).unwrap();
        for name in [
            "# TYPE gpufence_container_gpu_memory_used_bytes gauge",
            "# TYPE gpufence_container_gpu_memory_limit_bytes gauge",
            "# TYPE gpufence_container_gpu_memory_peak_bytes gauge",
            "# TYPE gpufence_container_gpu_alloc_refusals counter",
            "# TYPE gpufence_node_gpu_memory_allocated_bytes gauge",
            "# TYPE gpufence_container_gpu_replicas gauge",
            "# TYPE gpufence_container_gpu_replicas_registered gauge",
            "# HELP gpufence_create_refusals Container creations refused",
            "gpufence_create_refusals_total{reason=\"allocation\"} 0",
            "gpufence_unfenced_containers_total{applier=\"nri\"} 0",
        ] {
            assert!(body.contains(name), "{name}\n{body}");
        }
        assert!(body.ends_with("# EOF\n"));
        let m = tiny_http::Method::Post;
        assert_eq!(respond(d.path(), &m, "/metrics").0, 405);
        assert_eq!(respond(d.path(), &tiny_http::Method::Get, "/x").0, 404);
        assert_eq!(
            respond(d.path(), &tiny_http::Method::Get, "/metrics?x=1").0,
            200
        );
    }
}
