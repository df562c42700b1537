#!/usr/bin/env bash
# Benchmark: the three appliers side by side in one run — a whole pod start through CRI
# (RunPodSandbox + CreateContainer + StartContainer) on containerd 2.3.4 + runc 1.5.1 (the
# engines: ENGINES_DIR), interleaved round by round on an 8-GPU simulated node:
#   runc      containerd's plain runc handler, no GPU (the baseline)
#   handler   the `gpufence` runtime handler (drop-in written by `gpufence runtime configure`),
#             1 GPU with a 1Gi quota
#   nri       the plain runc handler on a second containerd with `gpufence nri` connected,
#             1 GPU with a 1Gi quota
#   nri-nogpu the same containerd with the plugin, no GPU (the plugin's round trip alone)
#   nri (no validation)  a third containerd with `gpufence nri --no-validation`, 1 GPU, 1Gi: the
#             same pod without the ValidateContainerAdjustment round trip (validation's share)
#   handler/nri (DRA CDI device)  GPU 1 as a CDI device containerd resolves from a per-claim spec
#             (CRI CDIDevices, as kubelet passes a DRA claim's ids), 1Gi: a device-borne grant
#   handler (no GPU)  the `gpufence` handler for a pod without a GPU (its pass-through calls and
#             a create that finds nothing to do)
#   cdi only  GPU 1 through `gpufence cdi generate`'s spec on the plain runc handler, no gpufence
#             in the pod's path: the driver edits NVIDIA's NRI plugin makes with that spec (the
#             same driver folders and device nodes; its CreateContainer round trip, < 1 ms, is
#             the `nri (no GPU)` arm's) — what gpufence's own edits (the shim, `ld.so.preload`,
#             the state tmpfs and quota) are measured against
# Then, in the same run, the pass-through call (`list`: what start, state, kill cost the
# handler) interleaved three ways: runc, a static C program that only execve()s runc (the
# floor of any wrapper, built here), and gpufence-runtime.
# Three containerds because a connected plugin sees every container of its runtime. Then the
# create path alone: `gpufence nri`'s decision (CreateContainer → adjustment) from the plugin's
# log, and whether any gpufence process runs per container (the ld-cache hook, with
# runtime.driver-layout = "files" only).
#
# Usage (root): benches/cri_appliers.sh [RUNS]   (default 15; BIN_DIR as benches/runtime.sh;
# PY, default target/venv/bin/python; DRIVER_LAYOUT=files|folders as benches/node_config.py;
# PASS_CALLS, default 40 × RUNS). The GPU pods carry `gpufence.dev/devices: 1` with
# `allocation.trust-annotations = true` (no kubelet here to record them).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-${RUNS:-15}}
if [ -z "${BIN_DIR:-}" ]; then
  if [ -x target/release/gpufence-runtime ]; then BIN_DIR=target/release; else BIN_DIR=target/debug; fi
fi
BIN_DIR=$(cd "$BIN_DIR" && pwd)
PY=${PY:-target/venv/bin/python}
ENGINES_DIR=${ENGINES_DIR:-$(cd ../shared/engines/bin 2>/dev/null && pwd || true)}
E=$ENGINES_DIR
[ "$(id -u)" = 0 ] || { echo "appliers bench: needs root" >&2; exit 1; }
[ -x "$E/containerd" ] && [ -x "$E/runc" ] || { echo "appliers bench: no engines (ENGINES_DIR)" >&2; exit 1; }
for c in umoci tar cc; do command -v "$c" >/dev/null || { echo "appliers bench: $c missing" >&2; exit 1; }; done
"$PY" -c 'import cri_api.v1.api_pb2, grpc' || { echo "appliers bench: $PY lacks cri_api/grpc (make deps)" >&2; exit 1; }
export PATH="$E:$PATH"

S=$(mktemp -d /tmp/gpufence-bench-appliers.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  for d in "$S"/c*/root; do umount -R "$d" 2>/dev/null || true; done
  rm -rf "$S" 2>/dev/null || true
}
trap cleanup EXIT

CFG=$(python3 benches/node_config.py "$S" "$BIN_DIR" "$E/runc")
printf '[allocation]\ntrust-annotations = true\n' >>"$CFG"
# A DRA-style grant: GPU 1 as a CDI device the engine resolves (CRI CDIDevices, as kubelet passes a
# DRA claim's ids), from a root-owned spec in both containerds' cdi_spec_dirs and gpufence's.
DEV_ROOT=$(python3 -c 'import sys,tomllib; print(tomllib.load(open(sys.argv[1],"rb")).get("dev-root","/"))' "$CFG")
mkdir -p "$S/cdi"
cat >"$S/cdi/claim.json" <<JSON
{"cdiVersion": "0.6.0", "kind": "k8s.gpu.nvidia.com/claim", "devices": [{"name": "bench-gpu-1",
 "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "deviceNodes": [
  {"path": "/dev/nvidia1", "hostPath": "$DEV_ROOT/dev/nvidia1"},
  {"path": "/dev/nvidiactl", "hostPath": "$DEV_ROOT/dev/nvidiactl"}]}}]}
JSON
chmod 0644 "$S/cdi/claim.json"
printf '[cdi]\nspec-dirs = ["%s"]\n' "$S/cdi" >>"$CFG"
export GPUFENCE_CONFIG=$CFG
# gpufence's CDI spec of this node (driver folders prepared), read by the containerds only: the
# "cdi only" arm's devices.
mkdir -p "$S/cdi-node"
"$BIN_DIR/gpufence" cdi generate --output "$S/cdi-node/gpufence.json" 2>/dev/null
CDI_KIND=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["kind"])' "$S/cdi-node/gpufence.json")

# containerd_config, containerd_start: a private containerd per arm (benches/cri/containerd.sh).
. benches/cri/containerd.sh
A=$S/cA B=$S/cB C=$S/cC
containerd_config "$A"; containerd_config "$B"; containerd_config "$C"
"$BIN_DIR/gpufence" runtime configure --runtime containerd --config "$A/config.toml" >/dev/null
containerd_start "$A"; containerd_start "$B"; containerd_start "$C"
"$BIN_DIR/gpufence" nri --socket "$B/nri.sock" >"$S/nri.log" 2>&1 &
PIDS+=($!)
"$BIN_DIR/gpufence" nri --no-validation --socket "$C/nri.sock" >"$S/nri-novalidation.log" 2>&1 &
PIDS+=($!)
registered() { grep -c 'NRI: registered' "$S/gpufence.log" 2>/dev/null || true; }
for _ in $(seq 150); do [ "$(registered)" -ge 2 ] && break; sleep 0.2; done
[ "$(registered)" -ge 2 ] || { echo "appliers bench: gpufence nri did not register" >&2; cat "$S/nri.log" "$S/nri-novalidation.log" >&2; exit 1; }

# Image: static busybox as localhost/pause:test (also the sandbox image), in each.
bench_image
for d in "$A" "$B" "$C"; do import_image "$d"; done

GPU='{"gpufence.dev/devices": "1", "gpufence.dev/memory": "1Gi"}'
DRA='{"gpufence.dev/memory": "1Gi", "cdi_devices": ["k8s.gpu.nvidia.com/claim=bench-gpu-1"]}'
CDI_ONLY="{\"cdi_devices\": [\"$CDI_KIND=1\"]}"
echo "appliers bench: pod start through containerd $("$E/containerd" --version | awk '{print $3}') + $("$E/runc" --version | head -1), $RUNS interleaved pods per arm ($BIN_DIR)"
"$PY" benches/cri/pod_timer.py "$A/containerd.sock" "$RUNS" localhost/pause:test \
  "runc (no GPU):runc" "handler (1 GPU):gpufence=$GPU" "nri (1 GPU):runc@$B/containerd.sock=$GPU" \
  "nri (1 GPU, no validation):runc@$C/containerd.sock=$GPU" \
  "nri (no GPU):runc@$B/containerd.sock" "handler (DRA CDI device):gpufence=$DRA" \
  "nri (DRA CDI device):runc@$B/containerd.sock=$DRA" "handler (no GPU):gpufence" \
  "cdi only (gpufence's CDI spec, no gpufence):runc=$CDI_ONLY"

# The pass-through call, same run: runc, the execve floor, gpufence-runtime, interleaved.
cat >"$S/floor.c" <<C
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv) { (void)argc; argv[0] = "$E/runc"; execve(argv[0], argv, environ); return 127; }
C
cc -O2 -static -o "$S/execve-floor" "$S/floor.c"
echo "pass-through call (\`list\`), $((${PASS_CALLS:-40 * RUNS})) interleaved calls per arm, paired against runc:"
mkdir -p "$S/passroot"
python3 - "$((${PASS_CALLS:-40 * RUNS}))" "$S/passroot" "$E/runc" "$S/execve-floor" "$BIN_DIR/gpufence-runtime" <<'PY'
import os, statistics as st, sys, time
n, root, arms = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
names = ["runc", "execve floor (static C)", "gpufence-runtime"]
null = os.open(os.devnull, os.O_WRONLY)
def call(exe):
    t = time.perf_counter()
    pid = os.posix_spawn(exe, [exe, "--root", root, "list"], os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, null, 1)])
    _, status = os.waitpid(pid, 0)
    if status:
        sys.exit(f"{exe} list: exit status {status}")
    return (time.perf_counter() - t) * 1000
for exe in arms:
    call(exe)
times = [[], [], []]
for _ in range(n):
    for i, exe in enumerate(arms):
        times[i].append(call(exe))
for name, xs in zip(names, times):
    q = st.quantiles(xs, n=4)
    d = st.median([x - b for x, b in zip(xs, times[0])])
    r = st.median([x / b for x, b in zip(xs, times[0])])
    print(f"  {name:26s} median {st.median(xs):6.3f} ms (IQR {q[0]:.3f}-{q[2]:.3f}), paired {d:+.3f} ms, ratio {r:.3f}")
d = st.median([g - f for g, f in zip(times[2], times[1])])
print(f"  gpufence-runtime over the execve floor, paired: {d:+.3f} ms")
PY
echo "create path alone (gpufence-runtime in the handler arm, from start to the exec of runc; GPUFENCE_PHASES):"
[ -z "${PHASES_COPY:-}" ] || cp "$S/state/phases.txt" "$S/gpufence.log" "$PHASES_COPY"/
python3 - "$S/state/phases.txt" <<'PY'
import statistics as st, sys
rows = []
for l in open(sys.argv[1]) if __import__("os").path.exists(sys.argv[1]) else []:
    f = dict(kv.split("=", 1) for kv in l.split()[1:] if "=" in kv)
    if "main_at" in f and "exec_at" in f:
        rows.append(("folders" in f, (int(f["exec_at"]) - int(f["main_at"])) / 1000, int(f.get("cpu", 0)) / 1000))
for gpu, what in ((True, "GPU container"), (False, "pod sandbox or no-GPU container")):
    r = [x for x in rows if x[0] == gpu]
    if r:
        print(f"  {what}: {st.median(x[1] for x in r):.2f} ms in the wrapper (cpu {st.median(x[2] for x in r):.2f} ms), {len(r)} creates")
        if len(r) >= 8:
            q = len(r) // 4
            print(f"    drift: first quarter {st.median(x[1] for x in r[:q]):.2f} ms, last quarter {st.median(x[1] for x in r[-q:]):.2f} ms")
if not rows:
    print("  (no phase lines: the shim did not pass GPUFENCE_PHASES on)")
PY
echo "create path alone (gpufence nri's decision per container, from gpufence's log):"
grep -o 'decided in [0-9.]* ms' "$S/gpufence.log" | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {if (NR) printf "  median %.2f ms over %d decisions\n", a[int((NR+1)/2)], NR; else print "  (no timing lines in the plugin log)"}'
grep 'merged adjustment validated' "$S/gpufence.log" | grep -o 'validation_us=[0-9]*' | cut -d= -f2 | sort -n | awk '{a[NR]=$1} END {if (NR) printf "  its validation of the merged adjustment: median %d us over %d validations\n", a[int((NR+1)/2)], NR}'
updated=$(grep -c 'ld cache updated' "$S/gpufence.log" || true)
inproc=$(grep -c 'ld cache refreshed before runc' "$S/gpufence.log" || true)
nri_gpu=$(grep -c 'NRI: adjustment decided' "$S/gpufence.log" || true)
layout=$(grep -c 'driver files mounted as folders' "$S/gpufence.log" || true)
echo "gpufence processes per container: the handler arm 0 besides gpufence-runtime itself ($inproc in-process ld cache writes);"
echo "  the NRI arm: $((updated - inproc)) createContainer hook runs (gpufence hook update-ldcache) for $nri_gpu adjustments"
echo "  (none with runtime.driver-layout = \"folders\", the default: LD_LIBRARY_PATH names the library folder; $layout folder layouts settled)"
