//! The simulated MPS control daemon's protocol, shared by the mock `nvidia-cuda-mps-control`
//! (daemon and client, `src/bin/mps-control.rs`) and the mock CUDA (an MPS client).
//!
//! The daemon listens on the UNIX socket `<CUDA_MPS_PIPE_DIRECTORY>/control` (default
//! `/tmp/nvidia-mps`, as MPS) and writes `nvidia-cuda-mps-control.pid` beside it. It speaks the
//! documented control commands as text, one command a line, one answer line each (empty for
//! commands that print nothing): `get_default_active_thread_percentage`,
//! `set_default_active_thread_percentage <p>`, `get_default_device_pinned_mem_limit <dev>`,
//! `set_default_device_pinned_mem_limit <dev> <limit>`, `quit`. Limits are kept as given
//! (`2G`, `512M`, bytes); `get_default_device_pinned_mem_limit` of a device without one
//! answers `0` (no limit).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

pub const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";
pub const CONTROL: &str = "control";
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";

/// `CUDA_MPS_PIPE_DIRECTORY`, else MPS's default.
pub fn pipe_dir() -> PathBuf {
    std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PIPE_DIR))
}

/// A connection to the control daemon.
pub struct Control {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Control {
    pub fn connect(dir: &std::path::Path) -> std::io::Result<Control> {
        let s = UnixStream::connect(dir.join(CONTROL))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(Control {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    /// Send one command, return its answer line (without the newline).
    pub fn ask(&mut self, command: &str) -> std::io::Result<String> {
        self.writer.write_all(command.trim().as_bytes())?;
        self.writer.write_all(b"\n")?;
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the control daemon closed the connection",
            ));
        }
        Ok(line.trim_end_matches('\n').to_string())
    }
}

/// Bytes of an MPS size (`2G`, `512M`, `64K`, `1024`; suffixes are powers of 1024, `B` optional).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s.strip_suffix(['B', 'b']).unwrap_or(s);
    let (num, mul) = match s.chars().last()? {
        'G' | 'g' => (&s[..s.len() - 1], 1u64 << 30),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'K' | 'k' => (&s[..s.len() - 1], 1 << 10),
        _ => (s, 1),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    num.parse::<u64>().ok()?.checked_mul(mul)
}

/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`0=1G,1=512M`): (device, bytes) pairs; invalid items
/// are skipped.
pub fn parse_pinned_env(v: &str) -> Vec<(usize, u64)> {
    v.split(',')
        .filter_map(|item| {
            let (d, s) = item.split_once('=')?;
            Some((d.trim().parse().ok()?, parse_size(s)?))
        })
        .collect()
}

/// What a client process gets under MPS.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientLimits {
    /// Effective active thread percentage: the client's value only lowers the daemon's.
    pub active_thread_percentage: f64,
    /// Per device ordinal: the pinned memory limit (bytes), if any. The client's env value
    /// replaces the daemon default (NVIDIA does not document it as bounded by the default).
    pub pinned: Vec<Option<u64>>,
}

/// Connect to the daemon (if one is running at the client's pipe directory) and compute the
/// client's limits for `devices` ordinals. `None`: not an MPS client.
pub fn client_limits(devices: usize) -> Option<ClientLimits> {
    let mut c = Control::connect(&pipe_dir()).ok()?;
    let default_pct: f64 = c
        .ask("get_default_active_thread_percentage")
        .ok()?
        .trim()
        .parse()
        .unwrap_or(100.0);
    let env_pct = std::env::var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|p| *p > 0.0);
    let env_pinned = std::env::var("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
        .map(|v| parse_pinned_env(&v))
        .unwrap_or_default();
    let mut pinned = Vec::with_capacity(devices);
    for d in 0..devices {
        let from_env = env_pinned.iter().find(|(i, _)| *i == d).map(|(_, b)| *b);
        let default = c
            .ask(&format!("get_default_device_pinned_mem_limit {d}"))
            .ok()
            .and_then(|v| parse_size(&v))
            .filter(|b| *b > 0);
        pinned.push(from_env.or(default));
    }
    Some(ClientLimits {
        active_thread_percentage: env_pct.map_or(default_pct, |p| p.min(default_pct)),
        pinned,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("512MB"), Some(512 << 20));
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("-1M"), None);
        assert_eq!(
            parse_pinned_env("0=1G,1=512M,x=3,2=bad"),
            vec![(0, 1 << 30), (1, 512 << 20)]
        );
    }
}
