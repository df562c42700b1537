//! The NRI applier's engine-independent part (`gpufence install --mode nri`,
//! `gpufence runtime configure --mode nri`): the name its configuration is kept under, and the
//! pre-registered plugin — [`wrapper`], the executable the runtime starts from its plugin
//! directory as `<index>-<name>` ([`plugin_file`]), with the connection on fd 3.
//!
//! What each engine's files hold for NRI (containerd's `plugins.'io.containerd.nri.v1.nri'`
//! drop-in with its default validator, config version 3 or 4; CRI-O's `crio.conf.d` drop-in with
//! `[crio.nri.default_validator]`) and where it looks for pre-registered plugins is the engine
//! type's answer: [`crate::kinds`] (`EngineConfig::nri`, `EngineConfig::nri_plugin_dir`).

use std::path::Path;

/// NRI's default directory of pre-registered plugins.
pub const DEFAULT_PLUGIN_PATH: &str = "/opt/nri/plugins";
pub use gpufence_core::config::NRI_PLUGIN_INDEX as PLUGIN_INDEX;

/// The name the configuration for plugin `name` is kept under (drop-in, record): `<name>-nri`.
pub fn config_name(name: &str) -> String {
    format!("{name}-nri")
}

/// The pre-registered plugin's file name: `<index>-<name>`.
pub fn plugin_file(name: &str) -> String {
    format!("{PLUGIN_INDEX}-{name}")
}

/// The executable the runtime starts as the pre-registered plugin: absolute paths (it gives it
/// no `PATH` and no `GPUFENCE_CONFIG`), the configuration named.
pub fn wrapper(gpufence: &Path, config: &Path) -> String {
    format!(
        "#!/bin/sh\n\
         # Written by `gpufence install --mode nri`: the gpufence NRI plugin, started by\n\
         # the runtime with its connection on fd 3 (NRI_PLUGIN_SOCKET).\n\
         exec {} --config {} nri\n",
        gpufence.display(),
        config.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_file_and_wrapper() {
        assert_eq!(plugin_file("gpufence"), "90-gpufence");
        let w = wrapper(
            Path::new("/usr/bin/gpufence"),
            Path::new("/etc/gpufence/config.toml"),
        );
        assert!(w.starts_with("#!/bin/sh\n"));
        assert!(w.ends_with("exec /usr/bin/gpufence --config /etc/gpufence/config.toml nri\n"));
    }
}
