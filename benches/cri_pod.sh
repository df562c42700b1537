#!/usr/bin/env bash
# Benchmark: a whole pod start through containerd CRI (RunPodSandbox + CreateContainer +
# StartContainer, what the kubelet waits for) with containerd's plain runc handler vs the
# gpufence handler (written by `gpufence runtime configure --runtime containerd`), the latter
# once without a GPU and once with one GPU and a 1Gi quota, interleaved, on an 8-GPU simulated
# node. containerd 2.3 (the engines, ENGINES_DIR) runs on its own socket and directories (never
# the system one).
#
# Usage (root): benches/cri_pod.sh [RUNS]   (default 15; env BIN_DIR as benches/runtime.sh;
# env PY, default target/venv/bin/python, with container-runtime-interface-api and grpcio).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-${RUNS:-15}}
if [ -z "${BIN_DIR:-}" ]; then
  if [ -x target/release/gpufence-runtime ]; then BIN_DIR=target/release; else BIN_DIR=target/debug; fi
fi
BIN_DIR=$(cd "$BIN_DIR" && pwd)
PY=${PY:-target/venv/bin/python}
# The engines' runc 1.5.1 where present (Debian's 1.1.5 has known escapes: configure refuses it).
E=${ENGINES_DIR:-$(cd ../shared/engines/bin 2>/dev/null && pwd || true)}
RUNC=${RUNC:-$(if [ -x "$E/runc" ]; then echo "$E/runc"; else command -v runc; fi)}
[ "$(id -u)" = 0 ] || { echo "cri bench: needs root" >&2; exit 1; }
[ -x "$E/containerd" ] && [ -x "$E/ctr" ] || { echo "cri bench: no engines (ENGINES_DIR with containerd 2.3)" >&2; exit 1; }
for c in umoci tar; do command -v "$c" >/dev/null || { echo "cri bench: $c missing" >&2; exit 1; }; done
"$PY" -c 'import cri_api.v1.api_pb2, grpc' || { echo "cri bench: $PY lacks cri_api/grpc (make deps)" >&2; exit 1; }

S=$(mktemp -d /tmp/gpufence-bench-cri.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  umount -R "$S/c/root" 2>/dev/null || true
  rm -rf "$S" 2>/dev/null || true
}
trap cleanup EXIT

CFG=$(python3 benches/node_config.py "$S" "$BIN_DIR" "$RUNC")
# No kubelet here to record the GPU pods: their annotations are believed.
printf '[allocation]\ntrust-annotations = true\n' >>"$CFG"
export GPUFENCE_CONFIG=$CFG
mkdir -p "$S/state" "$S/cdi" "$S/cdi-node"

# containerd 2.3's own default configuration (version 4) on private directories, the engines'
# runc, the native snapshotter (benches/cri/containerd.sh, shared with the other CRI benches),
# then the gpufence handler written into it as an operator would.
. benches/cri/containerd.sh
D=$S/c # short: containerd refuses a shim socket_dir over 42 characters
containerd_config "$D"
"$BIN_DIR/gpufence" runtime configure --runtime containerd --config "$D/config.toml" >/dev/null
containerd_start "$D"
# Image: static busybox as an OCI image localhost/pause:test (also the sandbox image).
bench_image
import_image "$D"

echo "cri bench: pod start (RunPodSandbox + CreateContainer + StartContainer) through containerd $("$E/containerd" --version | awk '{print $3}'), $RUNS interleaved pods per arm ($BIN_DIR)"
"$PY" benches/cri/pod_timer.py "$D/containerd.sock" "$RUNS" localhost/pause:test \
  runc gpufence 'gpufence={"gpufence.dev/devices": "1", "gpufence.dev/memory": "1Gi"}'
