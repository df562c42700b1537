//! CDI names, annotations and spec files as the CDI specification (1.1.0) and its reference
//! implementation (`cncf-tags/container-device-interface`, `pkg/parser`, `pkg/cdi`) define them.
//!
//! * qualified device names `vendor/class=name` ([`parse_qualified_name`]);
//! * `cdi.k8s.io/<name>` annotation keys ([`validate_annotation_key`]);
//! * spec files: strict parsing (unknown fields rejected), validation, and the minimum
//!   `cdiVersion` a spec's content needs ([`minimum_version`]); a spec declaring a lower version
//!   is refused, as the reference loader does;
//! * [`load_spec_dirs`]: every `*.json` / `*.yaml` spec in a list of directories, with priority
//!   (later directory wins; the same device defined twice at one priority is dropped with an error).
//!
//! Every parser here reads untrusted input: none panics, and errors are one line naming the
//! input at fault.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::spec::{ContainerEdits, LoadedSpec, Spec};

/// The annotation prefix CDI devices are requested with.
pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
/// The static and dynamic spec directories, with their priority (the dynamic one wins).
pub const DEFAULT_SPEC_DIRS: [(&str, u8); 2] = [("/etc/cdi", 0), ("/var/run/cdi", 1)];
/// Largest spec file read (a CDI spec for a whole node is a few hundred KiB).
pub const MAX_SPEC_BYTES: u64 = 8 << 20;
/// Known `cdiVersion`s, oldest first.
pub const KNOWN_VERSIONS: [&str; 8] = [
    "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];

/// A CDI failure: one line naming the input at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdiError {
    /// A qualified name, kind, device name or annotation key that breaks the syntax rules.
    #[error("{what} {value:?}: {why}")]
    Syntax {
        what: &'static str,
        value: String,
        why: String,
    },
    /// A spec file that cannot be read, parsed or validated.
    #[error("CDI spec {path}: {why}")]
    Spec { path: String, why: String },
    /// The same device defined by two spec files of the same priority.
    #[error(
        "CDI device {name:?} is defined by both {first} and {second} (same priority); both ignored"
    )]
    Conflict {
        name: String,
        first: String,
        second: String,
    },
}

fn truncate(v: &str) -> String {
    const MAX: usize = 120;
    let v = v.replace('\n', "\\n");
    if v.len() <= MAX {
        return v;
    }
    format!(
        "{}…({} bytes)",
        gpufence_ground::text::clip(&v, MAX),
        v.len()
    )
}

fn syntax(what: &'static str, value: &str, why: impl Into<String>) -> CdiError {
    CdiError::Syntax {
        what,
        value: truncate(value),
        why: why.into(),
    }
}

/// A parsed `vendor/class=name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QualifiedName {
    pub vendor: String,
    pub class: String,
    pub name: String,
}

impl QualifiedName {
    /// `vendor/class`.
    pub fn kind(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }
}

impl std::fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}={}", self.vendor, self.class, self.name)
    }
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// Vendor or class: first an ASCII letter, last alphanumeric, in between alphanumerics and
/// `_ - .`.
pub fn validate_vendor_or_class(what: &'static str, s: &str) -> Result<(), CdiError> {
    let mut chars = s.chars();
    let Some(first) = chars.next() else {
        return Err(syntax(what, s, "empty"));
    };
    if !first.is_ascii_alphabetic() {
        return Err(syntax(what, s, "must start with a letter"));
    }
    if !s.chars().last().is_some_and(is_alnum) {
        return Err(syntax(what, s, "must end with a letter or digit"));
    }
    if let Some(c) = s
        .chars()
        .find(|&c| !(is_alnum(c) || matches!(c, '_' | '-' | '.')))
    {
        return Err(syntax(what, s, format!("invalid character {c:?}")));
    }
    Ok(())
}

/// A device name: first and last alphanumeric, in between alphanumerics and `_ - . :`.
pub fn validate_device_name(s: &str) -> Result<(), CdiError> {
    const WHAT: &str = "CDI device name";
    let Some(first) = s.chars().next() else {
        return Err(syntax(WHAT, s, "empty"));
    };
    if !is_alnum(first) {
        return Err(syntax(WHAT, s, "must start with a letter or digit"));
    }
    if !s.chars().last().is_some_and(is_alnum) {
        return Err(syntax(WHAT, s, "must end with a letter or digit"));
    }
    if let Some(c) = s
        .chars()
        .find(|&c| !(is_alnum(c) || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(syntax(WHAT, s, format!("invalid character {c:?}")));
    }
    Ok(())
}

/// A kind `vendor/class`.
pub fn parse_kind(s: &str) -> Result<(String, String), CdiError> {
    let Some((vendor, class)) = s.split_once('/') else {
        return Err(syntax("CDI kind", s, "expected vendor/class"));
    };
    validate_vendor_or_class("CDI vendor", vendor)?;
    validate_vendor_or_class("CDI class", class)?;
    Ok((vendor.to_string(), class.to_string()))
}

/// A fully qualified device name `vendor/class=name`.
pub fn parse_qualified_name(s: &str) -> Result<QualifiedName, CdiError> {
    const WHAT: &str = "CDI device";
    if s.starts_with('/') {
        return Err(syntax(
            WHAT,
            s,
            "a path, not a qualified name vendor/class=name",
        ));
    }
    let Some((kind, name)) = s.split_once('=') else {
        return Err(syntax(WHAT, s, "not a qualified name vendor/class=name"));
    };
    let Some((vendor, class)) = kind.split_once('/') else {
        return Err(syntax(WHAT, s, "not a qualified name vendor/class=name"));
    };
    validate_vendor_or_class("CDI vendor", vendor)?;
    validate_vendor_or_class("CDI class", class)?;
    validate_device_name(name)?;
    Ok(QualifiedName {
        vendor: vendor.to_string(),
        class: class.to_string(),
        name: name.to_string(),
    })
}

/// A `cdi.k8s.io/<name>` annotation key: `<name>` at most 63 characters, first and last
/// alphanumeric, in between alphanumerics and `_ - .`.
pub fn validate_annotation_key(key: &str) -> Result<(), CdiError> {
    const WHAT: &str = "CDI annotation key";
    let Some(name) = key.strip_prefix(ANNOTATION_PREFIX) else {
        return Err(syntax(
            WHAT,
            key,
            format!("must start with {ANNOTATION_PREFIX}"),
        ));
    };
    if name.is_empty() {
        return Err(syntax(WHAT, key, "empty name after the prefix"));
    }
    if name.len() > 63 {
        return Err(syntax(
            WHAT,
            key,
            "name after the prefix is longer than 63 characters",
        ));
    }
    if !name.chars().next().is_some_and(is_alnum) || !name.chars().last().is_some_and(is_alnum) {
        return Err(syntax(
            WHAT,
            key,
            "name must start and end with a letter or digit",
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|&c| !(is_alnum(c) || matches!(c, '_' | '-' | '.')))
    {
        return Err(syntax(WHAT, key, format!("invalid character {c:?}")));
    }
    Ok(())
}

/// The devices of one `cdi.k8s.io/*` annotation value (a comma list of qualified names).
pub fn parse_annotation_value(value: &str) -> Result<Vec<QualifiedName>, CdiError> {
    const MAX_NAMES: usize = 1024;
    if value.split(',').nth(MAX_NAMES).is_some() {
        return Err(syntax(
            "CDI annotation value",
            value,
            format!("more than {MAX_NAMES} devices"),
        ));
    }
    value
        .split(',')
        .map(|d| parse_qualified_name(d.trim()))
        .collect()
}

fn version_index(v: &str) -> Option<usize> {
    let v = v.strip_prefix('v').unwrap_or(v);
    KNOWN_VERSIONS.iter().position(|k| *k == v)
}

/// The lowest `cdiVersion` whose field set covers everything this spec uses.
pub fn minimum_version(spec: &Spec) -> &'static str {
    let mut min = 0usize; // 0.3.0
    let mut need = |v: &str| {
        if let Some(i) = version_index(v) {
            min = min.max(i);
        }
    };
    let edits_version = |e: &ContainerEdits, need: &mut dyn FnMut(&str)| {
        if !e.net_devices.is_empty() {
            need("1.1.0");
        }
        if let Some(rdt) = &e.intel_rdt {
            need("0.7.0");
            if rdt.get("schemata").is_some() || rdt.get("enableMonitoring").is_some() {
                need("1.1.0");
            }
        }
        if !e.additional_gids.is_empty() {
            need("0.7.0");
        }
        if e.device_nodes.iter().any(|d| d.host_path.is_some()) {
            need("0.5.0");
        }
        if e.mounts.iter().any(|m| m.kind.is_some()) {
            need("0.4.0");
        }
    };
    let has = |a: &Option<BTreeMap<String, String>>| a.as_ref().is_some_and(|m| !m.is_empty());
    if has(&spec.annotations) || spec.devices.iter().any(|d| has(&d.annotations)) {
        need("0.6.0");
    }
    if spec
        .kind
        .split_once('/')
        .is_some_and(|(_, class)| class.contains('.'))
    {
        need("0.6.0");
    }
    if spec
        .devices
        .iter()
        .any(|d| d.name.starts_with(|c: char| c.is_ascii_digit()))
    {
        need("0.5.0");
    }
    edits_version(&spec.container_edits, &mut need);
    for d in &spec.devices {
        edits_version(&d.container_edits, &mut need);
    }
    KNOWN_VERSIONS[min]
}

/// A path inside the container or on the host: absolute, no `..` component, no NUL.
pub fn validate_edit_path(what: &str, p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("{what} {:?} is not absolute", truncate(p)));
    }
    if p.contains('\0') {
        return Err(format!("{what} {:?} contains NUL", truncate(p)));
    }
    if p.split('/').any(|c| c == "..") {
        return Err(format!("{what} {:?} contains ..", truncate(p)));
    }
    Ok(())
}

const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// Validate one set of container edits (paths, device types, permissions, hooks, env).
pub fn validate_edits(e: &ContainerEdits) -> Result<(), String> {
    for env in &e.env {
        match env.split_once('=') {
            Some((k, _)) if !k.is_empty() && !k.contains('\0') => {}
            _ => return Err(format!("env entry {:?} is not KEY=VALUE", truncate(env))),
        }
    }
    for d in &e.device_nodes {
        validate_edit_path("device node path", &d.path)?;
        if let Some(h) = &d.host_path {
            validate_edit_path("device node hostPath", h)?;
        }
        if let Some(t) = &d.kind
            && !matches!(t.as_str(), "" | "b" | "c" | "u" | "p")
        {
            return Err(format!(
                "device node {:?}: invalid type {:?}",
                d.path,
                truncate(t)
            ));
        }
        if let Some(p) = &d.permissions
            && p != "none"
            && !p.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))
        {
            return Err(format!(
                "device node {:?}: invalid permissions {:?}",
                d.path,
                truncate(p)
            ));
        }
        if d.major
            .is_some_and(|m| !(0..=i64::from(u32::MAX)).contains(&m))
            || d.minor
                .is_some_and(|m| !(0..=i64::from(u32::MAX)).contains(&m))
        {
            return Err(format!(
                "device node {:?}: major/minor out of range",
                d.path
            ));
        }
    }
    for m in &e.mounts {
        if m.host_path.is_empty() {
            return Err(format!(
                "mount {:?}: empty hostPath",
                truncate(&m.container_path)
            ));
        }
        validate_edit_path("mount hostPath", &m.host_path)?;
        validate_edit_path("mount containerPath", &m.container_path)?;
    }
    for h in &e.hooks {
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            return Err(format!("invalid hook name {:?}", truncate(&h.hook_name)));
        }
        validate_edit_path("hook path", &h.path)?;
    }
    if let Some(rdt) = &e.intel_rdt {
        let Some(obj) = rdt.as_object() else {
            return Err("intelRdt is not an object".to_string());
        };
        const RDT: [&str; 7] = [
            "closID",
            "l3CacheSchema",
            "memBwSchema",
            "schemata",
            "enableMonitoring",
            "enableCMT",
            "enableMBM",
        ];
        if let Some(k) = obj.keys().find(|k| !RDT.contains(&k.as_str())) {
            return Err(format!("intelRdt: unknown field {:?}", truncate(k)));
        }
    }
    for n in &e.net_devices {
        let Some(obj) = n.as_object() else {
            return Err("netDevices entry is not an object".to_string());
        };
        if let Some(k) = obj
            .keys()
            .find(|k| !matches!(k.as_str(), "hostInterfaceName" | "name"))
        {
            return Err(format!("netDevices: unknown field {:?}", truncate(k)));
        }
        for f in ["hostInterfaceName", "name"] {
            if obj
                .get(f)
                .and_then(|v| v.as_str())
                .is_none_or(str::is_empty)
            {
                return Err(format!("netDevices: {f} missing or empty"));
            }
        }
    }
    Ok(())
}

/// Validate a parsed spec: version known and sufficient for the content, kind and device
/// names valid, no device defined twice, no device without edits, every edit valid.
pub fn validate_spec(spec: &Spec) -> Result<(), String> {
    let Some(declared) = version_index(&spec.cdi_version) else {
        return Err(format!(
            "unknown cdiVersion {:?} (known: {})",
            truncate(&spec.cdi_version),
            KNOWN_VERSIONS.join(", ")
        ));
    };
    let min = minimum_version(spec);
    if version_index(min).unwrap_or(0) > declared {
        return Err(format!(
            "cdiVersion {} is lower than {min}, which its content needs",
            spec.cdi_version
        ));
    }
    parse_kind(&spec.kind).map_err(|e| e.to_string())?;
    if spec.devices.is_empty() {
        return Err("no devices".to_string());
    }
    let mut seen = std::collections::BTreeSet::new();
    for d in &spec.devices {
        validate_device_name(&d.name).map_err(|e| e.to_string())?;
        if !seen.insert(d.name.as_str()) {
            return Err(format!("device {:?} defined twice", d.name));
        }
        if d.container_edits.is_empty() {
            return Err(format!("device {:?} has no containerEdits", d.name));
        }
        validate_edits(&d.container_edits).map_err(|e| format!("device {:?}: {e}", d.name))?;
    }
    validate_edits(&spec.container_edits).map_err(|e| format!("containerEdits: {e}"))?;
    Ok(())
}

/// Parse and validate spec text; `path` decides the format (`.json` or `.yaml`) and names the
/// file in errors.
pub fn parse_spec(text: &str, path: &Path) -> Result<Spec, CdiError> {
    let err = |why: String| CdiError::Spec {
        path: path.display().to_string(),
        why: why.replace('\n', " "),
    };
    let spec: Spec = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => serde_json::from_str(text).map_err(|e| err(e.to_string()))?,
        Some("yaml") => yaml_serde::from_str(text).map_err(|e| err(e.to_string()))?,
        _ => return Err(err("not a .json or .yaml file".to_string())),
    };
    validate_spec(&spec).map_err(err)?;
    Ok(spec)
}

/// Read one spec file (bounded size).
pub fn read_spec_file(path: &Path) -> Result<Spec, CdiError> {
    use std::io::Read;
    let err = |why: String| CdiError::Spec {
        path: path.display().to_string(),
        why,
    };
    let f = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let md = f.metadata().map_err(|e| err(e.to_string()))?;
    if let Some(why) = untrusted_file(&md) {
        return Err(err(why));
    }
    let mut text = String::new();
    f.take(MAX_SPEC_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| err(e.to_string()))?;
    if text.len() as u64 > MAX_SPEC_BYTES {
        return Err(err(format!("larger than {MAX_SPEC_BYTES} bytes")));
    }
    parse_spec(&text, path)
}

/// Why a spec file cannot be believed (`None`: it can): a spec grants devices, so only a
/// regular file that only root (or this user) can write is read — not one owned by another user,
/// nor one its group or everyone can write.
pub fn untrusted_file(md: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    if !md.is_file() {
        return Some("not a regular file".to_string());
    }
    let euid = nix::unistd::geteuid().as_raw();
    if md.uid() != 0 && md.uid() != euid {
        return Some(format!("owned by uid {}, not root: not read", md.uid()));
    }
    if md.mode() & 0o022 != 0 {
        return Some(format!(
            "writable by its group or everyone (mode {:o}): not read",
            md.mode() & 0o7777
        ));
    }
    None
}

/// Load every spec in `dirs` (`(dir, priority)`; a higher priority wins a conflict). Missing
/// directories are skipped; subdirectories are not searched; files are read in name order.
/// Invalid files are skipped with an error; a device defined at the same priority by two files
/// is dropped from both with an error (as the reference implementation does). Device nodes
/// without a type or major/minor get them from the host node (`hostPath`, else `path`), as CDI's
/// apply does; a node that cannot be found is left as is (the plan then refuses it).
pub fn load_spec_dirs(dirs: &[(PathBuf, u8)]) -> (Vec<LoadedSpec>, Vec<CdiError>) {
    let mut specs = Vec::new();
    let mut errors = Vec::new();
    for (dir, priority) in dirs {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                errors.push(CdiError::Spec {
                    path: dir.display().to_string(),
                    why: e.to_string(),
                });
                continue;
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("json") | Some("yaml")
                ) && p.is_file()
            })
            .collect();
        paths.sort();
        for path in paths {
            match read_spec_file(&path) {
                Ok(mut spec) => {
                    fill_device_numbers(&mut spec);
                    specs.push(LoadedSpec {
                        path,
                        priority: *priority,
                        spec,
                    });
                }
                Err(e) => errors.push(e),
            }
        }
    }
    // Same device, same priority, two files: drop it from both.
    let mut owners: BTreeMap<(String, String, u8), Vec<usize>> = BTreeMap::new();
    for (i, s) in specs.iter().enumerate() {
        for d in &s.spec.devices {
            owners
                .entry((s.spec.kind.clone(), d.name.clone(), s.priority))
                .or_default()
                .push(i);
        }
    }
    for ((kind, name, _), idx) in owners {
        if idx.len() > 1 {
            errors.push(CdiError::Conflict {
                name: format!("{kind}={name}"),
                first: specs[idx[0]].path.display().to_string(),
                second: specs[idx[1]].path.display().to_string(),
            });
            for i in idx {
                specs[i].spec.devices.retain(|d| d.name != name);
            }
        }
    }
    (specs, errors)
}

/// The default directories with their priorities.
pub fn default_spec_dirs() -> Vec<(PathBuf, u8)> {
    DEFAULT_SPEC_DIRS
        .iter()
        .map(|(d, p)| (PathBuf::from(d), *p))
        .collect()
}

fn fill_device_numbers(spec: &mut Spec) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let fill = |e: &mut ContainerEdits| {
        for d in &mut e.device_nodes {
            let have_numbers = d.major.is_some() && d.minor.is_some();
            let have_type = d.kind.as_deref().is_some_and(|t| !t.is_empty());
            if have_numbers && have_type {
                continue;
            }
            let host = d.host_path.clone().unwrap_or_else(|| d.path.clone());
            let Ok(md) = std::fs::metadata(&host) else {
                continue;
            };
            let ft = md.file_type();
            let kind = if ft.is_char_device() {
                "c"
            } else if ft.is_block_device() {
                "b"
            } else {
                continue;
            };
            let rdev = md.rdev();
            if !have_type {
                d.kind = Some(kind.to_string());
            }
            if !have_numbers {
                d.major = Some(i64::from(libc::major(rdev)));
                d.minor = Some(i64::from(libc::minor(rdev)));
            }
        }
    };
    fill(&mut spec.container_edits);
    for d in &mut spec.devices {
        fill(&mut d.container_edits);
    }
}

/// The spec defining a qualified device: the highest priority wins; two specs of the same
/// (highest) priority defining it is an error (`Err(paths)`); `Ok(None)` when none defines it.
pub fn find_device<'a>(
    specs: &'a [LoadedSpec],
    name: &QualifiedName,
) -> Result<Option<(&'a LoadedSpec, &'a super::spec::Device)>, (String, String)> {
    let kind = name.kind();
    let mut best: Option<(&LoadedSpec, &super::spec::Device)> = None;
    let mut tie: Option<&LoadedSpec> = None;
    for s in specs.iter().filter(|s| s.spec.kind == kind) {
        let Some(d) = s.spec.devices.iter().find(|d| d.name == name.name) else {
            continue;
        };
        match best {
            Some((b, _)) if b.priority > s.priority => {}
            Some((b, _)) if b.priority == s.priority => tie = Some(s),
            _ => {
                best = Some((s, d));
                tie = None;
            }
        }
    }
    if let (Some((b, _)), Some(t)) = (best, tie) {
        return Err((b.path.display().to_string(), t.path.display().to_string()));
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names() {
        let ok = [
            "vendor.com/class=name",
            "nvidia.com/gpu=0",
            "nvidia.com/gpu=0:1",
            "nvidia.com/gpu=GPU-3d3e8a2b-8c8d-4ac8-9a57-2cb4fd5a4f2a",
            "k8s.gpu.nvidia.com/claim=abc-gpu-0",
            "a/b=c",
            "a_b-c.d/e_f-g.h=i_j-k.l:m",
        ];
        for s in ok {
            let q = parse_qualified_name(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(q.to_string(), s);
        }
        let bad = [
            "",
            "vendor.com/class",
            "vendor.com=name",
            "/dev/nvidia0",
            "1vendor/class=name",
            "vendor-/class=name",
            "vendor/class-=name",
            "vendor/cl/ass=name",
            "vendor/class=",
            "vendor/class=-name",
            "vendor/class=name-",
            "vendor/class=na me",
            "vendor/class=na/me",
            "vendör/class=name",
            "vendor/=name",
            "/class=name",
        ];
        for s in bad {
            assert!(parse_qualified_name(s).is_err(), "{s} accepted");
        }
    }

    #[test]
    fn annotation_keys() {
        assert!(validate_annotation_key("cdi.k8s.io/nvidia-device-plugin_abc").is_ok());
        assert!(validate_annotation_key("cdi.k8s.io/a.b-c_d").is_ok());
        assert!(validate_annotation_key("cdi.k8s.io/").is_err());
        assert!(validate_annotation_key("cdi.k8s.io/_x").is_err());
        assert!(validate_annotation_key("cdi.k8s.io/x_").is_err());
        assert!(validate_annotation_key("cdi.k8s.io/a/b").is_err());
        assert!(validate_annotation_key(&format!("cdi.k8s.io/{}", "a".repeat(64))).is_err());
        assert!(validate_annotation_key(&format!("cdi.k8s.io/{}", "a".repeat(63))).is_ok());
        assert!(validate_annotation_key("other/x").is_err());
    }

    fn spec(text: &str) -> Result<Spec, CdiError> {
        parse_spec(text, Path::new("t.yaml"))
    }

    #[test]
    fn spec_versions() {
        let base = |v: &str, extra: &str| {
            format!(
                "cdiVersion: \"{v}\"\nkind: vendor.com/dev\ndevices:\n- name: \"{}\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/x\n{extra}",
                if extra.contains("DIGIT") { "0" } else { "a" }
            )
        };
        assert!(spec(&base("0.3.0", "")).is_ok());
        // hostPath needs 0.5.0
        let hp = "      hostPath: /dev/y\n";
        assert!(
            spec(&base("0.4.0", hp))
                .unwrap_err()
                .to_string()
                .contains("0.5.0")
        );
        assert!(spec(&base("0.5.0", hp)).is_ok());
        // device name starting with a digit needs 0.5.0
        let dig = "# DIGIT\n";
        assert!(spec(&base("0.4.0", dig)).is_err());
        assert!(spec(&base("0.5.0", dig)).is_ok());
        // additionalGids need 0.7.0
        let gids = "    additionalGids: [5]\n";
        assert!(spec(&base("0.6.0", gids)).is_err());
        assert!(spec(&base("0.7.0", gids)).is_ok());
        // unknown version
        assert!(spec(&base("9.9.9", "")).is_err());
        assert!(spec(&base("1.1.0", "")).is_ok());
    }

    #[test]
    fn spec_strictness() {
        let unknown = "cdiVersion: \"0.5.0\"\nkind: vendor.com/dev\nfoo: 1\ndevices:\n- name: a\n  containerEdits:\n    env: [A=1]\n";
        let e = spec(unknown).unwrap_err().to_string();
        assert!(e.contains("t.yaml") && e.contains("foo"), "{e}");
        let nested = "cdiVersion: \"0.5.0\"\nkind: vendor.com/dev\ndevices:\n- name: a\n  containerEdits:\n    deviceNodes:\n    - path: /dev/x\n      bogus: 1\n";
        assert!(spec(nested).is_err());
        let relative = "cdiVersion: \"0.5.0\"\nkind: vendor.com/dev\ndevices:\n- name: a\n  containerEdits:\n    deviceNodes:\n    - path: dev/x\n";
        assert!(
            spec(relative)
                .unwrap_err()
                .to_string()
                .contains("not absolute")
        );
        let dotdot = "cdiVersion: \"0.5.0\"\nkind: vendor.com/dev\ndevices:\n- name: a\n  containerEdits:\n    mounts:\n    - hostPath: /a/../etc\n      containerPath: /x\n";
        assert!(spec(dotdot).unwrap_err().to_string().contains(".."));
        let empty = "cdiVersion: \"0.5.0\"\nkind: vendor.com/dev\ndevices:\n- name: a\n  containerEdits: {}\n";
        assert!(spec(empty).is_err());
        let twice = "cdiVersion: \"0.5.0\"\nkind: vendor.com/dev\ndevices:\n- name: a\n  containerEdits: {env: [A=1]}\n- name: a\n  containerEdits: {env: [A=1]}\n";
        assert!(spec(twice).unwrap_err().to_string().contains("twice"));
        let badkind = "cdiVersion: \"0.5.0\"\nkind: vendor.com\ndevices:\n- name: a\n  containerEdits: {env: [A=1]}\n";
        assert!(spec(badkind).is_err());
        let json = r#"{"cdiVersion":"0.5.0","kind":"v.com/d","devices":[{"name":"a","containerEdits":{"env":["A=1"]}}]}"#;
        assert!(parse_spec(json, Path::new("x.json")).is_ok());
        assert!(parse_spec(json, Path::new("x.txt")).is_err());
    }

    #[test]
    fn dirs_priority_and_conflicts() {
        let tmp = tempfile::tempdir().unwrap();
        let lo = tmp.path().join("etc");
        let hi = tmp.path().join("run");
        std::fs::create_dir_all(&lo).unwrap();
        std::fs::create_dir_all(&hi).unwrap();
        let mk = |env: &str, dev: &str| {
            format!(
                "cdiVersion: \"0.5.0\"\nkind: v.com/d\ndevices:\n- name: {dev}\n  containerEdits:\n    env: [{env}]\n"
            )
        };
        std::fs::write(lo.join("a.yaml"), mk("X=lo", "a")).unwrap();
        std::fs::write(hi.join("a.yaml"), mk("X=hi", "a")).unwrap();
        // Same priority conflict on device b.
        std::fs::write(lo.join("b1.yaml"), mk("X=1", "b")).unwrap();
        std::fs::write(lo.join("b2.yaml"), mk("X=2", "b")).unwrap();
        std::fs::write(lo.join("broken.json"), "{").unwrap();
        std::fs::write(lo.join("ignored.txt"), "whatever").unwrap();
        let (specs, errors) = load_spec_dirs(&[
            (lo.clone(), 0),
            (hi.clone(), 1),
            (tmp.path().join("missing"), 2),
        ]);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors.iter().any(|e| e.to_string().contains("broken.json")));
        assert!(
            errors
                .iter()
                .any(|e| matches!(e, CdiError::Conflict { .. }))
        );
        let a = parse_qualified_name("v.com/d=a").unwrap();
        let (s, d) = find_device(&specs, &a).unwrap().unwrap();
        assert_eq!(s.priority, 1);
        assert_eq!(d.container_edits.env, vec!["X=hi".to_string()]);
        let b = parse_qualified_name("v.com/d=b").unwrap();
        assert!(find_device(&specs, &b).unwrap().is_none());
    }

    #[test]
    fn fills_device_numbers_from_host() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("n.yaml"),
            "cdiVersion: \"0.5.0\"\nkind: v.com/d\ndevices:\n- name: devnull\n  containerEdits:\n    deviceNodes:\n    - path: /dev/null\n",
        )
        .unwrap();
        let (specs, errors) = load_spec_dirs(&[(tmp.path().to_path_buf(), 0)]);
        assert!(errors.is_empty(), "{errors:?}");
        let n = &specs[0].spec.devices[0].container_edits.device_nodes[0];
        assert_eq!(
            (n.kind.as_deref(), n.major, n.minor),
            (Some("c"), Some(1), Some(3))
        );
    }
}
