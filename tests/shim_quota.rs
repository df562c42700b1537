//! libgpufence.so on the simulated node, outside containers: quota held exactly through all
//! three ways of reaching the driver, concurrent processes, reclaim after SIGKILL / exit / fork,
//! VMM, pools (and what they keep after a free), CUDA graphs' memory, arrays, reporting, quota
//! sources, device matching.
//!
//! Needs root (fake device nodes) and gcc; `cargo build --workspace` first (the cdylibs).

mod common;
#[path = "fixtures/cuda_harness.rs"]
mod harness;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;

use harness::{MIB, Node, field, lines, num};

const MODES: [&str; 3] = ["direct", "dlsym", "proc"];

#[test]
fn one_process_is_held_to_its_quota_exactly_on_every_path() {
    let Some(node) = Node::new("shim-exact", &[1024]) else {
        return;
    };
    // a quota that is not a multiple of the chunk: the last odd bytes are usable too
    let quota = 100 * MIB + 12345;
    for mode in MODES {
        let st = node.state(mode, Some(&node.quota(&[(0, 0, quota)])));
        let out = node.run(
            mode,
            &st,
            &[
                "where", "info", "totalmem", "fill", "1048576", "alloc", "12345", "alloc", "1",
                "info", "free", "fill", "1048576", "free", "info",
            ],
        );
        for l in lines(&out, "where") {
            let f: Vec<&str> = l.split_whitespace().collect();
            let wrapped = !matches!(
                f[1],
                "cuInit"
                    | "cuDeviceGet"
                    | "cuDevicePrimaryCtxRetain"
                    | "cuCtxSetCurrent"
                    | "cuModuleLoadData"
                    | "cuModuleGetFunction"
                    | "cuLibraryLoadData"
                    | "cuLibraryGetKernel"
                    | "cuStreamCreate"
                    | "cuStreamSynchronize"
                    | "cuStreamQuery"
                    | "cuCtxSynchronize"
                    | "cuGraphCreate"
                    | "cuEventCreate"
                    | "cuEventRecord"
                    | "cuEventQuery"
                    | "cuEventSynchronize"
                    | "cuEventElapsedTime"
                    | "cuGraphInstantiateWithFlags"
                    | "cuMemAddressReserve"
                    | "cuMemSetAccess"
                    | "cuMemHostAlloc"
                    | "cuMemFreeHost"
                    | "cuIpcGetMemHandle"
                    | "cuIpcOpenMemHandle_v2"
                    | "cuIpcCloseMemHandle"
                    | "cuMemExportToShareableHandle"
                    | "cuLaunchHostFunc"
            );
            if wrapped {
                assert_eq!(f[2], "libgpufence.so", "{mode}: {l}");
            }
        }
        let info: Vec<&str> = lines(&out, "info");
        assert_eq!(
            info[0],
            format!("info {quota} {quota}"),
            "{mode}: slice before use"
        );
        assert_eq!(num(&out, "totalmem"), quota, "{mode}");
        let fills: Vec<u64> = lines(&out, "fill")
            .iter()
            .map(|l| l[5..].parse().unwrap())
            .collect();
        assert_eq!(
            fills,
            vec![100 * MIB, 100 * MIB],
            "{mode}: full quota usable, and again after free"
        );
        assert!(out.contains("alloc 12345 ok\n"), "{mode}: {out}");
        assert!(
            out.contains("alloc 1 err 2\n"),
            "{mode}: one byte past the quota is refused: {out}"
        );
        assert_eq!(info[1], format!("info 0 {quota}"), "{mode}: nothing left");
        assert_eq!(info[2], format!("info {quota} {quota}"), "{mode}: all back");
    }
}

#[test]
fn eight_processes_allocating_concurrently_never_exceed_the_quota_together() {
    let Some(node) = Node::new("shim-concurrent", &[1024]) else {
        return;
    };
    let quota = 64 * MIB;
    let st = node.state("c", Some(&node.quota(&[(0, 0, quota)])));
    let counter = node.dir.join("counter");
    std::fs::write(&counter, [0u8; 8]).unwrap();
    let q = quota.to_string();
    let ctr = counter.to_str().unwrap();
    let children: Vec<_> = (0..8)
        .map(|i| {
            let seed = (1000 + i).to_string();
            node.spawn(
                MODES[i % 3],
                &st,
                &["random", &seed, "4000", "6000000", ctr, &q],
            )
        })
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for c in children {
        let out = harness::output_ok(c.wait_with_output().unwrap());
        let f = field(&out, "random");
        let peak: u64 = f[0].parse().unwrap();
        assert!(peak <= quota, "peak {peak} > quota {quota}");
        ok += f[1].parse::<u64>().unwrap();
        refused += f[2].parse::<u64>().unwrap();
    }
    assert!(ok > 1000, "allocations succeeded: {ok}");
    assert!(refused > 100, "the quota was contended: {refused} refusals");
    // everything was given back: a newcomer gets the whole quota
    let out = node.run("dlsym", &st, &["fill", "1048576"]);
    assert_eq!(num(&out, "fill"), quota);
}

/// A process (linked against the driver) holding 80 MiB, once it says so.
fn hold_80_mib(node: &Node, st: &std::path::Path) -> std::process::Child {
    let mut holder = node.spawn("direct", st, &["alloc", &(80 * MIB).to_string(), "hold"]);
    let mut rd = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    rd.read_line(&mut line).unwrap();
    assert!(line.starts_with("alloc 83886080 ok"), "{line}");
    line.clear();
    rd.read_line(&mut line).unwrap();
    assert_eq!(line, "holding\n");
    holder
}

#[test]
fn sigkilled_process_memory_is_reclaimed() {
    let Some(node) = Node::new("shim-kill", &[1024]) else {
        return;
    };
    let quota = 100 * MIB;
    let st = node.state("k", Some(&node.quota(&[(0, 0, quota)])));
    let mut holder = hold_80_mib(&node, &st);
    // a neighbour in the same container sees the holder's share
    let out = node.run(
        "dlsym",
        &st,
        &["info", "alloc", &(30 * MIB).to_string(), "fill", "1048576"],
    );
    assert_eq!(
        field(&out, "info"),
        vec![(20 * MIB).to_string(), quota.to_string()]
    );
    assert!(out.contains(&format!("alloc {} err 2", 30 * MIB)), "{out}");
    assert_eq!(num(&out, "fill"), 20 * MIB);
    holder.kill().unwrap();
    holder.wait().unwrap();
    let out = node.run("proc", &st, &["fill", "1048576", "info"]);
    assert_eq!(
        num(&out, "fill"),
        quota,
        "the killed process's 80 MiB came back"
    );
}

#[test]
fn forked_child_is_accounted_separately_and_reclaimed() {
    let Some(node) = Node::new("shim-fork", &[1024]) else {
        return;
    };
    let st = node.state("f", Some(&node.quota(&[(0, 0, 64 * MIB)])));
    let out = node.run(
        "dlsym",
        &st,
        &[
            "alloc",
            &(16 * MIB).to_string(),
            "forkfill",
            "1048576",
            "free",
            "fill",
            "1048576",
        ],
    );
    assert_eq!(
        num(&out, "child"),
        48 * MIB,
        "child gets what the parent left: {out}"
    );
    assert_eq!(field(&out, "forked"), vec!["0"]);
    assert_eq!(
        num(&out, "fill"),
        64 * MIB,
        "the dead child's memory was reclaimed: {out}"
    );
}

#[test]
fn vmm_async_pool_managed_pitch_and_array_allocations_count() {
    let Some(node) = Node::new("shim-kinds", &[1024]) else {
        return;
    };
    for mode in MODES {
        let st = node.state(mode, Some(&node.quota(&[(0, 0, 64 * MIB)])));
        let m = |n: u64| (n * MIB).to_string();
        let out = node.run(
            mode,
            &st,
            &[
                "vmm",
                &m(16),
                "async",
                &m(8),
                "ptsz",
                &m(8),
                "pool",
                &m(8),
                "newpool",
                &m(8),
                "managed",
                &m(8),
                "vmm",
                &m(8),
                "info",
                "vmm",
                &m(2),
                "async",
                "1",
                "ptsz",
                "1",
                "pool",
                "1",
                "newpool",
                "1",
                "managed",
                "1",
                "alloc",
                "1",
                "free",
                "info",
                // arrays and pitched memory: 4 MiB float4 2D array, 3D array, mipmap, pitch
                "array",
                "512",
                "512",
                "array3d",
                "64",
                "64",
                "64",
                "mipmap",
                "256",
                "256",
                "4",
                "pitch",
                "1000",
                "1000",
                "info",
                "fill",
                "1048576",
                "vmm",
                &m(2),
                "free",
                "info",
            ],
        );
        for kind in [
            "vmm 16777216",
            "vmm 8388608",
            "managed 8388608",
            "async 8388608",
            "ptsz 8388608",
            "pool 8388608",
            "newpool 8388608",
        ] {
            assert!(out.contains(&format!("{kind} ok")), "{mode}: {kind}: {out}");
        }
        let info = lines(&out, "info");
        assert_eq!(
            info[0],
            format!("info 0 {}", 64 * MIB),
            "{mode}: 16+8+8+8+8+8+8 MiB charged"
        );
        for refused in [
            "vmm 2097152",
            "async 1",
            "ptsz 1",
            "pool 1",
            "newpool 1",
            "managed 1",
            "alloc 1",
        ] {
            assert!(
                out.contains(&format!("{refused} err 2")),
                "{mode}: {refused} must be refused: {out}"
            );
        }
        assert_eq!(
            info[1],
            format!("info {} {}", 64 * MIB, 64 * MIB),
            "{mode}: all released"
        );
        // array 512x512 float4 = 4 MiB; 3D 64^3 float4 = 4 MiB; mipmap 256^2 float4 4 levels
        // = (65536+16384+4096+1024)*16; pitch 1024*1000
        let arrays = 4 * MIB + 4 * MIB + (65536 + 16384 + 4096 + 1024) * 16 + 1024 * 1000;
        assert_eq!(
            info[2],
            format!("info {} {}", 64 * MIB - arrays, 64 * MIB),
            "{mode}: {out}"
        );
        assert_eq!(num(&out, "fill"), (64 * MIB - arrays) / MIB * MIB, "{mode}");
        assert_eq!(
            info[3],
            format!("info {} {}", 64 * MIB, 64 * MIB),
            "{mode}: arrays released"
        );
    }
}

/// Issue 33: memory a CUDA graph holds (stream-ordered allocations captured into it) counts
/// from the graph's first launch, not at capture, stays counted while the instantiation lives
/// (also for the allocation the graph freed itself), and after it is destroyed until the device's
/// graph memory is trimmed. A launch whose graph does not fit fails before the driver runs it.
/// The same for a memory node added by hand (`cuGraphAddMemAllocNode`).
#[test]
fn graph_memory_counts_from_launch_until_trim() {
    on_every_path_with_100_mib(
        "shim-graphmem",
        "info graphmem 20M info graphmem 40M info alloc 61M graphtrim info alloc \
         61M info graphnode 30M graphnode 10M info",
        |mode, out| {
            let quota = 100 * MIB;
            let infos: Vec<String> = lines(out, "info").iter().map(|l| l.to_string()).collect();
            let q = quota.to_string();
            assert_eq!(
                infos,
                vec![
                    format!("info {q} {q}"),
                    format!("info {} {q}", 60 * MIB),
                    format!("info {} {q}", 60 * MIB),
                    format!("info {q} {q}"),
                    format!("info {} {q}", 39 * MIB),
                    format!("info {} {q}", 9 * MIB),
                ],
                "{mode}: {out}"
            );
            for want in [
                // 2 × 20 MiB held by the first graph; the second (2 × 40 MiB) does not fit
                format!("graphmem {} ok", 40 * MIB),
                format!("graphmem {} err 2", 80 * MIB),
                // while the graph holds 40 MiB, 61 MiB more does not fit; after the trim it does
                format!("alloc {} err 2", 61 * MIB),
                "graphtrim ok".to_string(),
                format!("alloc {} ok", 61 * MIB),
                // a graph built by hand with a 30 MiB memory node, on top of the 61 MiB
                format!("graphnode {} ok", 30 * MIB),
                format!("graphnode {} err 2", 10 * MIB),
            ] {
                assert!(out.contains(&want), "{mode}: {want}: {out}");
            }
        },
    );
}

/// Issue 33: every other way memory enters a CUDA graph counts as capture and
/// `cuGraphAddMemAllocNode` do: a memory node added by the generic `cuGraphAddNode` (and its
/// `_v2`), a clone of a graph with memory nodes, a child graph moved into its parent, an
/// instantiation uploaded (`cuGraphUpload`, or `cuGraphInstantiateWithParams` with the upload
/// flag: memory taken before any launch), and an instantiation updated to a graph with more
/// memory (`cuGraphExecUpdate`, both versions). Parameters that would change a memory node
/// afterwards are refused.
#[test]
fn every_way_memory_enters_a_graph_counts() {
    on_every_path_with_100_mib(
        "shim-graphways",
        "graphaddnode 30M graphaddnode2 30M info graphclone 30M info graphaddnode 30M graphtrim \
         graphchild 40M graphupload 40M info graphinstupload 30M graphaddnode2 30M graphtrim info \
         graphupdate 20M 50M info graphupdate 20M 60M graphupdate1 10M 40M graphtrim \
         graphchildclone 10M graphsetparams 90M info",
        |mode, out| {
            let q = (100 * MIB).to_string();
            let infos: Vec<String> = lines(out, "info").iter().map(|l| l.to_string()).collect();
            assert_eq!(
                infos,
                vec![
                    format!("info {} {q}", 40 * MIB),
                    format!("info {} {q}", 10 * MIB),
                    format!("info {} {q}", 20 * MIB),
                    format!("info {q} {q}"),
                    // 20 MiB launched, updated to a graph of 50 MiB: 50 MiB held
                    format!("info {} {q}", 50 * MIB),
                    format!("info {q} {q}"),
                ],
                "{mode}: {out}"
            );
            for want in [
                format!("graphaddnode {} ok", 30 * MIB),
                format!("graphaddnode2 {} ok", 30 * MIB),
                format!("graphclone {} ok", 30 * MIB),
                // 90 MiB held by the three graphs: a fourth does not fit
                format!("graphaddnode {} err 2", 30 * MIB),
                format!("graphchild {} ok", 40 * MIB),
                format!("graphupload {} ok", 40 * MIB),
                // 80 MiB held by the launched child graph and the uploaded one
                format!("graphinstupload {} err 2", 30 * MIB),
                format!("graphaddnode2 {} err 2", 30 * MIB),
                format!("graphupdate {} ok", 50 * MIB),
                // 50 + 20 held; growing the second graph to 60 MiB needs 40 more: refused
                format!("graphupdate {} err 2", 60 * MIB),
                // 50 + 20 + 10 held; the v1 update to 40 MiB needs 30 more: refused
                format!("graphupdate1 {} err 2", 40 * MIB),
                // the driver refuses a cloned child with memory nodes, and new parameters for a
                // memory node
                format!("graphchildclone {} err 801", 10 * MIB),
                format!("graphsetparams {} err 801", 90 * MIB),
            ] {
                assert!(out.contains(&want), "{mode}: {want}: {out}");
            }
        },
    );
}

/// Issue 33: every way to device memory the driver offers (and NVIDIA's runtime resolves), one
/// row each: 40 MiB through it is charged (24 MiB of the 64 MiB slice left), 30 MiB more through
/// it is refused, and everything comes back once freed. The first column is the command of the
/// client (tests/fixtures/cuda_client.c), then its arguments for 40 MiB and for 30 MiB.
const DEVICE_MEMORY_PATHS: &[(&str, &str, &str)] = &[
    ("alloc", "40M", "30M"),                   // cuMemAlloc_v2
    ("managed", "40M", "30M"),                 // cuMemAllocManaged
    ("pitch", "40960 1024", "30720 1024"),     // cuMemAllocPitch_v2
    ("async", "40M", "30M"),                   // cuMemAllocAsync
    ("ptsz", "40M", "30M"),                    // cuMemAllocAsync_ptsz
    ("pool", "40M", "30M"),                    // cuMemAllocFromPoolAsync, default pool
    ("newpool", "40M", "30M"),                 // cuMemAllocFromPoolAsync, created pool
    ("vmm", "40M", "30M"),                     // cuMemCreate
    ("vmmmapped", "40M", "30M"),               // cuMemCreate, mapped, handle released at once
    ("vmmretained", "40M", "30M"),             // cuMemRetainAllocationHandle's reference released
    ("vmmimport", "40M", "30M"),               // cuMemImportFromShareableHandle, then mapped
    ("array", "2048 1280", "2048 960"),        // cuArrayCreate_v2 (float4)
    ("array3d", "128 128 160", "128 128 120"), // cuArray3DCreate_v2
    ("mipmap", "2048 1280 1", "2048 960 1"),   // cuMipmappedArrayCreate
    ("graphmem", "20M", "15M"),                // cuMemAllocAsync captured into a graph (twice)
    ("graphnode", "40M", "30M"),               // cuGraphAddMemAllocNode
    ("graphaddnode", "40M", "30M"),            // cuGraphAddNode
    ("graphaddnode2", "40M", "30M"),           // cuGraphAddNode_v2
    ("graphclone", "40M", "30M"),              // cuGraphClone
    ("graphchild", "40M", "30M"),              // a child graph moved into its parent
    ("graphupload", "40M", "30M"),             // cuGraphUpload
    ("graphinstupload", "40M", "30M"),         // cuGraphInstantiateWithParams, upload flag
];

#[test]
fn every_device_memory_path_is_counted_and_refused_past_the_quota() {
    let Some(node) = Node::new("shim-paths", &[1024]) else {
        return;
    };
    let quota = 64 * MIB;
    for mode in MODES {
        for (cmd, first, second) in DEVICE_MEMORY_PATHS {
            let st = node.state(
                &format!("{mode}-{cmd}"),
                Some(&node.quota(&[(0, 0, quota)])),
            );
            let script = format!("{cmd} {first} info {cmd} {second} free graphtrim info");
            let out = node.run(
                mode,
                &st,
                &mib_words(&script)
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
            );
            let results: Vec<&str> = lines(&out, cmd);
            assert!(
                results.len() == 2 && results[0].ends_with(" ok") && results[1].ends_with(" err 2"),
                "{mode} {cmd}: 40 MiB fit, 30 MiB more refused: {out}"
            );
            assert_eq!(
                lines(&out, "info"),
                vec![
                    format!("info {} {quota}", 24 * MIB),
                    format!("info {quota} {quota}")
                ],
                "{mode} {cmd}: 40 MiB charged, then given back: {out}"
            );
        }
    }
}

/// Host memory (`cuMemHostAlloc`) works under a quota and is not charged; an IPC handle opened
/// in another process of the container maps memory its exporter was charged for, so opening it
/// charges nothing more.
#[test]
fn host_memory_and_ipc_imports_are_not_charged_twice() {
    on_every_path_with_100_mib(
        "shim-host-ipc",
        "hostalloc 80M info hostalloc 30M free info ipcfork 40M info free info",
        |mode, out| {
            let q = (100 * MIB).to_string();
            assert!(
                out.contains(&format!("hostalloc {} ok", 80 * MIB)),
                "{mode}: {out}"
            );
            assert!(
                out.contains(&format!("hostalloc {} ok", 30 * MIB)),
                "{mode}: {out}"
            );
            assert_eq!(
                field(out, "ipcopen"),
                vec![(40 * MIB).to_string(), "ok".into(), (60 * MIB).to_string()],
                "{mode}: the child sees the exporter's 40 MiB once: {out}"
            );
            assert_eq!(
                lines(out, "info"),
                vec![
                    format!("info {q} {q}"),
                    format!("info {q} {q}"),
                    format!("info {} {q}", 60 * MIB),
                    format!("info {q} {q}"),
                ],
                "{mode}: {out}"
            );
        },
    );
}

/// Issue 33: memory freed into a stream-ordered pool stays with the pool (the driver keeps it for
/// the pool's next allocations), so it stays charged: until a synchronization gives back what
/// the pool keeps above its release threshold (0 by default), or a trim. PyTorch's
/// `cudaMallocAsync` backend sets the threshold to the maximum: only `empty_cache` (a trim)
/// gives the memory back, and meanwhile no other allocation may take it a second time.
#[test]
fn memory_a_pool_keeps_stays_charged_until_released() {
    on_every_path_with_100_mib(
        "shim-poolkeep",
        "threshold max asyncfree 60M info alloc 50M ctxsync info async 50M info \
         free pooltrim info threshold 0 asyncfree 60M info ctxsync info",
        |mode, out| {
            let quota = 100 * MIB;
            let q = quota.to_string();
            let infos: Vec<String> = lines(out, "info").iter().map(|l| l.to_string()).collect();
            assert_eq!(
                infos,
                vec![
                    // the pool keeps 60 MiB: neither a plain allocation nor a synchronization frees it
                    format!("info {} {q}", 40 * MIB),
                    format!("info {} {q}", 40 * MIB),
                    // the pool's own next allocation reuses it
                    format!("info {} {q}", 40 * MIB),
                    // freed into the pool again, then trimmed
                    format!("info {q} {q}"),
                    // threshold 0: kept until the next synchronization
                    format!("info {} {q}", 40 * MIB),
                    format!("info {q} {q}"),
                ],
                "{mode}: {out}"
            );
            assert!(
                out.contains(&format!("alloc {} err 2", 50 * MIB)),
                "{mode}: {out}"
            );
            assert!(
                out.contains(&format!("async {} ok", 50 * MIB)),
                "{mode}: {out}"
            );
        },
    );
}

/// `cuMemAllocAsync` takes from the device's current pool: after `cuDeviceSetMemPool` what a
/// free keeps is the new pool's, which a trim of the default pool does not give back.
#[test]
fn stream_ordered_memory_follows_the_current_pool() {
    on_every_path_with_100_mib(
        "shim-setpool",
        "asyncfree 10M pooltrim info setpool asyncfree 60M pooltrim info",
        |mode, out| {
            let q = (100 * MIB).to_string();
            assert!(out.contains("setpool ok"), "{mode}: {out}");
            assert_eq!(
                lines(out, "info"),
                vec![format!("info {q} {q}"), format!("info {} {q}", 40 * MIB)],
                "{mode}: {out}"
            );
        },
    );
}

/// Issue 33, found under JAX: host functions run in stream order and a synchronization waits for
/// them, through the shim on every path to the driver (XLA finishes a device-to-host transfer in
/// one host function and signals it from the next; the simulated driver ran each on a thread of
/// its own, unordered, and handed the array over before it was written).
#[test]
fn host_functions_run_in_stream_order_and_synchronize_waits_for_them() {
    on_every_path_with_100_mib("shim-hostorder", "hostorder hostorder", |mode, out| {
        assert_eq!(
            lines(out, "hostorder"),
            ["hostorder 1 2", "hostorder 1 2"],
            "{mode}: {out}"
        );
    });
}

/// Run the client with `args` (words; `NNM`: NN MiB) on every path to the driver, each under its own
/// 100 MiB quota, and `check(mode, output)`.
fn on_every_path_with_100_mib(name: &str, args: &str, check: impl Fn(&str, &str)) {
    let Some(node) = Node::new(name, &[1024]) else {
        return;
    };
    let args = mib_words(args);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for mode in MODES {
        let st = node.state(mode, Some(&node.quota(&[(0, 0, 100 * MIB)])));
        check(mode, &node.run(mode, &st, &args));
    }
}

#[test]
fn without_quota_the_shim_passes_through() {
    let Some(node) = Node::new("shim-none", &[256]) else {
        return;
    };
    let st = node.state("none", None);
    let out = node.run("dlsym", &st, &["where", "fill", "1048576", "info"]);
    assert_eq!(num(&out, "fill"), 256 * MIB);
    // dlsym hands out the driver's own functions: zero overhead
    assert!(out.contains("where cuMemAlloc_v2 libcuda.so.1"), "{out}");
    assert!(
        !st.join("accounting").exists(),
        "no accounting without a quota"
    );
}

#[test]
fn env_quota_applies_only_without_a_quota_file() {
    let Some(node) = Node::new("shim-env", &[256]) else {
        return;
    };
    let st = node.state("env", None);
    let mut c = node.client("dlsym", &st, &["fill", "1048576"]);
    c.env("GPUFENCE_MEMORY_LIMIT_0", (50 * MIB).to_string());
    assert_eq!(
        num(&harness::output_ok(c.output().unwrap()), "fill"),
        50 * MIB
    );
    // the read-only file wins over a process's own env
    let st = node.state("file", Some(&node.quota(&[(0, 0, 10 * MIB)])));
    let mut c = node.client("dlsym", &st, &["fill", "1048576"]);
    c.env("GPUFENCE_MEMORY_LIMIT_0", (200 * MIB).to_string());
    assert_eq!(
        num(&harness::output_ok(c.output().unwrap()), "fill"),
        10 * MIB
    );
}

#[test]
fn damaged_quota_file_fails_closed() {
    let Some(node) = Node::new("shim-damaged", &[256]) else {
        return;
    };
    let st = node.state("bad", Some("version=1\ndevice.0.memory=lots\n"));
    let o = node.client("dlsym", &st, &["alloc", "1"]).output().unwrap();
    let out = harness::output_ok(o.clone());
    assert!(out.contains("alloc 1 err 2"), "{out}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("gpufence:") && err.contains("quota"), "{err}");
}

#[test]
fn devices_are_matched_by_uuid_and_accounted_per_container_device() {
    let Some(node) = Node::new("shim-uuid", &[1024, 1024]) else {
        return;
    };
    // quota ordinals deliberately disagree with the CUDA order: the UUID decides
    let q = format!(
        "version=1\ndevice.0.uuid={}\ndevice.0.memory={}\ndevice.1.uuid={}\ndevice.1.memory={}\n",
        node.gpus[1],
        10 * MIB,
        node.gpus[0],
        20 * MIB
    );
    let st = node.state("u", Some(&q));
    let out = node.run("dlsym", &st, &["fill", "1048576", "free"]);
    assert_eq!(
        num(&out, "fill"),
        20 * MIB,
        "CUDA device 0 is GPU 0 = quota device 1"
    );
    let mut c = node.client("proc", &st, &["fill", "1048576", "free"]);
    c.env("CLIENT_DEVICE", "1");
    assert_eq!(
        num(&harness::output_ok(c.output().unwrap()), "fill"),
        10 * MIB
    );
    // one process sees GPU 1 as CUDA device 0, another as device 1: they share its quota
    let mut a = node.client("direct", &st, &["alloc", &(6 * MIB).to_string(), "hold"]);
    a.env("CUDA_VISIBLE_DEVICES", &node.gpus[1])
        .stdout(std::process::Stdio::piped());
    let mut a = a.spawn().unwrap();
    let mut rd = BufReader::new(a.stdout.take().unwrap());
    let mut line = String::new();
    rd.read_line(&mut line).unwrap();
    assert!(line.contains("ok"), "{line}");
    let mut c = node.client("dlsym", &st, &["fill", "1048576"]);
    c.env("CLIENT_DEVICE", "1");
    assert_eq!(
        num(&harness::output_ok(c.output().unwrap()), "fill"),
        4 * MIB
    );
    a.kill().unwrap();
    a.wait().unwrap();
}

#[test]
fn accounting_region_is_shared_with_non_root_users() {
    let Some(node) = Node::new("shim-nonroot", &[256]) else {
        return;
    };
    let st = node.state("nr", Some(&node.quota(&[(0, 0, 32 * MIB)])));
    // root's process creates the region; an unprivileged one must share it
    let mut holder = node.spawn("dlsym", &st, &["alloc", &(8 * MIB).to_string(), "hold"]);
    let mut rd = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    rd.read_line(&mut line).unwrap();
    let mode = std::fs::metadata(st.join("accounting"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o666);
    let (plain, _) = harness::clients();
    let _ = std::fs::set_permissions(
        plain.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    );
    let mut c = node.client("dlsym", &st, &["fill", "1048576"]);
    std::os::unix::process::CommandExt::uid(&mut c, 65534);
    std::os::unix::process::CommandExt::gid(&mut c, 65534);
    let out = harness::output_ok(c.output().unwrap());
    assert_eq!(num(&out, "fill"), 24 * MIB);
    holder.kill().unwrap();
    holder.wait().unwrap();
}

#[test]
fn nvml_reports_the_containers_slice() {
    let Some(node) = Node::new("shim-nvml", &[1024]) else {
        return;
    };
    let quota = 100 * MIB;
    let st = node.state("n", Some(&node.quota(&[(0, 0, quota)])));
    let out = node.run("dlsym", &st, &["nvml"]);
    assert_eq!(
        field(&out, "nvml"),
        [quota, quota, 0].map(|v| v.to_string()),
        "{out}"
    );
    assert_eq!(
        field(&out, "nvml2"),
        [quota, 0, quota, 0].map(|v| v.to_string()),
        "{out}"
    );
    assert_eq!(field(&out, "nvml-where"), vec!["libgpufence.so"]);
    // a process of the container holds 30 MiB: nvidia-smi in any other process shows it
    let mut holder = node.spawn("direct", &st, &["alloc", &(30 * MIB).to_string(), "hold"]);
    let mut rd = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    rd.read_line(&mut line).unwrap();
    let out = node.run("proc", &st, &["nvml"]);
    assert_eq!(
        field(&out, "nvml"),
        [quota, 70 * MIB, 30 * MIB].map(|v| v.to_string()),
        "{out}"
    );
    assert_eq!(
        field(&out, "nvml2"),
        [quota, 0, 70 * MIB, 30 * MIB].map(|v| v.to_string()),
        "{out}"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    // never more than the device: a quota above the physical size reports the device
    let st = node.state("big", Some(&node.quota(&[(0, 0, 4096 * MIB)])));
    let out = node.run("dlsym", &st, &["nvml"]);
    assert_eq!(field(&out, "nvml")[0], (1024 * MIB).to_string(), "{out}");
    // without a quota NVML is untouched
    let st = node.state("none", None);
    let out = node.run("dlsym", &st, &["nvml"]);
    assert_eq!(
        field(&out, "nvml"),
        [1024 * MIB, 1024 * MIB, 0].map(|v| v.to_string()),
        "{out}"
    );
}

#[test]
fn oversubscribe_spills_past_the_quota_instead_of_failing() {
    let Some(node) = Node::new("shim-over", &[256]) else {
        return;
    };
    let q = node
        .quota(&[(0, 0, 10 * MIB)])
        .replace("oversubscribe=0", "oversubscribe=1");
    let st = node.state("o", Some(&q));
    // cuMemAlloc_v2 past the quota is served as managed (host-backed) memory, not charged
    let out = node.run(
        "dlsym",
        &st,
        &[
            "alloc",
            &(8 * MIB).to_string(),
            "alloc",
            &(8 * MIB).to_string(),
            "info",
        ],
    );
    assert_eq!(lines(&out, "alloc").len(), 2);
    assert!(!out.contains("err"), "{out}");
    assert_eq!(
        field(&out, "info"),
        vec![(2 * MIB).to_string(), (10 * MIB).to_string()],
        "{out}"
    );
}

/// Issue 15.9: a process zeroing the container-wide counters of the 0666 accounting region does
/// not lift the quota: totals are recomputed from the live processes' slots.
#[test]
fn zeroed_header_counters_do_not_lift_the_quota() {
    let Some(node) = Node::new("shim-zeroed", &[1024]) else {
        return;
    };
    let quota = 100 * MIB;
    let st = node.state("z", Some(&node.quota(&[(0, 0, quota)])));
    let mut holder = hold_80_mib(&node, &st);
    // The header's per-device counters (after magic and layout): what any process may zero.
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(st.join("accounting"))
            .unwrap();
        f.seek(SeekFrom::Start(16)).unwrap();
        f.write_all(&[0u8; 64 * 8]).unwrap();
    }
    let out = node.run(
        "dlsym",
        &st,
        &["info", "alloc", &(30 * MIB).to_string(), "fill", "1048576"],
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(
        field(&out, "info"),
        vec![(20 * MIB).to_string(), quota.to_string()],
        "{out}"
    );
    assert!(out.contains(&format!("alloc {} err 2", 30 * MIB)), "{out}");
    assert_eq!(num(&out, "fill"), 20 * MIB, "{out}");
}

/// Issue 15.9: `dlvsym` is no way around the shim — neither glibc's `dlsym` fetched by version
/// nor the CUDA names looked up through `dlvsym` itself.
#[test]
fn dlvsym_does_not_bypass_the_shim() {
    let Some(node) = Node::new("shim-dlvsym", &[1024]) else {
        return;
    };
    let quota = 64 * MIB;
    for mode in ["dlvsym-dlsym", "dlvsym"] {
        let st = node.state(mode, Some(&node.quota(&[(0, 0, quota)])));
        let out = node.run(mode, &st, &["where", "fill", "1048576", "info"]);
        assert!(
            out.contains("where cuMemAlloc_v2 libgpufence.so"),
            "{mode}: {out}"
        );
        assert_eq!(num(&out, "fill"), quota, "{mode}: {out}");
    }
}

/// The words of a client script, `NNM` turned into NN MiB in bytes.
fn mib_words(script: &str) -> Vec<String> {
    script
        .split_whitespace()
        .map(
            |a| match a.strip_suffix('M').and_then(|n| n.parse::<u64>().ok()) {
                Some(n) => (n * MIB).to_string(),
                None => a.to_string(),
            },
        )
        .collect()
}
