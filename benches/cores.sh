#!/usr/bin/env bash
# Accuracy of the compute share: asked vs measured share of one simulated GPU, alone at 10, 25,
# 50 and 75 % (four GPUs at once), two containers contending (30 % + 70 %), three contending
# (20 + 30 + 50 %), and two without a limit. Each client spins gpufence_spin_1000us kernels
# (libcudart-like: cuGetProcAddress_v2) for SECONDS and reports the device time of the kernels
# that completed after its first second, over that window (the simulated GPU's timeline).
# Needs root (fake device nodes) and gcc. Usage: benches/cores.sh [PROFILE]
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-release}
SECONDS_RUN=${SECONDS_RUN:-6}
if [ "$PROFILE" = release ]; then
  cargo build --release -q -p gpufence-shim -p gpufence-mock-cuda -p gpufence-mock-nvml
fi
T=target/$PROFILE
W=$(mktemp -d /tmp/gpufence-bench-cores.XXXXXX)
trap 'rm -rf "$W"' EXIT
gcc -O2 -o "$W/client" tests/fixtures/cuda_client.c -ldl
ln -s "$PWD/$T/libgpufence_mock_cuda.so" "$W/libcuda.so.1"
ln -s "$PWD/$T/libgpufence_mock_nvml.so" "$W/libnvidia-ml.so.1"
mkdir -p "$W/dev"
gpus=""
for i in 0 1 2 3; do
  mknod "$W/dev/nvidia$i" c 195 $i
  gpus+="${gpus:+,}{\"uuid\": \"GPU-00000000-0000-0000-0000-00000000000$i\", \"name\": \"NVIDIA H100 80GB HBM3\", \"memory_mib\": 81559, \"minor\": $i, \"pci_bus_id\": \"00000000:1$i:00.0\", \"compute_capability\": [9, 0]}"
done
echo "{\"driver_version\": \"580.65.06\", \"cuda_driver_version\": 12080, \"dev_root\": \"$W\", \"gpus\": [$gpus]}" > "$W/node.json"
export GPUFENCE_MOCK_NODE="$W/node.json" LD_LIBRARY_PATH="$W"
SHIM="$PWD/$T/libgpufence.so"
n=0
# spin GPU SHARE|- [POLICY] -> a client in the background, its output in $W/out.<n>
spin() {
  n=$((n + 1))
  local st="$W/state.$n"
  mkdir -p "$st"
  if [ "$2" != - ]; then
    printf 'version=1\ndevice.0.uuid=GPU-00000000-0000-0000-0000-00000000000%s\ndevice.0.cores=%s\n' "$1" "$2" > "$st/quota"
  fi
  CUDA_VISIBLE_DEVICES=$1 GPUFENCE_STATE="$st" LD_PRELOAD="$SHIM" \
    "$W/client" proc spin 1000 "$SECONDS_RUN" 1 plain > "$W/out.$n" &
}
row() { # LABEL ASKED OUTFILE
  awk -v l="$1" -v a="$2" '/^spin/{printf "| %-28s | %6s | %8.1f | %+6.1f |\n", l, a, $6, (a=="-")?0:$6-a}' "$3"
}
echo "compute share accuracy ($PROFILE build, ${SECONDS_RUN} s runs measured after the first second; $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg))"
echo "| case | asked % | measured % | error |"
echo "|---|---|---|---|"
first=$((n + 1))
for p in 10 25 50 75; do spin $((p == 10 ? 0 : p == 25 ? 1 : p == 50 ? 2 : 3)) $p; done
wait
k=$first; for p in 10 25 50 75; do row "alone" $p "$W/out.$k"; k=$((k + 1)); done
first=$((n + 1)); spin 0 30; spin 0 70; wait
row "two contending" 30 "$W/out.$first"; row "two contending" 70 "$W/out.$((first + 1))"
first=$((n + 1)); spin 1 20; spin 1 30; spin 1 50; wait
row "three contending" 20 "$W/out.$first"; row "three contending" 30 "$W/out.$((first + 1))"
row "three contending" 50 "$W/out.$((first + 2))"
first=$((n + 1)); spin 2 -; spin 2 -; wait
row "two without a limit" - "$W/out.$first"; row "two without a limit" - "$W/out.$((first + 1))"
