//! `gpufence ps [--json] [--watch]`: the GPU containers of this node, one line each.

use std::path::Path;

use super::human::size;
use super::read::{ContainerStatus, snapshot};
use crate::exit::Exit;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// One JSON document (`{"containers": […]}`); with --watch one per line.
    #[arg(long)]
    pub json: bool,
    /// Refresh until interrupted.
    #[arg(long)]
    pub watch: bool,
    /// Seconds between refreshes with --watch.
    #[arg(long, default_value_t = 2.0, value_parser = parse_interval)]
    pub interval: f64,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: seconds between 0.1 and 3600")),
    }
}

pub fn run(config: Option<&Path>, args: Args) -> Result<(), Exit> {
    let cfg = crate::config::Config::load(config)?;
    loop {
        let list = snapshot(&cfg.state_dir).map_err(Exit::env)?;
        let unfenced = super::refusals::read(&cfg.state_dir)
            .into_iter()
            .find(|(r, _)| *r == super::refusals::Reason::Unfenced)
            .map_or(0, |(_, n)| n);
        let text = if args.json {
            let doc = serde_json::json!({ "containers": list, "unfenced": unfenced });
            let mut s = if args.watch {
                doc.to_string()
            } else {
                serde_json::to_string_pretty(&doc).map_err(Exit::env)?
            };
            s.push('\n');
            s
        } else {
            let mut t = table(&list);
            if unfenced > 0 {
                t.push_str(&format!(
                    "{unfenced} GPU container(s) found unfenced and fenced or stopped after the \
                     fact (gpufence nri; its log says which)\n"
                ));
            }
            t
        };
        if args.watch && !args.json {
            // home + clear, then the table
            print!("\x1b[H\x1b[2J{text}");
        } else {
            print!("{text}");
        }
        use std::io::Write;
        if std::io::stdout().flush().is_err() || !args.watch {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(args.interval));
    }
}

const HEADERS: [&str; 12] = [
    "CONTAINER",
    "NAMESPACE",
    "POD",
    "NAME",
    "GPU",
    "UUID",
    "USED",
    "QUOTA",
    "SHARE",
    "PEAK",
    "REFUSED",
    "PROCS",
];

/// The table: a header and one line per container, columns aligned; a container's devices are
/// comma-separated within a column.
pub fn table(list: &[ContainerStatus]) -> String {
    let dash = |o: Option<String>| o.unwrap_or_else(|| "-".into());
    let rows: Vec<[String; 12]> = list
        .iter()
        .map(|c| {
            let per = |f: &dyn Fn(&super::read::DeviceStatus) -> String| {
                c.devices.iter().map(f).collect::<Vec<_>>().join(",")
            };
            let broken = c.error.is_some();
            let fig = |v: Option<u64>| match v {
                Some(v) if !broken => size(v, true),
                _ => "?".into(),
            };
            [
                c.id.chars().take(12).collect(),
                dash(c.namespace.clone()),
                dash(c.pod.clone()),
                dash(c.container.clone()),
                per(&|d| d.index.clone()),
                per(&|d| d.uuid.chars().take(12).collect()),
                per(&|d| fig(Some(d.usage.used))),
                per(&|d| d.limit.map_or("-".into(), |l| size(l, true))),
                per(&|d| share(d)),
                per(&|d| fig(d.usage.peak)),
                per(&|d| {
                    d.usage
                        .refusals
                        .filter(|_| !broken)
                        .map_or("?".into(), |r| r.to_string())
                }),
                if broken {
                    "?".into()
                } else {
                    c.pids.len().to_string()
                },
            ]
        })
        .collect();
    let mut width = HEADERS.map(str::len);
    for r in &rows {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(width).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(&HEADERS.map(String::from));
    for r in &rows {
        out.push_str(&line(r));
    }
    out
}

/// The device's share: `1/4` time-slicing replicas, else its compute share (`30%`), else `-`.
fn share(d: &super::read::DeviceStatus) -> String {
    match (d.replicas, d.cores) {
        (Some(r), _) => format!("{}/{}", r.held, r.of),
        (None, Some(c)) => format!("{c}%"),
        (None, None) => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::DeviceStatus;
    use crate::region::DeviceUsage;

    #[test]
    fn aligned_rows() {
        let dev = |i: &str, used| DeviceStatus {
            ordinal: 0,
            index: i.into(),
            uuid: "GPU-2f5d1c3a-0000-1111".into(),
            limit: Some(4 << 30),
            cores: None,
            replicas: (i == "0").then_some(crate::meta::Replicas { held: 1, of: 4 }),
            usage: DeviceUsage {
                used,
                peak: Some(used),
                refusals: Some(1),
                last_refused: Some(1 << 30),
                compute_ns: None,
            },
        };
        let c = ContainerStatus {
            id: "0123456789abcdef".into(),
            namespace: Some("team-a".into()),
            pod: Some("trainer-0".into()),
            container: None,
            created: 0,
            devices: vec![dev("0", 3 << 29), dev("1:2", 0)],
            pids: vec![5, 9],
            error: None,
        };
        let broken = ContainerStatus {
            id: "b".into(),
            error: Some("bad".into()),
            devices: vec![dev("3", 0)],
            ..c.clone()
        };
        let t = table(&[c, broken]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        let col = |l: &str| {
            l.find("USED")
                .or_else(|| l.find("1.5 GiB,0 B"))
                .or_else(|| l.find("?,"))
        };
        assert!(lines[1].starts_with("0123456789ab  team-a"), "{t}");
        assert!(
            lines[1].contains("0,1:2") && lines[1].contains("1.5 GiB,0 B"),
            "{t}"
        );
        assert!(
            lines[1].contains("4 GiB,4 GiB  1/4,-  ") && lines[1].ends_with("  2"),
            "{t}"
        );
        assert_eq!(col(lines[0]), col(lines[1]), "{t}");
        assert!(lines[2].ends_with("?") && lines[2].contains("  ?  "), "{t}");
    }
}
