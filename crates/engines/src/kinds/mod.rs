//! One type per container engine behind one trait, [`EngineConfig`]: [`Containerd`] (its config
//! versions [`containerd::ConfigV2`], [`containerd::ConfigV3`], [`containerd::ConfigV4`]),
//! [`Crio`] and [`Docker`]. Each answers in one place where its runtime handler, NRI settings,
//! CDI directories and pod-annotation allow-list live, and how its files are written and given
//! back. [`crate::configure`], [`crate::unconfigure`], [`crate::install`] and the CDI-directory
//! check ask [`Engine::config`] and nothing else. (Modelled on the one-interface-per-engine
//! layout of NVIDIA container-toolkit's `pkg/config/engine`.)

pub mod containerd;
pub mod crio;
pub mod docker;
pub mod engine_config;

pub use containerd::Containerd;
pub use crio::Crio;
pub use docker::Docker;
pub use engine_config::{EngineConfig, HangupReload, Identity, PodAnnotations};

use crate::engine::Engine;

impl Engine {
    /// The type that answers for this engine.
    pub fn config(self) -> &'static dyn EngineConfig {
        match self {
            Engine::Containerd => &Containerd,
            Engine::Crio => &Crio,
            Engine::Docker => &Docker,
        }
    }
    /// The engine's name, as messages say it.
    pub fn name(self) -> &'static str {
        self.config().identity().name
    }
    /// The engine's main configuration file, by default.
    pub fn default_config(self) -> &'static str {
        self.config().identity().default_config
    }
    /// What to restart so that the engine loads a changed configuration.
    pub fn restart_hint(self) -> &'static str {
        self.config().identity().restart_hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every engine answers under its own name, and its record key is the CLI value.
    #[test]
    fn each_engine_value_names_its_type() {
        for (e, id, name) in [
            (Engine::Containerd, "containerd", "containerd"),
            (Engine::Crio, "crio", "CRI-O"),
            (Engine::Docker, "docker", "docker"),
        ] {
            assert_eq!(e.config().identity().id, id);
            assert_eq!(e.name(), name);
            assert_eq!(
                serde_json::to_value(e).unwrap(),
                serde_json::Value::from(id)
            );
            assert!(e.default_config().starts_with("/etc/"));
            assert!(e.restart_hint().contains("gpufence runtime"));
        }
    }
}
