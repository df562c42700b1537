//! Table-driven tests per allocation dialect: what each input normalises to, and the one-line
//! error (naming the key and value) for each invalid one.

mod alloc_support;

use alloc_support::*;
use gpufence::allocation::{AllocationError, DeviceRef};
use gpufence::config::{Config, Dialect, MemoryUnit};
use gpufence::plan::{Plan, plan};

enum Want {
    /// (device "N" or "N:M", memory, cores), oversubscribe.
    Devices(&'static [(&'static str, Option<u64>, Option<u8>)], bool),
    /// No allocation.
    Nothing,
    /// Error: the key it names and a fragment of the reason.
    Err(&'static str, &'static str),
}

struct Case {
    name: &'static str,
    config: fn() -> Config,
    annotations: &'static [(&'static str, &'static str)],
    env: &'static [&'static str],
    mounts: &'static [&'static str],
    want: Want,
}

fn dev_name(d: &DeviceRef) -> String {
    match d {
        DeviceRef::Gpu { index } => index.to_string(),
        DeviceRef::Mig { gpu, mig } => format!("{gpu}:{mig}"),
    }
}

fn run_case(c: &Case) -> Result<Plan, AllocationError> {
    let s = with_mounts(spec(c.annotations, c.env), c.mounts);
    plan(&s, "ctr-1", &inventory(), &(c.config)(), &[])
}

fn check(cases: &[Case]) {
    let mut failures = Vec::new();
    for c in cases {
        let got = run_case(c);
        let ok = match (&c.want, &got) {
            (Want::Nothing, Ok(p)) => p.allocation.is_none() && p.grants_nothing(),
            (Want::Devices(want, ov), Ok(p)) => match &p.allocation {
                Some(a) => {
                    let have: Vec<(String, Option<u64>, Option<u8>)> = a
                        .devices
                        .iter()
                        .map(|d| (dev_name(&d.device), d.memory_limit, d.cores))
                        .collect();
                    let want: Vec<(String, Option<u64>, Option<u8>)> = want
                        .iter()
                        .map(|(d, m, c)| (d.to_string(), *m, *c))
                        .collect();
                    have == want && a.oversubscribe == *ov
                }
                None => false,
            },
            (Want::Err(key, why), Err(e)) => {
                let line = e.to_string();
                e.key == *key && line.contains(why) && !line.contains('\n')
            }
            _ => false,
        };
        if !ok {
            failures.push(format!("{}: got {:?}", c.name, got.map(|p| p.allocation)));
        }
    }
    assert!(
        failures.is_empty(),
        "failed cases:\n{}",
        failures.join("\n")
    );
}

const G: u64 = GIB;

#[test]
#[rustfmt::skip]
fn gpufence_annotations() {
    use Want::*;
    let cases = [
        Case { name: "one gpu", config, annotations: &[("gpufence.dev/devices", "0")], env: &[], mounts: &[], want: Devices(&[("0", None, None)], false) },
        Case { name: "by uuid + quota", config, annotations: &[("gpufence.dev/devices", "GPU-00000001-aaaa-bbbb-cccc-000000000001"), ("gpufence.dev/memory", "4Gi")], env: &[], mounts: &[], want: Devices(&[("1", Some(4 * G), None)], false) },
        Case { name: "uuid case-insensitive", config, annotations: &[("gpufence.dev/devices", "gpu-00000001-AAAA-bbbb-cccc-000000000001")], env: &[], mounts: &[], want: Devices(&[("1", None, None)], false) },
        Case { name: "one value for all", config, annotations: &[("gpufence.dev/devices", "0, 1"), ("gpufence.dev/memory", "4096Mi"), ("gpufence.dev/cores", "50")], env: &[], mounts: &[], want: Devices(&[("0", Some(4 * G), Some(50)), ("1", Some(4 * G), Some(50))], false) },
        Case { name: "aligned lists", config, annotations: &[("gpufence.dev/devices", "1,0"), ("gpufence.dev/memory", "4G,500M"), ("gpufence.dev/cores", "100,1")], env: &[], mounts: &[], want: Devices(&[("1", Some(4_000_000_000), Some(100)), ("0", Some(500_000_000), Some(1))], false) },
        Case { name: "plain bytes", config, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/memory", "1073741824")], env: &[], mounts: &[], want: Devices(&[("0", Some(G), None)], false) },
        Case { name: "mig by index", config, annotations: &[("gpufence.dev/devices", "2:1"), ("gpufence.dev/memory", "5Gi")], env: &[], mounts: &[], want: Devices(&[("2:1", Some(5 * G), None)], false) },
        Case { name: "mig by uuid", config, annotations: &[("gpufence.dev/devices", "MIG-20202020-aaaa-bbbb-cccc-dddddddddddd")], env: &[], mounts: &[], want: Devices(&[("2:0", None, None)], false) },
        Case { name: "two migs of one gpu", config, annotations: &[("gpufence.dev/devices", "2:0,2:1")], env: &[], mounts: &[], want: Devices(&[("2:0", None, None), ("2:1", None, None)], false) },
        Case { name: "all", config, annotations: &[("gpufence.dev/devices", "all"), ("gpufence.dev/memory", "1Gi")], env: &[], mounts: &[], want: Devices(&[("0", Some(G), None), ("1", Some(G), None), ("2:0", Some(G), None), ("2:1", Some(G), None), ("3", Some(G), None)], false) },
        Case { name: "oversubscribe", config, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/memory", "100Gi"), ("gpufence.dev/oversubscribe", "true")], env: &[], mounts: &[], want: Devices(&[("0", Some(100 * G), None)], true) },
        Case { name: "oversubscribe false", config, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/oversubscribe", "false")], env: &[], mounts: &[], want: Devices(&[("0", None, None)], false) },
        Case { name: "nothing", config, annotations: &[("other", "x")], env: &[], mounts: &[], want: Nothing },
        // errors
        Case { name: "unknown index", config, annotations: &[("gpufence.dev/devices", "7")], env: &[], mounts: &[], want: Err("gpufence.dev/devices", "no GPU with index 7") },
        Case { name: "unknown uuid", config, annotations: &[("gpufence.dev/devices", "GPU-nope")], env: &[], mounts: &[], want: Err("gpufence.dev/devices", "no GPU with UUID") },
        Case { name: "unknown mig uuid", config, annotations: &[("gpufence.dev/devices", "MIG-nope")], env: &[], mounts: &[], want: Err("gpufence.dev/devices", "no MIG device") },
        Case { name: "garbage", config, annotations: &[("gpufence.dev/devices", "zero")], env: &[], mounts: &[], want: Err("gpufence.dev/devices", "not a device") },
        Case { name: "empty", config, annotations: &[("gpufence.dev/devices", "")], env: &[], mounts: &[], want: Err("gpufence.dev/devices", "empty device") },
        Case { name: "trailing comma", config, annotations: &[("gpufence.dev/devices", "0,")], env: &[], mounts: &[], want: Err("gpufence.dev/devices", "empty device") },
        Case { name: "duplicate", config, annotations: &[("gpufence.dev/devices", "0,GPU-00000000-aaaa-bbbb-cccc-000000000000")], env: &[], mounts: &[], want: Err("gpufence.dev/devices", "twice") },
        Case { name: "mig with parent", config, annotations: &[("gpufence.dev/devices", "2,2:0")], env: &[], mounts: &[], want: Err("gpufence.dev/devices", "together with its parent GPU 2") },
        Case { name: "all mixed", config, annotations: &[("gpufence.dev/devices", "all,0")], env: &[], mounts: &[], want: Err("gpufence.dev/devices", "\"all\" cannot be combined") },
        Case { name: "mig disabled", config, annotations: &[("gpufence.dev/devices", "3:0")], env: &[], mounts: &[], want: Err("gpufence.dev/devices", "GPU 3 has MIG disabled") },
        Case { name: "mig on non-mig gpu", config, annotations: &[("gpufence.dev/devices", "0:0")], env: &[], mounts: &[], want: Err("gpufence.dev/devices", "MIG disabled") },
        Case { name: "unknown mig index", config, annotations: &[("gpufence.dev/devices", "2:5")], env: &[], mounts: &[], want: Err("gpufence.dev/devices", "no MIG device 5") },
        Case { name: "memory 0", config, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/memory", "0")], env: &[], mounts: &[], want: Err("gpufence.dev/memory", "quota of 0") },
        Case { name: "memory junk", config, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/memory", "4GB")], env: &[], mounts: &[], want: Err("gpufence.dev/memory", "unknown suffix") },
        Case { name: "memory negative", config, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/memory", "-4Gi")], env: &[], mounts: &[], want: Err("gpufence.dev/memory", "negative") },
        Case { name: "memory larger than device", config, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/memory", "81Gi")], env: &[], mounts: &[], want: Err("gpufence.dev/memory", "exceeds the memory of GPU 0") },
        Case { name: "memory larger than mig", config, annotations: &[("gpufence.dev/devices", "2:0"), ("gpufence.dev/memory", "11Gi")], env: &[], mounts: &[], want: Err("gpufence.dev/memory", "exceeds the memory of MIG 2:0") },
        Case { name: "memory list length", config, annotations: &[("gpufence.dev/devices", "0,1"), ("gpufence.dev/memory", "1Gi,2Gi,3Gi")], env: &[], mounts: &[], want: Err("gpufence.dev/memory", "3 values for 2 devices") },
        Case { name: "cores list length", config, annotations: &[("gpufence.dev/devices", "0,1,3"), ("gpufence.dev/cores", "10,20")], env: &[], mounts: &[], want: Err("gpufence.dev/cores", "2 values for 3 devices") },
        Case { name: "cores 0", config, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/cores", "0")], env: &[], mounts: &[], want: Err("gpufence.dev/cores", "1–100") },
        Case { name: "cores 101", config, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/cores", "101")], env: &[], mounts: &[], want: Err("gpufence.dev/cores", "1–100") },
        Case { name: "cores fraction", config, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/cores", "50.5")], env: &[], mounts: &[], want: Err("gpufence.dev/cores", "1–100") },
        Case { name: "oversubscribe junk", config, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/oversubscribe", "yes")], env: &[], mounts: &[], want: Err("gpufence.dev/oversubscribe", "true or false") },
        Case { name: "memory without devices", config, annotations: &[("gpufence.dev/memory", "4Gi")], env: &[], mounts: &[], want: Err("gpufence.dev/memory", "no device is allocated") },
        Case { name: "unknown annotation", config, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/memroy", "4Gi")], env: &[], mounts: &[], want: Err("gpufence.dev/memroy", "unknown gpufence annotation") },
        Case { name: "unknown capability", config, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/capabilities", "compute,warp")], env: &[], mounts: &[], want: Err("gpufence.dev/capabilities", "unknown capability") },
        Case { name: "dialect disabled", config: || { let mut c = config(); c.allocation.dialects = vec![Dialect::Cdi]; c }, annotations: &[("gpufence.dev/devices", "0")], env: &[], mounts: &[], want: Nothing },
    ];
    check(&cases);
}

#[test]
#[rustfmt::skip]
fn cdi_annotations_gpufence_kind() {
    use Want::*;
    let cases = [
        Case { name: "index", config, annotations: &[("cdi.k8s.io/gpufence_0", "gpufence.dev/gpu=0")], env: &[], mounts: &[], want: Devices(&[("0", None, None)], false) },
        Case { name: "several in one", config, annotations: &[("cdi.k8s.io/x", "gpufence.dev/gpu=1,gpufence.dev/gpu=2:0")], env: &[], mounts: &[], want: Devices(&[("1", None, None), ("2:0", None, None)], false) },
        Case { name: "across annotations (key order)", config, annotations: &[("cdi.k8s.io/b", "gpufence.dev/gpu=1"), ("cdi.k8s.io/a", "gpufence.dev/gpu=0")], env: &[], mounts: &[], want: Devices(&[("0", None, None), ("1", None, None)], false) },
        Case { name: "with gpufence limits", config, annotations: &[("cdi.k8s.io/x", "gpufence.dev/gpu=GPU-00000001-aaaa-bbbb-cccc-000000000001"), ("gpufence.dev/memory", "8Gi")], env: &[], mounts: &[], want: Devices(&[("1", Some(8 * G), None)], false) },
        Case { name: "agrees with gpufence.dev/devices", config, annotations: &[("cdi.k8s.io/x", "gpufence.dev/gpu=0"), ("gpufence.dev/devices", "0"), ("gpufence.dev/cores", "30")], env: &[], mounts: &[], want: Devices(&[("0", None, Some(30))], false) },
        Case { name: "disagrees with gpufence.dev/devices", config, annotations: &[("cdi.k8s.io/x", "gpufence.dev/gpu=1"), ("gpufence.dev/devices", "0")], env: &[], mounts: &[], want: Err("cdi.k8s.io/x", "disagrees with the gpufence dialect") },
        Case { name: "bad key", config, annotations: &[("cdi.k8s.io/_bad", "gpufence.dev/gpu=0")], env: &[], mounts: &[], want: Err("cdi.k8s.io/_bad", "start and end") },
        Case { name: "bad name", config, annotations: &[("cdi.k8s.io/x", "gpufence.dev/gpu")], env: &[], mounts: &[], want: Err("cdi.k8s.io/x", "qualified name") },
        Case { name: "bad device chars", config, annotations: &[("cdi.k8s.io/x", "gpufence.dev/gpu=0;rm")], env: &[], mounts: &[], want: Err("cdi.k8s.io/x", "invalid character") },
        Case { name: "unknown gpu", config, annotations: &[("cdi.k8s.io/x", "gpufence.dev/gpu=9")], env: &[], mounts: &[], want: Err("cdi.k8s.io/x", "no GPU with index 9") },
        Case { name: "duplicate across annotations", config, annotations: &[("cdi.k8s.io/a", "gpufence.dev/gpu=0"), ("cdi.k8s.io/b", "gpufence.dev/gpu=0")], env: &[], mounts: &[], want: Err("cdi.k8s.io/a", "twice") },
        Case { name: "undefined foreign", config, annotations: &[("cdi.k8s.io/x", "vendor.com/dev=a")], env: &[], mounts: &[], want: Err("cdi.k8s.io/x", "no CDI spec") },
        Case { name: "cdi disabled", config: || { let mut c = config(); c.allocation.dialects = vec![Dialect::Gpufence]; c }, annotations: &[("cdi.k8s.io/x", "gpufence.dev/gpu=0")], env: &[], mounts: &[], want: Nothing },
    ];
    check(&cases);
}

#[test]
#[rustfmt::skip]
fn hami_env() {
    use Want::*;
    const NVD01: &str = "NVIDIA_VISIBLE_DEVICES=GPU-00000000-aaaa-bbbb-cccc-000000000000,GPU-00000001-aaaa-bbbb-cccc-000000000001";
    let hami = || trusting(&[Dialect::Hami]);
    let cases = [
        Case { name: "limits per device", config: hami, annotations: &[], env: &[NVD01, "CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_MEMORY_LIMIT_1=2g", "CUDA_DEVICE_SM_LIMIT=30"], mounts: &[], want: Devices(&[("0", Some(4 * G), Some(30)), ("1", Some(2 * G), Some(30))], false) },
        // HAMi-core (do_init_device_*_limits): `_<i>` set and not 0, else the unindexed value
        // on every device (KAI's resource isolator and koordlet set only that), else none.
        Case { name: "fallback limit, 0 falls back", config: hami, annotations: &[], env: &[NVD01, "CUDA_DEVICE_MEMORY_LIMIT=1024m", "CUDA_DEVICE_MEMORY_LIMIT_1=0"], mounts: &[], want: Devices(&[("0", Some(G), None), ("1", Some(G), None)], false) },
        Case { name: "unindexed limits on every device", config: hami, annotations: &[], env: &[NVD01, "CUDA_DEVICE_MEMORY_LIMIT=2g", "CUDA_DEVICE_SM_LIMIT=40"], mounts: &[], want: Devices(&[("0", Some(2 * G), Some(40)), ("1", Some(2 * G), Some(40))], false) },
        Case { name: "indexed over unindexed, empty falls back", config: hami, annotations: &[], env: &[NVD01, "CUDA_DEVICE_MEMORY_LIMIT=2g", "CUDA_DEVICE_MEMORY_LIMIT_0=1g", "CUDA_DEVICE_MEMORY_LIMIT_1=", "CUDA_DEVICE_SM_LIMIT=40", "CUDA_DEVICE_SM_LIMIT_1=0"], mounts: &[], want: Devices(&[("0", Some(G), Some(40)), ("1", Some(2 * G), Some(40))], false) },
        Case { name: "0 without fallback is none", config: hami, annotations: &[], env: &[NVD01, "CUDA_DEVICE_MEMORY_LIMIT_1=0", "CUDA_DEVICE_SM_LIMIT_0=25"], mounts: &[], want: Devices(&[("0", None, Some(25)), ("1", None, None)], false) },
        Case { name: "sm 0 and 100 are none", config: hami, annotations: &[], env: &[NVD01, "CUDA_DEVICE_SM_LIMIT_0=0", "CUDA_DEVICE_SM_LIMIT_1=100"], mounts: &[], want: Devices(&[("0", None, None), ("1", None, None)], false) },
        Case { name: "k suffix and bytes", config: hami, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=GPU-00000000-aaaa-bbbb-cccc-000000000000", "CUDA_DEVICE_MEMORY_LIMIT_0=1048576k"], mounts: &[], want: Devices(&[("0", Some(G), None)], false) },
        Case { name: "oversubscribe beyond device", config: hami, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=GPU-00000000-aaaa-bbbb-cccc-000000000000", "CUDA_DEVICE_MEMORY_LIMIT_0=100g", "CUDA_OVERSUBSCRIBE=true"], mounts: &[], want: Devices(&[("0", Some(100 * G), None)], true) },
        Case { name: "mig uuid", config: hami, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=MIG-21212121-aaaa-bbbb-cccc-dddddddddddd", "CUDA_DEVICE_MEMORY_LIMIT_0=2g"], mounts: &[], want: Devices(&[("2:1", Some(2 * G), None)], false) },
        Case { name: "agrees with gpufence", config: hami, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/memory", "4Gi")], env: &["NVIDIA_VISIBLE_DEVICES=GPU-00000000-aaaa-bbbb-cccc-000000000000", "CUDA_DEVICE_MEMORY_LIMIT_0=4096m"], mounts: &[], want: Devices(&[("0", Some(4 * G), None)], false) },
        Case { name: "only NVD is not hami", config: hami, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=GPU-00000000-aaaa-bbbb-cccc-000000000000"], mounts: &[], want: Nothing },
        // errors
        Case { name: "disagrees with gpufence memory", config: hami, annotations: &[("gpufence.dev/devices", "0"), ("gpufence.dev/memory", "4Gi")], env: &["NVIDIA_VISIBLE_DEVICES=GPU-00000000-aaaa-bbbb-cccc-000000000000", "CUDA_DEVICE_MEMORY_LIMIT_0=2048m"], mounts: &[], want: Err("gpufence.dev/memory", "disagrees with the hami dialect") },
        Case { name: "disagrees with gpufence devices", config: hami, annotations: &[("gpufence.dev/devices", "1")], env: &["NVIDIA_VISIBLE_DEVICES=GPU-00000000-aaaa-bbbb-cccc-000000000000", "CUDA_DEVICE_MEMORY_LIMIT_0=2048m"], mounts: &[], want: Err("NVIDIA_VISIBLE_DEVICES", "disagrees with the gpufence dialect") },
        Case { name: "index not uuid", config: hami, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=0", "CUDA_DEVICE_MEMORY_LIMIT_0=1g"], mounts: &[], want: Err("NVIDIA_VISIBLE_DEVICES", "by UUID") },
        Case { name: "limits without devices", config: hami, annotations: &[], env: &["CUDA_DEVICE_MEMORY_LIMIT_0=1g"], mounts: &[], want: Err("CUDA_DEVICE_MEMORY_LIMIT_0", "without NVIDIA_VISIBLE_DEVICES") },
        Case { name: "ordinal beyond list", config: hami, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=GPU-00000000-aaaa-bbbb-cccc-000000000000", "CUDA_DEVICE_MEMORY_LIMIT_3=1g"], mounts: &[], want: Err("CUDA_DEVICE_MEMORY_LIMIT_3", "names 1 device") },
        Case { name: "octal to HAMi-core", config: hami, annotations: &[], env: &[NVD01, "CUDA_DEVICE_MEMORY_LIMIT=010g"], mounts: &[], want: Err("CUDA_DEVICE_MEMORY_LIMIT", "leading zero") },
        Case { name: "bad unindexed sm", config: hami, annotations: &[], env: &[NVD01, "CUDA_DEVICE_SM_LIMIT=half"], mounts: &[], want: Err("CUDA_DEVICE_SM_LIMIT", "whole percentage") },
        Case { name: "bad limit", config: hami, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=GPU-00000000-aaaa-bbbb-cccc-000000000000", "CUDA_DEVICE_MEMORY_LIMIT_0=4Gi"], mounts: &[], want: Err("CUDA_DEVICE_MEMORY_LIMIT_0", "unknown suffix") },
        Case { name: "bigger than device", config: hami, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=GPU-00000000-aaaa-bbbb-cccc-000000000000", "CUDA_DEVICE_MEMORY_LIMIT_0=81g"], mounts: &[], want: Err("CUDA_DEVICE_MEMORY_LIMIT_0", "exceeds") },
        Case { name: "bad sm", config: hami, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=GPU-00000000-aaaa-bbbb-cccc-000000000000", "CUDA_DEVICE_SM_LIMIT=-5"], mounts: &[], want: Err("CUDA_DEVICE_SM_LIMIT", "percentage") },
        Case { name: "conflicting duplicate env", config: hami, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=GPU-00000000-aaaa-bbbb-cccc-000000000000", "CUDA_DEVICE_MEMORY_LIMIT_0=1g", "CUDA_DEVICE_MEMORY_LIMIT_0=2g"], mounts: &[], want: Err("CUDA_DEVICE_MEMORY_LIMIT_0", "more than once") },
        // untrusted: never acted on
        Case { name: "untrusted hami", config, annotations: &[], env: &[NVD01, "CUDA_DEVICE_MEMORY_LIMIT_0=4096m"], mounts: &[], want: Nothing },
    ];
    check(&cases);
}

#[test]
#[rustfmt::skip]
fn gpushare_env() {
    use Want::*;
    let gs = || trusting(&[Dialect::Gpushare]);
    let gs_mib = || {
        let mut c = trusting(&[Dialect::Gpushare]);
        c.gpushare.memory_unit = MemoryUnit::MiB;
        c
    };
    let cases = [
        Case { name: "one card", config: gs, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=1", "ALIYUN_COM_GPU_MEM_IDX=1", "ALIYUN_COM_GPU_MEM_CONTAINER=3", "ALIYUN_COM_GPU_MEM_DEV=80", "ALIYUN_COM_GPU_MEM_POD=3"], mounts: &[], want: Devices(&[("1", Some(3 * G), None)], false) },
        Case { name: "MiB unit", config: gs_mib, annotations: &[], env: &["ALIYUN_COM_GPU_MEM_IDX=0", "ALIYUN_COM_GPU_MEM_CONTAINER=1536", "ALIYUN_COM_GPU_MEM_DEV=81920"], mounts: &[], want: Devices(&[("0", Some(1536 << 20), None)], false) },
        Case { name: "8 GiB over 2 cards", config: gs, annotations: &[("aliyun.com/gpu-count", "2")], env: &["ALIYUN_COM_GPU_MEM_IDX=0,1", "ALIYUN_COM_GPU_MEM_CONTAINER=8", "ALIYUN_COM_GPU_MEM_DEV=80"], mounts: &[], want: Devices(&[("0", Some(4 * G), None), ("1", Some(4 * G), None)], false) },
        Case { name: "8 GiB over 2 cards without count", config: gs, annotations: &[], env: &["ALIYUN_COM_GPU_MEM_IDX=1,0", "ALIYUN_COM_GPU_MEM_CONTAINER=8"], mounts: &[], want: Devices(&[("1", Some(4 * G), None), ("0", Some(4 * G), None)], false) },
        Case { name: "7 GiB over 2 cards", config: gs, annotations: &[("aliyun.com/gpu-count", "2")], env: &["ALIYUN_COM_GPU_MEM_IDX=0,1", "ALIYUN_COM_GPU_MEM_CONTAINER=7", "ALIYUN_COM_GPU_MEM_DEV=80"], mounts: &[], want: Err("ALIYUN_COM_GPU_MEM_CONTAINER", "not a whole number of GiB per GPU") },
        Case { name: "count disagrees with indexes", config: gs, annotations: &[("aliyun.com/gpu-count", "3")], env: &["ALIYUN_COM_GPU_MEM_IDX=0,1", "ALIYUN_COM_GPU_MEM_CONTAINER=6"], mounts: &[], want: Err("aliyun.com/gpu-count", "names 2 GPU") },
        Case { name: "count junk", config: gs, annotations: &[("aliyun.com/gpu-count", "two")], env: &["ALIYUN_COM_GPU_MEM_IDX=0,1", "ALIYUN_COM_GPU_MEM_CONTAINER=6"], mounts: &[], want: Err("aliyun.com/gpu-count", "positive whole number") },
        Case { name: "failure marker", config: gs, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=no-gpu-has-8GiB-to-run", "ALIYUN_COM_GPU_MEM_IDX=-1"], mounts: &[], want: Err("NVIDIA_VISIBLE_DEVICES", "found no GPU") },
        Case { name: "idx -1", config: gs, annotations: &[], env: &["ALIYUN_COM_GPU_MEM_IDX=-1", "ALIYUN_COM_GPU_MEM_CONTAINER=8"], mounts: &[], want: Err("ALIYUN_COM_GPU_MEM_IDX", "found no GPU") },
        Case { name: "unknown index", config: gs, annotations: &[], env: &["ALIYUN_COM_GPU_MEM_IDX=8", "ALIYUN_COM_GPU_MEM_CONTAINER=8"], mounts: &[], want: Err("ALIYUN_COM_GPU_MEM_IDX", "no GPU with index 8") },
        Case { name: "zero memory", config: gs, annotations: &[], env: &["ALIYUN_COM_GPU_MEM_IDX=0", "ALIYUN_COM_GPU_MEM_CONTAINER=0"], mounts: &[], want: Err("ALIYUN_COM_GPU_MEM_CONTAINER", "quota of 0") },
        Case { name: "no container memory", config: gs, annotations: &[], env: &["ALIYUN_COM_GPU_MEM_IDX=0"], mounts: &[], want: Err("ALIYUN_COM_GPU_MEM_IDX", "ALIYUN_COM_GPU_MEM_CONTAINER") },
        Case { name: "memory without index", config: gs, annotations: &[], env: &["ALIYUN_COM_GPU_MEM_CONTAINER=4"], mounts: &[], want: Err("ALIYUN_COM_GPU_MEM_CONTAINER", "without ALIYUN_COM_GPU_MEM_IDX") },
        Case { name: "more than the card", config: gs, annotations: &[], env: &["ALIYUN_COM_GPU_MEM_IDX=0", "ALIYUN_COM_GPU_MEM_CONTAINER=81"], mounts: &[], want: Err("ALIYUN_COM_GPU_MEM_CONTAINER", "exceeds the memory of GPU 0") },
        Case { name: "more than DEV says", config: gs, annotations: &[], env: &["ALIYUN_COM_GPU_MEM_IDX=0", "ALIYUN_COM_GPU_MEM_CONTAINER=20", "ALIYUN_COM_GPU_MEM_DEV=16"], mounts: &[], want: Err("ALIYUN_COM_GPU_MEM_CONTAINER", "exceeds the GPU size") },
        Case { name: "gpushare vs nvidia disagree", config: trust_all, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=1", "ALIYUN_COM_GPU_MEM_IDX=0", "ALIYUN_COM_GPU_MEM_CONTAINER=4"], mounts: &[], want: Err("NVIDIA_VISIBLE_DEVICES", "disagrees with the gpushare dialect") },
        Case { name: "gpushare + nvidia agree", config: trust_all, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=0", "ALIYUN_COM_GPU_MEM_IDX=0", "ALIYUN_COM_GPU_MEM_CONTAINER=4"], mounts: &[], want: Devices(&[("0", Some(4 * G), None)], false) },
        Case { name: "untrusted gpushare", config, annotations: &[], env: &["ALIYUN_COM_GPU_MEM_IDX=0", "ALIYUN_COM_GPU_MEM_CONTAINER=4"], mounts: &[], want: Nothing },
    ];
    check(&cases);
}

#[test]
#[rustfmt::skip]
fn nvidia_env_and_mounts() {
    use Want::*;
    let nv = || trusting(&[Dialect::Nvidia]);
    let cases = [
        Case { name: "indexes", config: nv, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=1,0"], mounts: &[], want: Devices(&[("1", None, None), ("0", None, None)], false) },
        Case { name: "uuid", config: nv, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=GPU-00000003-aaaa-bbbb-cccc-000000000003"], mounts: &[], want: Devices(&[("3", None, None)], false) },
        Case { name: "all", config: nv, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=all"], mounts: &[], want: Devices(&[("0", None, None), ("1", None, None), ("2:0", None, None), ("2:1", None, None), ("3", None, None)], false) },
        Case { name: "none", config: nv, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=none"], mounts: &[], want: Nothing },
        Case { name: "void", config: nv, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=void"], mounts: &[], want: Nothing },
        Case { name: "empty", config: nv, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES="], mounts: &[], want: Nothing },
        Case { name: "with limits from gpufence", config: nv, annotations: &[("gpufence.dev/memory", "2Gi")], env: &["NVIDIA_VISIBLE_DEVICES=0"], mounts: &[], want: Devices(&[("0", Some(2 * G), None)], false) },
        Case { name: "unknown", config: nv, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=5"], mounts: &[], want: Err("NVIDIA_VISIBLE_DEVICES", "no GPU with index 5") },
        Case { name: "all mixed", config: nv, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=0,all"], mounts: &[], want: Err("NVIDIA_VISIBLE_DEVICES", "\"all\" cannot be combined") },
        Case { name: "failure marker", config: nv, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=no-gpu-has-4GiB-to-run"], mounts: &[], want: Err("NVIDIA_VISIBLE_DEVICES", "found no GPU") },
        Case { name: "bad capability", config: nv, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,teleport"], mounts: &[], want: Err("NVIDIA_DRIVER_CAPABILITIES", "unknown capability") },
        // volume-mount strategy: trusted without trust-env
        Case { name: "volume mounts, env untrusted", config, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"], mounts: &["/var/run/nvidia-container-devices/GPU-00000001-aaaa-bbbb-cccc-000000000001", "/var/run/nvidia-container-devices/0"], want: Devices(&[("1", None, None), ("0", None, None)], false) },
        Case { name: "volume mount unknown", config, annotations: &[], env: &[], mounts: &["/var/run/nvidia-container-devices/9"], want: Err("mounts[/var/run/nvidia-container-devices]", "no GPU with index 9") },
        Case { name: "volume mount all (a pod's hostPath of /dev/null)", config, annotations: &[], env: &[], mounts: &["/var/run/nvidia-container-devices/all"], want: Err("mounts[/var/run/nvidia-container-devices]", "never a device plugin's device mount") },
        Case { name: "volume mounts vs env", config: nv, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=1"], mounts: &["/var/run/nvidia-container-devices/0"], want: Err("NVIDIA_VISIBLE_DEVICES", "disagrees with the device mounts") },
        Case { name: "volume mounts, nvidia disabled", config: || { let mut c = config(); c.allocation.dialects = vec![Dialect::Gpufence]; c }, annotations: &[], env: &[], mounts: &["/var/run/nvidia-container-devices/0"], want: Nothing },
        // untrusted env: never acted on
        Case { name: "untrusted all", config, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=all"], mounts: &[], want: Nothing },
        Case { name: "untrusted uuid", config: || trusting(&[Dialect::Hami]), annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=0"], mounts: &[], want: Nothing },
        Case { name: "untrusted garbage is not an error", config, annotations: &[], env: &["NVIDIA_VISIBLE_DEVICES=\u{0}\u{ffff}zz"], mounts: &[], want: Nothing },
    ];
    check(&cases);
}

#[test]
#[rustfmt::skip]
fn untrusted_env_is_neutralised() {
    // The CUDA base image's NVIDIA_VISIBLE_DEVICES=all on a node that trusts no env.
    let s = spec(
        &[],
        &[
            "PATH=/bin",
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_DRIVER_CAPABILITIES=all",
        ],
    );
    let p = plan(&s, "c1", &inventory(), &config(), &[]).unwrap();
    assert!(p.grants_nothing());
    assert!(p.edits.is_empty());
    assert_eq!(
        p.env_overrides,
        vec!["NVIDIA_VISIBLE_DEVICES=void".to_string()]
    );
    assert!(
        p.notes
            .iter()
            .any(|n| n.contains("NVIDIA_VISIBLE_DEVICES") && n.contains("trust-env")),
        "{:?}",
        p.notes
    );
    assert!(p.host_files.is_empty() && p.state_dir.is_none());

    // HAMi and gpushare env without trust: notes, no grant.
    let s = spec(
        &[],
        &[
            "NVIDIA_VISIBLE_DEVICES=GPU-00000000-aaaa-bbbb-cccc-000000000000",
            "CUDA_DEVICE_MEMORY_LIMIT_0=1g",
            "ALIYUN_COM_GPU_MEM_IDX=0",
        ],
    );
    let p = plan(&s, "c1", &inventory(), &config(), &[]).unwrap();
    assert!(p.grants_nothing());
    assert!(
        p.notes
            .iter()
            .any(|n| n.contains("CUDA_DEVICE_MEMORY_LIMIT_0"))
    );
    assert!(p.notes.iter().any(|n| n.contains("ALIYUN_COM_GPU_MEM_IDX")));
    assert_eq!(
        p.env_overrides,
        vec!["NVIDIA_VISIBLE_DEVICES=void".to_string()]
    );

    // A duplicated key asking for devices in any occurrence is neutralised (the toolkit's env
    // map keeps the last one; the first said void).
    let s = spec(
        &[],
        &["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=all"],
    );
    let p = plan(&s, "c1", &inventory(), &config(), &[]).unwrap();
    assert!(p.grants_nothing());
    assert_eq!(
        p.env_overrides,
        vec!["NVIDIA_VISIBLE_DEVICES=void".to_string()]
    );

    // void stays void without a note; a disabled dialect says so.
    let s = spec(&[], &["NVIDIA_VISIBLE_DEVICES=void"]);
    let p = plan(&s, "c1", &inventory(), &config(), &[]).unwrap();
    assert!(p.env_overrides.is_empty() && p.notes.is_empty());
    let mut c = trust_all();
    c.allocation.dialects = vec![Dialect::Gpufence];
    let s = spec(&[], &["NVIDIA_VISIBLE_DEVICES=0"]);
    let p = plan(&s, "c1", &inventory(), &c, &[]).unwrap();
    assert!(p.grants_nothing());
    assert!(
        p.notes.iter().any(|n| n.contains("disabled")),
        "{:?}",
        p.notes
    );

    // Untrusted env next to a trusted annotation: the annotation decides; the env is replaced
    // by the allocated UUIDs (edits.env), so no override is needed.
    let s = spec(
        &[("gpufence.dev/devices", "1")],
        &["NVIDIA_VISIBLE_DEVICES=all"],
    );
    let p = plan(&s, "c1", &inventory(), &config(), &[]).unwrap();
    assert_eq!(p.allocation.as_ref().unwrap().devices.len(), 1);
    assert!(p.env_overrides.is_empty());
    assert!(
        p.edits
            .env
            .contains(&format!("NVIDIA_VISIBLE_DEVICES={}", uuid(1)))
    );

    // Untrusted NVIDIA_DRIVER_CAPABILITIES does not widen the driver files.
    let s = spec(
        &[("gpufence.dev/devices", "0")],
        &["NVIDIA_DRIVER_CAPABILITIES=all"],
    );
    let p = plan(&s, "c1", &inventory(), &config(), &[]).unwrap();
    assert!(
        !p.edits
            .mounts
            .iter()
            .any(|m| m.container_path.contains("encode"))
    );
    assert!(
        p.notes
            .iter()
            .any(|n| n.contains("NVIDIA_DRIVER_CAPABILITIES"))
    );
    // ... but trusted, it does; and the annotation always does.
    let p = plan(&s, "c1", &inventory(), &trusting(&[Dialect::Nvidia]), &[]).unwrap();
    assert!(
        p.edits
            .mounts
            .iter()
            .any(|m| m.container_path.contains("encode"))
    );
    let s = spec(
        &[
            ("gpufence.dev/devices", "0"),
            ("gpufence.dev/capabilities", "compute,video"),
        ],
        &[],
    );
    let p = plan(&s, "c1", &inventory(), &config(), &[]).unwrap();
    assert!(
        p.edits
            .mounts
            .iter()
            .any(|m| m.container_path.contains("encode"))
    );
    assert!(
        !p.edits
            .mounts
            .iter()
            .any(|m| m.container_path.contains("nvidia-smi"))
    );
}

#[test]
#[rustfmt::skip]
fn errors_are_one_short_line() {
    let huge = "x".repeat(1 << 20);
    let start = std::time::Instant::now();
    for (k, v) in [
        ("gpufence.dev/devices", huge.as_str()),
        ("gpufence.dev/memory", huge.as_str()),
        ("cdi.k8s.io/x", huge.as_str()),
    ] {
        let mut ann = vec![(k, v)];
        if k == "gpufence.dev/memory" {
            ann.push(("gpufence.dev/devices", "0"));
        }
        let s = spec(&ann, &[]);
        let e = plan(&s, "c1", &inventory(), &config(), &[])
            .unwrap_err()
            .to_string();
        assert!(e.len() < 600, "{} bytes: {}", e.len(), &e[..200]);
        assert!(!e.contains('\n'));
        assert!(e.starts_with(k), "{e}");
    }
    let e = plan(
        &spec(&[("gpufence.dev/devices", "0\n1")], &[]),
        "c1",
        &inventory(),
        &config(),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(!e.contains('\n'), "{e}");
    assert!(start.elapsed().as_secs() < 2, "{:?}", start.elapsed());
}

#[test]
#[rustfmt::skip]
fn container_id_is_validated() {
    let s = spec(&[("gpufence.dev/devices", "0")], &[]);
    for bad in ["", ".", "..", "a/b", "../x", "a b", "x\n", &"a".repeat(300)] {
        let e = plan(&s, bad, &inventory(), &config(), &[]).unwrap_err();
        assert_eq!(e.key, "container id", "{bad:?}");
    }
    for good in ["abc", "a.b-c_d+e", "0123456789abcdef", "a,b"] {
        assert!(
            plan(&s, good, &inventory(), &config(), &[]).is_ok(),
            "{good:?}"
        );
    }
}

#[test]
#[rustfmt::skip]
fn malformed_spec_fields() {
    let s = serde_json::json!({"annotations": {"gpufence.dev/devices": 0}});
    let e = plan(&s, "c", &inventory(), &config(), &[]).unwrap_err();
    assert_eq!(e.key, "gpufence.dev/devices");
    let s = serde_json::json!({"annotations": []});
    assert_eq!(
        plan(&s, "c", &inventory(), &config(), &[]).unwrap_err().key,
        "annotations"
    );
    let s = serde_json::json!({"process": {"env": "X=1"}});
    assert_eq!(
        plan(&s, "c", &inventory(), &config(), &[]).unwrap_err().key,
        "process.env"
    );
    let s = serde_json::json!({});
    assert!(
        plan(&s, "c", &inventory(), &config(), &[])
            .unwrap()
            .grants_nothing()
    );
}

/// An image `VOLUME /var/run/nvidia-container-devices/all` becomes a config.json mount too
/// (containerd CRI, CRI-O and podman create image volumes from host directories): only the
/// device plugin's `/dev/null` mounts may name devices, as in nvidia-container-toolkit.
#[test]
fn image_volume_under_device_dir_grants_nothing() {
    let inv = inventory();
    let cfg = config();
    for source in [
        "/var/lib/containerd/io.containerd.grpc.v1.cri/containers/c1/volumes/abc",
        "/var/lib/containers/storage/volumes/abc/_data",
    ] {
        for dest in ["all", "0", "GPU-00000001-aaaa-bbbb-cccc-000000000001"] {
            let mut s = spec(&[], &[]);
            s["mounts"].as_array_mut().unwrap().push(serde_json::json!({
                "destination": format!("/var/run/nvidia-container-devices/{dest}"),
                "type": "bind",
                "source": source,
                "options": ["rbind", "rprivate"],
            }));
            let p = plan(&s, "c1", &inv, &cfg, &[]).unwrap();
            assert!(
                p.allocation.is_none() && p.edits.device_nodes.is_empty(),
                "image volume {dest} from {source} granted {:?}",
                p.allocation
            );
        }
    }
}
