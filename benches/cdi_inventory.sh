#!/usr/bin/env bash
# Benchmark: `gpufence cdi generate` on a simulated 8-GPU node with MIG on every GPU (7 instances
# each, 56 MIG devices, 129 CDI devices), and `gpufence inventory` from a warm cache.
# Aims: cdi generate < 50 ms, inventory (warm cache) < 2 ms.
# Each figure is the mean wall time of N runs of the whole process; the baseline, measured in the
# same run, is `gpufence --version` (process start-up + exit), and every result is also given as
# a ratio to it and as the cost above it.
# Usage: benches/cdi_inventory.sh [BIN_DIR] (default target/release, else target/debug). Root.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release}
[ -x "$BIN/gpufence" ] || BIN=target/debug
N=${N:-200}
[ "$(id -u)" = 0 ] || { echo "bench needs root (mknod)"; exit 1; }
WORK=$(mktemp -d /tmp/gpufence-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
CFG=$("$BIN/gpufence-sim" node --dir "$WORK/node" --gpus 8 --mig-gpu all)
G="$BIN/gpufence"

# mean wall time in microseconds of N runs of "$@" (stdout discarded); $PREP runs before each
mean_us() {
  local total=0 t0 t1 i
  for ((i = 0; i < N; i++)); do
    if [ -n "${PREP:-}" ]; then eval "$PREP"; fi
    t0=$(date +%s%N)
    "$@" >/dev/null
    t1=$(date +%s%N)
    total=$((total + t1 - t0))
  done
  echo $((total / N / 1000))
}
ms() { awk -v u="$1" 'BEGIN { printf "%.2f ms", u / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
above() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f ms", (a - b) / 1000 }'; }

"$G" --config "$CFG" inventory >/dev/null # warm the cache
devices=$("$G" --config "$CFG" cdi list | wc -l)
base=$(mean_us "$G" --version)
inv=$(mean_us "$G" --config "$CFG" inventory --json)
gen_warm=$(mean_us "$G" --config "$CFG" cdi generate --output "$WORK/spec.yaml")
gen_cold=$(PREP="rm -f $WORK/node/state/inventory.json" mean_us "$G" --config "$CFG" cdi generate --output "$WORK/spec.yaml")

echo "gpufence cdi/inventory benchmark ($BIN, 8 GPUs x 7 MIG, $devices CDI devices, N=$N, mean wall time per process)"
printf '%-46s %10s %8s %14s\n' "command" "time" "ratio" "above baseline"
printf '%-46s %10s %8s %14s\n' "baseline: gpufence --version" "$(ms "$base")" "1.00x" "-"
printf '%-46s %10s %8s %14s\n' "inventory --json (warm cache; aim < 2 ms)" "$(ms "$inv")" "$(ratio "$inv" "$base")" "$(above "$inv" "$base")"
printf '%-46s %10s %8s %14s\n' "cdi generate (warm cache; aim < 50 ms)" "$(ms "$gen_warm")" "$(ratio "$gen_warm" "$base")" "$(above "$gen_warm" "$base")"
printf '%-46s %10s %8s %14s\n' "cdi generate (cold: NVML scan; aim < 50 ms)" "$(ms "$gen_cold")" "$(ratio "$gen_cold" "$base")" "$(above "$gen_cold" "$base")"
