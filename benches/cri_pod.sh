#!/usr/bin/env bash
# Benchmark: a whole pod start through containerd CRI (RunPodSandbox + CreateContainer +
# StartContainer, what the kubelet waits for) with containerd's plain runc handler vs the
# gpufence handler (written by `gpufence runtime configure --runtime containerd`), the latter
# once without a GPU and once with one GPU and a 1Gi quota, interleaved, on an 8-GPU simulated
# node. containerd runs on its own socket and directories (never the system one).
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
for c in containerd ctr runc umoci tar; do command -v "$c" >/dev/null || { echo "cri bench: $c missing" >&2; exit 1; }; done
"$PY" -c 'import cri_api.v1.api_pb2, grpc' || { echo "cri bench: $PY lacks cri_api/grpc (make deps)" >&2; exit 1; }

S=$(mktemp -d /tmp/gpufence-bench-cri.XXXXXX)
CPID=
cleanup() {
  if [ -n "$CPID" ]; then kill "$CPID" 2>/dev/null || true; wait "$CPID" 2>/dev/null || true; fi
  umount -R "$S/containerd/root" 2>/dev/null || true
  rm -rf "$S" 2>/dev/null || true
}
trap cleanup EXIT

CFG=$(python3 benches/node_config.py "$S" "$BIN_DIR" "$RUNC")
# No kubelet here to record the GPU pods: their annotations are believed.
printf '[allocation]\ntrust-annotations = true\n' >>"$CFG"
export GPUFENCE_CONFIG=$CFG

D=$S/containerd
mkdir -p "$D/cni/net.d"
cat >"$D/config.toml" <<TOML
version = 2
root = "$D/root"
state = "$D/state"
[grpc]
  address = "$D/containerd.sock"
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "localhost/pause:test"
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$D/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "native"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = "$RUNC"
TOML
"$BIN_DIR/gpufence" runtime configure --runtime containerd --config "$D/config.toml" >/dev/null
containerd --config "$D/config.toml" >"$S/containerd.log" 2>&1 &
CPID=$!
for _ in $(seq 100); do ctr --address "$D/containerd.sock" version >/dev/null 2>&1 && break; sleep 0.2; done
ctr --address "$D/containerd.sock" version >/dev/null || { cat "$S/containerd.log" >&2; exit 1; }

# Image: static busybox as an OCI image localhost/pause:test (also the sandbox image).
. benches/cri/containerd.sh # bench_image
bench_image
ctr --address "$D/containerd.sock" -n k8s.io images import --base-name localhost/pause --snapshotter native "$S/pause.tar" >/dev/null

echo "cri bench: pod start (RunPodSandbox + CreateContainer + StartContainer) through containerd $(containerd --version | awk '{print $3}'), $RUNS interleaved pods per arm ($BIN_DIR)"
"$PY" benches/cri/pod_timer.py "$D/containerd.sock" "$RUNS" localhost/pause:test \
  runc gpufence 'gpufence={"gpufence.dev/devices": "1", "gpufence.dev/memory": "1Gi"}'
