//! `gpufence cdi generate|list`.
use std::path::{Path, PathBuf};

use crate::cdigen::generate::{self, Format};
use crate::config::Config;
use crate::exit::Exit;

#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// Write the node's CDI spec (to stdout, or atomically to --output).
    Generate {
        /// Spec file to write, e.g. /etc/cdi/gpufence.yaml (default: stdout).
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Output format (default: from the --output extension, else json).
        #[arg(long, value_enum)]
        format: Option<Format>,
    },
    /// Fully qualified device names, one a line.
    List,
}

/// The spec of the node as it is now: the inventory (from its cache when valid) with device
/// numbers re-read from `dev-root`, the driver files as `runtime.driver-layout` says (the
/// folders made when `mode` is `Prepare`).
pub fn node_spec(cfg: &Config, mode: crate::driverfolders::Mode) -> Result<crate::cdi::Spec, Exit> {
    let mut inv = crate::inventory::load(cfg)?;
    crate::inventory::refresh_device_numbers(&mut inv, cfg)?;
    let mut driver = generate::driver_plan(&inv);
    crate::driverfolders::settle(cfg, &mut driver, &generate::foldable(&inv), None, mode);
    Ok(generate::generate_with(&inv, cfg, &driver))
}

pub fn run(config: Option<&Path>, cmd: Cmd) -> Result<(), Exit> {
    let cfg = Config::load(config)?;
    crate::logging::init(&cfg);
    match cmd {
        Cmd::Generate { output, format } => {
            // Check the destination before any work, so a bad path fails fast and leaves nothing.
            if let Some(p) = &output
                && let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty())
                && !dir.is_dir()
            {
                return Err(Exit::invalid(generate::GenerateError::MissingDir {
                    path: p.clone(),
                    dir: dir.to_path_buf(),
                }));
            }
            let spec = node_spec(&cfg, crate::driverfolders::Mode::Prepare)?;
            if !spec.container_edits.hooks.is_empty() && !cfg.gpufence_binary.is_file() {
                eprintln!(
                    "gpufence: warning: gpufence-binary {} does not exist: containers using this spec will fail at its ldcache hook",
                    cfg.gpufence_binary.display()
                );
            }
            let format = format
                .or_else(|| output.as_deref().map(Format::for_path))
                .unwrap_or(Format::Json);
            let text = generate::render(&spec, format).map_err(Exit::env)?;
            match output {
                None => {
                    use std::io::Write;
                    std::io::stdout()
                        .write_all(text.as_bytes())
                        .map_err(|e| Exit::env(format!("stdout: {e}")))?;
                }
                Some(p) => {
                    generate::write_atomic(&p, text.as_bytes()).map_err(Exit::invalid)?;
                    tracing::info!(
                        output = %p.display(),
                        devices = spec.devices.len(),
                        cdi_version = %spec.cdi_version,
                        "CDI spec written"
                    );
                }
            }
            Ok(())
        }
        Cmd::List => {
            let spec = node_spec(&cfg, crate::driverfolders::Mode::Name)?;
            let mut out = generate::qualified_names(&spec).join("\n");
            out.push('\n');
            print!("{out}");
            Ok(())
        }
    }
}
