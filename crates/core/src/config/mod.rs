//! `/etc/gpufence/config.toml`: the node's policy and where the driver lives.
//!
//! Keys are the contract in docs/contract.md; unknown keys are rejected so that a typo never
//! silently weakens the policy.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Default location of the configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpufence/config.toml";
/// Environment variable that overrides the configuration path.
pub const CONFIG_ENV: &str = "GPUFENCE_CONFIG";
/// The NRI plugin index gpufence registers with (pre-registered file name and DaemonSet): late, so
/// that gpufence sees the container as every earlier plugin left it (their env, mounts,
/// devices) and no later plugin can silently take back what gpufence set — NRI refuses a
/// second plugin's adjustment of a mount, device or env variable another plugin claimed.
pub const NRI_PLUGIN_INDEX: &str = "90";

/// The whole node configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// Where the driver's libraries and binaries are found.
    pub driver_root: PathBuf,
    /// Where `/dev/nvidia*` are found.
    pub dev_root: PathBuf,
    /// Where `/proc/driver/nvidia` is found (MIG capability minors). Extension of the contract.
    pub proc_root: PathBuf,
    /// NVML to load.
    pub nvml_library: String,
    /// Host directory holding per-container accounting and the inventory cache.
    pub state_dir: PathBuf,
    /// The installed `gpufence` binary, named in the hooks gpufence adds to containers
    /// (ldcache refresh). Extension of the contract.
    pub gpufence_binary: PathBuf,
    pub runtime: RuntimeConfig,
    pub allocation: AllocationConfig,
    pub shim: ShimConfig,
    pub log: LogConfig,
    pub gpushare: GpushareConfig,
    /// `quota.backend`: how memory quotas are enforced (shim, driver, both, auto).
    pub quota: QuotaConfig,
    /// `sharing.mps`: GPUs shared through MPS control daemons.
    pub sharing: SharingConfig,
    pub kubelet: KubeletConfig,
    /// `[cdi]`: where the engine's CDI specs are.
    pub cdi: CdiConfig,
    pub timeouts: TimeoutsConfig,
    /// Where this file was read from (not a key).
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            driver_root: PathBuf::from("/"),
            dev_root: PathBuf::from("/"),
            proc_root: PathBuf::from("/"),
            nvml_library: "libnvidia-ml.so.1".to_string(),
            state_dir: PathBuf::from("/run/gpufence"),
            gpufence_binary: PathBuf::from("/usr/bin/gpufence"),
            runtime: RuntimeConfig::default(),
            allocation: AllocationConfig::default(),
            shim: ShimConfig::default(),
            log: LogConfig::default(),
            gpushare: GpushareConfig::default(),
            quota: QuotaConfig::default(),
            sharing: SharingConfig::default(),
            kubelet: KubeletConfig::default(),
            cdi: CdiConfig::default(),
            timeouts: TimeoutsConfig::default(),
            source: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// The real OCI runtime; `None` means the first of `runc`, `crun` on PATH.
    pub path: Option<PathBuf>,
    /// How every applier mounts driver libraries, binaries and firmware.
    pub driver_layout: DriverLayout,
    /// Host directory where the `folders` layout keeps its prepared folders (hard links of the
    /// driver's own files; must be on the driver's filesystem).
    pub driver_folders: PathBuf,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            path: None,
            driver_layout: DriverLayout::default(),
            driver_folders: PathBuf::from("/var/lib/gpufence/driver-folders"),
        }
    }
}

/// `runtime.driver-layout`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriverLayout {
    /// Every driver file bound read-only at its own path, as on the host (as NVIDIA's toolkit
    /// does): every tool finds every file where it expects it; `gpufence nri` and the CDI spec
    /// refresh the ld cache with a createContainer hook (`gpufence hook update-ldcache`).
    Files,
    /// One read-only bind per folder: libraries at `/usr/local/nvidia/lib64`, binaries at
    /// `/usr/local/nvidia/bin` (appended to `PATH`; the runtime and hook mode also link them at
    /// their host paths), firmware at its own folder; runc makes a handful of mounts instead of
    /// one per file, and no applier runs a process per container for the ld cache (`gpufence
    /// nri` and the CDI spec name the library folder in `LD_LIBRARY_PATH`). The default.
    #[default]
    Folders,
}

/// The allocation dialects gpufence understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    Gpufence,
    Cdi,
    Hami,
    Gpushare,
    Nvidia,
    /// KAI scheduler's NvFractions pod annotations (`nvidia.com/container.<name>.*`).
    Kai,
    /// Koordinator's `scheduling.koordinator.sh/device-allocated` pod annotation (and the env
    /// koordlet adds beside it, which must agree).
    Koordinator,
    /// Volcano vGPU's `volcano.sh/vgpu-ids-new` pod annotation (HAMi's format).
    Volcano,
    /// GPU device nodes already in the spec (device plugins' DeviceSpecs and CDI devices, DRA
    /// claims, `--device`): always read, whatever `allocation.dialects` says
    /// ([`crate::allocation::spec_devices`]).
    Devices,
}

impl Dialect {
    pub const ALL: [Dialect; 8] = [
        Dialect::Gpufence,
        Dialect::Cdi,
        Dialect::Hami,
        Dialect::Gpushare,
        Dialect::Nvidia,
        Dialect::Kai,
        Dialect::Koordinator,
        Dialect::Volcano,
    ];
    /// Dialects whose allocation is read from the process environment.
    pub fn is_env_based(self) -> bool {
        matches!(self, Dialect::Hami | Dialect::Gpushare | Dialect::Nvidia)
    }
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Gpufence => "gpufence",
            Dialect::Cdi => "cdi",
            Dialect::Hami => "hami",
            Dialect::Gpushare => "gpushare",
            Dialect::Nvidia => "nvidia",
            Dialect::Kai => "kai",
            Dialect::Koordinator => "koordinator",
            Dialect::Volcano => "volcano",
            Dialect::Devices => "devices",
        }
    }
}

impl std::fmt::Display for Dialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `allocation.trust-env`: a bool, a list of dialect names, or `"kubelet"` (the default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TrustEnv {
    All(bool),
    Dialects(Vec<Dialect>),
    /// Env-borne allocations are believed exactly as far as kubelet's device-manager checkpoint
    /// records that a device plugin put them into this container; like `false` without kubelet.
    Kubelet(KubeletKeyword),
}

/// The string `"kubelet"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KubeletKeyword {
    #[serde(rename = "kubelet")]
    Kubelet,
}

impl Default for TrustEnv {
    fn default() -> Self {
        TrustEnv::Kubelet(KubeletKeyword::Kubelet)
    }
}

impl TrustEnv {
    /// Believed from the env alone (whatever kubelet recorded).
    pub fn trusts(&self, d: Dialect) -> bool {
        match self {
            TrustEnv::All(b) => *b,
            TrustEnv::Dialects(list) => list.contains(&d),
            TrustEnv::Kubelet(_) => false,
        }
    }
    /// `"kubelet"`: believed where kubelet's record confirms it.
    pub fn is_kubelet(&self) -> bool {
        matches!(self, TrustEnv::Kubelet(_))
    }
}

/// `allocation.trust-annotations`: `"kubelet"` (the default), `"admission"` or `true`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TrustAnnotations {
    /// On CRI containers, annotation grants only within kubelet's record for the container
    /// (device-plugin checkpoint, DRA state).
    #[default]
    Kubelet,
    /// Believed: the operator applied gpufence's admission policy
    /// (`packaging/k8s/admission-policy.yaml`), so only listed scheduler accounts write them.
    Admission,
    /// Believed as written (single-tenant hosts, tests). Written `true`.
    Believed,
}

impl Serialize for TrustAnnotations {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TrustAnnotations::Kubelet => s.serialize_str("kubelet"),
            TrustAnnotations::Admission => s.serialize_str("admission"),
            TrustAnnotations::Believed => s.serialize_bool(true),
        }
    }
}

impl<'de> Deserialize<'de> for TrustAnnotations {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Word(String),
        }
        const EXPECTED: &str = "expected \"kubelet\", \"admission\" or true";
        match Raw::deserialize(d)
            .map_err(|_| serde::de::Error::custom(format!("trust-annotations: {EXPECTED}")))?
        {
            Raw::Bool(true) => Ok(TrustAnnotations::Believed),
            Raw::Word(w) if w == "kubelet" => Ok(TrustAnnotations::Kubelet),
            Raw::Word(w) if w == "admission" => Ok(TrustAnnotations::Admission),
            Raw::Bool(false) => Err(serde::de::Error::custom(format!(
                "trust-annotations = false is not a mode (annotations are how schedulers speak); \
                 {EXPECTED}"
            ))),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "trust-annotations = {:?}: {EXPECTED}",
                crate::text::short(&w)
            ))),
        }
    }
}

impl TrustAnnotations {
    /// The value as written in `config.toml`.
    pub fn as_toml(self) -> &'static str {
        match self {
            TrustAnnotations::Kubelet => "\"kubelet\"",
            TrustAnnotations::Admission => "\"admission\"",
            TrustAnnotations::Believed => "true",
        }
    }
}

/// `[kubelet]`: where kubelet keeps what the device plugins allocated. Extension of the contract.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct KubeletConfig {
    /// kubelet's device-manager checkpoint.
    pub checkpoint: PathBuf,
    /// kubelet's DRA state (claims, their pods and CDI device ids).
    pub dra_checkpoint: PathBuf,
}

/// The static and dynamic spec directories, with their priority (the dynamic one wins).
pub use gpufence_records::cdi::parse::DEFAULT_SPEC_DIRS as DEFAULT_CDI_SPEC_DIRS;

/// `[cdi]`: the CDI spec directories the engine resolves CDI devices from (containerd's and
/// CRI-O's `cdi_spec_dirs`; `gpufence runtime configure` writes the engine's). Later
/// directories win a conflict, as in the engines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct CdiConfig {
    pub spec_dirs: Vec<PathBuf>,
}

impl Default for CdiConfig {
    fn default() -> Self {
        CdiConfig {
            spec_dirs: DEFAULT_CDI_SPEC_DIRS
                .iter()
                .map(|(d, _)| PathBuf::from(d))
                .collect(),
        }
    }
}

impl CdiConfig {
    /// The directories with their priority (later wins).
    pub fn dirs(&self) -> Vec<(PathBuf, u8)> {
        self.spec_dirs
            .iter()
            .enumerate()
            .map(|(i, d)| (d.clone(), u8::try_from(i).unwrap_or(u8::MAX)))
            .collect()
    }
}

/// Where kubelet (default `--root-dir`) writes its device-manager checkpoint.
pub const DEFAULT_KUBELET_CHECKPOINT: &str =
    "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";

/// Where kubelet (default `--root-dir`) writes its DRA state (`kubelet.dra-checkpoint`).
pub use gpufence_records::kubelet::dra::DEFAULT_PATH as DEFAULT_KUBELET_DRA_CHECKPOINT;

impl Default for KubeletConfig {
    fn default() -> Self {
        KubeletConfig {
            checkpoint: PathBuf::from(DEFAULT_KUBELET_CHECKPOINT),
            dra_checkpoint: PathBuf::from(DEFAULT_KUBELET_DRA_CHECKPOINT),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct AllocationConfig {
    /// Which dialects are read.
    pub dialects: Vec<Dialect>,
    /// Honour allocations expressed in the process env.
    pub trust_env: TrustEnv,
    /// Honour allocation annotations of podman (libpod) containers, which podman copies from
    /// the image ([`crate::allocation::libpod`]). Extension of the contract.
    pub trust_libpod_annotations: bool,
    /// Who may grant GPUs by annotation on a CRI container ([`crate::allocation::backing`]).
    pub trust_annotations: TrustAnnotations,
    /// GPU device nodes in the spec of a container not created through CRI (podman
    /// `--device`, docker `--gpus`): fenced as whole GPUs, or refused.
    pub non_cri_devices: NonCriDevices,
}

/// `allocation.non-cri-devices`: what a GPU device node in the spec of a container that no
/// kubelet record can back (not created through CRI) becomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NonCriDevices {
    /// The device is the container's allocation: exact nodes, driver files, shim, and a quota of
    /// the whole GPU (narrowed by gpufence's annotations where those are believed).
    #[default]
    Fence,
    /// The container is refused.
    Refuse,
}

impl Default for AllocationConfig {
    fn default() -> Self {
        AllocationConfig {
            dialects: Dialect::ALL.to_vec(),
            trust_env: TrustEnv::default(),
            trust_libpod_annotations: false,
            trust_annotations: TrustAnnotations::default(),
            non_cri_devices: NonCriDevices::default(),
        }
    }
}

impl AllocationConfig {
    pub fn enabled(&self, d: Dialect) -> bool {
        self.dialects.contains(&d)
    }
    /// Enabled and (for env-based dialects) trusted.
    pub fn honours(&self, d: Dialect) -> bool {
        self.enabled(d) && (!d.is_env_based() || self.trust_env.trusts(d))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShimInject {
    #[serde(rename = "ld.so.preload")]
    LdSoPreload,
    #[serde(rename = "env")]
    Env,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct ShimConfig {
    /// The interception shim to inject (host path).
    pub library: PathBuf,
    pub inject: ShimInject,
    /// The shim explains a refused allocation with one line on the process's stderr (once per
    /// process); `false` writes `refusal-messages=0` into the quota file.
    pub refusal_messages: bool,
}

impl Default for ShimConfig {
    fn default() -> Self {
        ShimConfig {
            library: PathBuf::from("/usr/lib/gpufence/libgpufence.so"),
            inject: ShimInject::LdSoPreload,
            refusal_messages: true,
        }
    }
}

impl ShimConfig {
    /// True when the configured shim is HAMi-core's `libvgpu.so` (compatibility variables).
    pub fn is_hami_core(&self) -> bool {
        self.library.to_str().is_some_and(is_hami_core_library)
    }
}

/// Whether a library path (or an `LD_PRELOAD` entry) names HAMi-core's `libvgpu.so`, any
/// version suffix: the one answer the shim setting and the dialects that meet koordlet's
/// injection share.
pub fn is_hami_core_library(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|name| name.starts_with("libvgpu.so"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct LogConfig {
    pub file: PathBuf,
    pub level: String,
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            file: PathBuf::from("/var/log/gpufence.log"),
            level: "info".to_string(),
            format: LogFormat::Text,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemoryUnit {
    GiB,
    MiB,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct GpushareConfig {
    /// Unit of `ALIYUN_COM_GPU_MEM_*` values.
    pub memory_unit: MemoryUnit,
}

impl Default for GpushareConfig {
    fn default() -> Self {
        GpushareConfig {
            memory_unit: MemoryUnit::GiB,
        }
    }
}

pub mod error;
pub mod quota;
pub mod sharing;

pub use error::ConfigError;
pub use quota::{QuotaBackend, QuotaConfig};
pub use sharing::{CoresPolicy, MpsConfig, ReplicasPolicy, SharingConfig};

/// `[timeouts]`: deadlines, in seconds, of the child processes gpufence starts ([`crate::child`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct TimeoutsConfig {
    /// The namespace / ld cache worker (hook and runtime) and `runc --version`.
    pub worker: f64,
    /// A `gpufence inventory` rescan started by the hook when the cache is stale (NVML).
    pub inventory: f64,
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        TimeoutsConfig {
            worker: 5.0,
            inventory: 30.0,
        }
    }
}

impl TimeoutsConfig {
    /// Longest deadline accepted (a hook runs under the engine's own hook timeout).
    pub const MAX_SECONDS: f64 = 600.0;
    pub fn worker(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.worker)
    }
    pub fn inventory(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.inventory)
    }
}

impl Config {
    /// Parse a configuration from TOML text; `path` only names the input in errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let mut cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.message().to_string(),
        })?;
        cfg.source = Some(path.to_path_buf());
        cfg.validate()?;
        Ok(cfg)
    }

    /// Load from an explicit path, else `$GPUFENCE_CONFIG`, else the default path. A missing
    /// default file means the defaults; a missing explicit file is an error.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        let env = std::env::var_os(CONFIG_ENV).map(PathBuf::from);
        let (path, required) = match (explicit, env) {
            (Some(p), _) => (p.to_path_buf(), true),
            (None, Some(p)) => (p, true),
            (None, None) => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Config::from_toml(&text, &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                Ok(Config::default())
            }
            Err(source) => Err(ConfigError::Read { path, source }),
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let path = self.source.clone().unwrap_or_default();
        for (key, p) in [
            ("driver-root", &self.driver_root),
            ("dev-root", &self.dev_root),
            ("proc-root", &self.proc_root),
            ("state-dir", &self.state_dir),
            ("gpufence-binary", &self.gpufence_binary),
            ("shim.library", &self.shim.library),
            ("kubelet.checkpoint", &self.kubelet.checkpoint),
            ("kubelet.dra-checkpoint", &self.kubelet.dra_checkpoint),
            ("runtime.driver-folders", &self.runtime.driver_folders),
        ] {
            if !p.is_absolute() {
                return Err(ConfigError::Invalid {
                    path,
                    key,
                    value: p.display().to_string(),
                    why: "must be an absolute path",
                });
            }
        }
        if let Some(p) = self.cdi.spec_dirs.iter().find(|p| !p.is_absolute()) {
            return Err(ConfigError::Invalid {
                path,
                key: "cdi.spec-dirs",
                value: p.display().to_string(),
                why: "every directory must be an absolute path",
            });
        }
        self.sharing.validate(&path)?;
        for (key, v) in [
            ("timeouts.worker", self.timeouts.worker),
            ("timeouts.inventory", self.timeouts.inventory),
        ] {
            if !(v > 0.0 && v <= TimeoutsConfig::MAX_SECONDS) {
                return Err(ConfigError::Invalid {
                    path,
                    key,
                    value: v.to_string(),
                    why: "must be a number of seconds above 0 and at most 600",
                });
            }
        }
        const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
        let level_ok = LEVELS.contains(&self.log.level.to_ascii_lowercase().as_str())
            || (self.log.level.contains('=')
                && tracing_subscriber::EnvFilter::try_new(&self.log.level).is_ok());
        if !level_ok {
            return Err(ConfigError::Invalid {
                path,
                key: "log.level",
                value: self.log.level.clone(),
                why: "not a log level or filter (error, warn, info, debug, trace)",
            });
        }
        Ok(())
    }

    /// Host path of something under `dev-root` (`p` is absolute, e.g. `/dev/nvidia0`).
    pub fn dev_path(&self, p: &str) -> PathBuf {
        join_root(&self.dev_root, p)
    }
    /// Host path of something under `driver-root`.
    pub fn driver_path(&self, p: &str) -> PathBuf {
        join_root(&self.driver_root, p)
    }
    /// Host path of something under `proc-root`.
    pub fn proc_path(&self, p: &str) -> PathBuf {
        join_root(&self.proc_root, p)
    }
    /// Host directory of one container's state.
    pub fn container_state_dir(&self, container_id: &str) -> PathBuf {
        self.state_dir.join(container_id)
    }
}

/// Join an absolute path under a root (`/` root gives the path unchanged).
pub fn join_root(root: &Path, p: &str) -> PathBuf {
    root.join(p.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_design() {
        let c = Config::default();
        assert_eq!(c.driver_root, PathBuf::from("/"));
        assert_eq!(c.nvml_library, "libnvidia-ml.so.1");
        assert_eq!(c.state_dir, PathBuf::from("/run/gpufence"));
        assert_eq!(c.shim.inject, ShimInject::LdSoPreload);
        assert!(!c.allocation.trust_env.trusts(Dialect::Nvidia));
        assert!(c.allocation.honours(Dialect::Gpufence));
        assert!(!c.allocation.honours(Dialect::Hami));
    }

    #[test]
    fn parses_all_keys() {
        let t = r#"
driver-root = "/sim/driver"
dev-root = "/sim"
nvml-library = "/sim/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
state-dir = "/sim/state"
[runtime]
path = "/usr/sbin/runc"
[allocation]
dialects = ["gpufence", "cdi", "hami"]
trust-env = ["hami"]
[shim]
library = "/usr/local/vgpu/libvgpu.so"
inject = "env"
[log]
file = "/sim/gpufence.log"
level = "debug"
format = "json"
[gpushare]
memory-unit = "MiB"
[timeouts]
worker = 2.5
inventory = 60
"#;
        let c = Config::from_toml(t, Path::new("x.toml")).unwrap();
        assert_eq!(
            c.dev_path("/dev/nvidia0"),
            PathBuf::from("/sim/dev/nvidia0")
        );
        assert!(c.allocation.honours(Dialect::Hami));
        assert!(!c.allocation.honours(Dialect::Nvidia));
        assert!(!c.allocation.enabled(Dialect::Gpushare));
        assert_eq!(c.shim.inject, ShimInject::Env);
        assert!(c.shim.is_hami_core());
        assert_eq!(c.log.format, LogFormat::Json);
        assert_eq!(c.gpushare.memory_unit, MemoryUnit::MiB);
        assert_eq!(c.timeouts.worker(), std::time::Duration::from_millis(2500));
        assert_eq!(c.timeouts.inventory(), std::time::Duration::from_secs(60));
        let c = Config::from_toml("[allocation]\ntrust-env = true\n", Path::new("x")).unwrap();
        assert!(c.allocation.honours(Dialect::Nvidia));
    }

    #[test]
    fn trust_env_kubelet_is_the_default_and_parses() {
        assert!(Config::default().allocation.trust_env.is_kubelet());
        let c = Config::from_toml(
            "[allocation]\ntrust-env = \"kubelet\"\n[kubelet]\ncheckpoint = \"/k/cp\"\n",
            Path::new("x"),
        )
        .unwrap();
        assert!(c.allocation.trust_env.is_kubelet());
        assert!(!c.allocation.honours(Dialect::Hami));
        assert_eq!(c.kubelet.checkpoint, PathBuf::from("/k/cp"));
        assert_eq!(
            c.kubelet.dra_checkpoint,
            PathBuf::from("/var/lib/kubelet/dra_manager_state")
        );
        let c =
            Config::from_toml("[kubelet]\ndra-checkpoint = \"/k/dra\"\n", Path::new("x")).unwrap();
        assert_eq!(c.kubelet.dra_checkpoint, PathBuf::from("/k/dra"));
        for bad in ["dra-checkpoint = \"k/dra\"", "dra_checkpoint = \"/k/dra\""] {
            let t = format!("[kubelet]\n{bad}\n");
            assert!(Config::from_toml(&t, Path::new("x")).is_err(), "{bad}");
        }
        for bad in ["\"kubelets\"", "\"true\"", "1"] {
            let t = format!("[allocation]\ntrust-env = {bad}\n");
            assert!(Config::from_toml(&t, Path::new("x")).is_err(), "{bad}");
        }
        let c = Config::from_toml("[allocation]\ntrust-env = false\n", Path::new("x")).unwrap();
        assert!(!c.allocation.trust_env.is_kubelet());
    }

    #[test]
    fn trust_annotations_kubelet_is_the_default_and_parses() {
        assert_eq!(
            Config::default().allocation.trust_annotations,
            TrustAnnotations::Kubelet
        );
        for (text, want) in [
            ("\"kubelet\"", TrustAnnotations::Kubelet),
            ("\"admission\"", TrustAnnotations::Admission),
            ("true", TrustAnnotations::Believed),
        ] {
            let t = format!("[allocation]\ntrust-annotations = {text}\n");
            let c = Config::from_toml(&t, Path::new("x")).unwrap();
            assert_eq!(c.allocation.trust_annotations, want, "{text}");
            assert_eq!(want.as_toml(), text);
            // It writes back as it was read.
            let back = toml::to_string(&c).unwrap();
            assert!(
                back.contains(&format!("trust-annotations = {text}")),
                "{back}"
            );
        }
        for bad in [
            "false",
            "\"true\"",
            "\"Kubelet\"",
            "1",
            "[\"kubelet\"]",
            "\"\"",
        ] {
            let t = format!("[allocation]\ntrust-annotations = {bad}\n");
            let e = Config::from_toml(&t, Path::new("c.toml")).unwrap_err();
            let e = e.to_string();
            assert!(
                e.contains("c.toml") && e.contains("trust-annotations") && !e.contains('\n'),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn rejects_unknown_and_relative() {
        let e = Config::from_toml("drvier-root = \"/x\"\n", Path::new("c.toml")).unwrap_err();
        assert!(e.to_string().contains("c.toml"), "{e}");
        let e = Config::from_toml("dev-root = \"rel\"\n", Path::new("c.toml")).unwrap_err();
        assert!(e.to_string().contains("dev-root"), "{e}");
        let e = Config::from_toml("[log]\nlevel = \"loud!!\"\n", Path::new("c.toml")).unwrap_err();
        assert!(e.to_string().contains("log.level"), "{e}");
        for bad in ["0", "-1", "601", "nan"] {
            let e = Config::from_toml(
                &format!("[timeouts]\nworker = {bad}\n"),
                Path::new("c.toml"),
            )
            .unwrap_err();
            assert!(e.to_string().contains("timeouts.worker"), "{bad}: {e}");
        }
        assert_eq!(
            Config::default().timeouts.worker(),
            std::time::Duration::from_secs(5)
        );
    }

    #[test]
    fn replica_keys_default_parse_and_refuse_other_values() {
        let d = Config::default();
        assert_eq!(d.sharing.replicas, ReplicasPolicy::Equal);
        assert_eq!(d.sharing.replica_cores_policy, CoresPolicy::Burst);
        let c = Config::from_toml(
            "[sharing]\nreplicas = \"off\"\nreplica-cores-policy = \"hard\"\n",
            Path::new("c.toml"),
        )
        .unwrap();
        assert_eq!(c.sharing.replicas, ReplicasPolicy::Off);
        assert_eq!(c.sharing.replica_cores_policy, CoresPolicy::Hard);
        for bad in [
            "[sharing]\nreplicas = \"half\"\n",
            "[sharing]\nreplica-cores-policy = \"soft\"\n",
        ] {
            let e = Config::from_toml(bad, Path::new("c.toml")).unwrap_err();
            assert!(e.to_string().contains("c.toml"), "{e}");
        }
    }
}
