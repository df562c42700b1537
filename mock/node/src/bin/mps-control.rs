//! Mock `nvidia-cuda-mps-control` of the simulated node: `-d` starts the control daemon in the
//! background (`-f`: in the foreground) at `CUDA_MPS_PIPE_DIRECTORY` (default
//! `/tmp/nvidia-mps`); with no argument it is the control client: commands on stdin, one a line,
//! answers on stdout — as the real program. The protocol is in `gpufence_mock_node::mps`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};

use gpufence_mock_node::mps::{self, Control};

struct Defaults {
    thread_pct: String,
    pinned: std::collections::BTreeMap<u32, String>,
}

fn answer(cmd: &str, d: &Mutex<Defaults>) -> Option<String> {
    let mut d = d.lock().unwrap_or_else(|e| e.into_inner());
    let parts: Vec<&str> = cmd.split_whitespace().collect();
    Some(match parts.as_slice() {
        ["get_default_active_thread_percentage"] => d.thread_pct.clone(),
        ["set_default_active_thread_percentage", p] => match p.parse::<f64>() {
            Ok(v) if v > 0.0 && v <= 100.0 => {
                d.thread_pct = format!("{v:.1}");
                String::new()
            }
            _ => format!("Invalid percentage {p}"),
        },
        ["get_default_device_pinned_mem_limit", dev] => match dev.parse::<u32>() {
            Ok(i) => d.pinned.get(&i).cloned().unwrap_or_else(|| "0".into()),
            Err(_) => format!("Invalid device {dev}"),
        },
        ["set_default_device_pinned_mem_limit", dev, v] => {
            match (dev.parse::<u32>(), mps::parse_size(v)) {
                (Ok(i), Some(_)) => {
                    d.pinned.insert(i, v.to_string());
                    String::new()
                }
                _ => format!("Invalid arguments {dev} {v}"),
            }
        }
        ["quit"] => return None,
        _ => format!("Unknown command {cmd}"),
    })
}

fn serve(s: UnixStream, d: Arc<Mutex<Defaults>>, dir: std::path::PathBuf) {
    let Ok(w) = s.try_clone() else { return };
    let mut w = w;
    for line in BufReader::new(s).lines() {
        let Ok(line) = line else { return };
        match answer(&line, &d) {
            Some(a) => {
                if writeln!(w, "{a}").is_err() {
                    return;
                }
            }
            None => {
                let _ = writeln!(w);
                let _ = std::fs::remove_file(dir.join(mps::CONTROL));
                let _ = std::fs::remove_file(dir.join(mps::PID_FILE));
                std::process::exit(0);
            }
        }
    }
}

fn daemon(background: bool) -> i32 {
    let dir = mps::pipe_dir();
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("nvidia-cuda-mps-control: {}: {e}", dir.display());
        return 1;
    }
    let sock = dir.join(mps::CONTROL);
    if Control::connect(&dir).is_ok() {
        eprintln!("An instance of this daemon is already running");
        return 1;
    }
    let _ = std::fs::remove_file(&sock);
    let listener = match UnixListener::bind(&sock) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("nvidia-cuda-mps-control: {}: {e}", sock.display());
            return 1;
        }
    };
    if background {
        // SAFETY: fork in a single-threaded process; the child only continues this function.
        match unsafe { libc::fork() } {
            -1 => return 1,
            0 => {
                // SAFETY: setsid has no preconditions; dup2 onto the standard descriptors of
                // /dev/null detaches the daemon from its caller's pipes.
                unsafe {
                    libc::setsid();
                    let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                    if null >= 0 {
                        for fd in 0..3 {
                            libc::dup2(null, fd);
                        }
                    }
                }
            }
            _ => return 0,
        }
    }
    let _ = std::fs::write(dir.join(mps::PID_FILE), format!("{}\n", std::process::id()));
    let d = Arc::new(Mutex::new(Defaults {
        thread_pct: "100.0".into(),
        pinned: Default::default(),
    }));
    for s in listener.incoming().flatten() {
        let d = d.clone();
        let dir = dir.clone();
        std::thread::spawn(move || serve(s, d, dir));
    }
    0
}

fn client() -> i32 {
    let mut c = match Control::connect(&mps::pipe_dir()) {
        Ok(c) => c,
        Err(_) => {
            println!("Cannot find MPS control daemon process");
            return 1;
        }
    };
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { return 1 };
        if line.trim().is_empty() {
            continue;
        }
        match c.ask(&line) {
            Ok(a) if !a.is_empty() => println!("{a}"),
            Ok(_) => {}
            Err(e) => {
                if line.trim() == "quit" {
                    return 0;
                }
                eprintln!("nvidia-cuda-mps-control: {e}");
                return 1;
            }
        }
    }
    0
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("-d") => daemon(true),
        Some("-f") => daemon(false),
        None => client(),
        Some(a) => {
            eprintln!("usage: nvidia-cuda-mps-control [-d | -f] (got {a})");
            2
        }
    };
    std::process::exit(code);
}
