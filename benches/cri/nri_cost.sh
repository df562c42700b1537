#!/usr/bin/env bash
# What `gpufence nri` does per GPU pod, counted so that the machine's load does not move it: one
# containerd 2.3 (the engines: ENGINES_DIR) with the plugin connected, PODS GPU pods (1 GPU, 1Gi)
# through CRI after two warm-up pods, once with the validation of the merged adjustment and once
# with `--no-validation`. WRAP=callgrind (the default): the plugin's instructions per pod
# (`valgrind --tool=callgrind`, zeroed after the warm-up, dumped after the pods); WRAP=strace:
# its syscalls per pod by name (`strace -f -c`, warm-up included). Also containerd's CPU time per
# pod (clock ticks: an indication only).
#
# Usage (root): benches/cri/nri_cost.sh [PODS]   (default 20; BIN_DIR, default target/release;
# PY, default target/venv/bin/python). Not part of `make bench` (valgrind makes it slow).
set -euo pipefail
cd "$(dirname "$0")/../.."
PODS=${1:-20}
WRAP=${WRAP:-callgrind}
BIN_DIR=$(cd "${BIN_DIR:-target/release}" && pwd)
PY=${PY:-target/venv/bin/python}
E=${ENGINES_DIR:-$(cd ../shared/engines/bin 2>/dev/null && pwd || true)}
[ "$(id -u)" = 0 ] || { echo "nri cost: needs root" >&2; exit 1; }
[ -x "$E/containerd" ] || { echo "nri cost: no engines (ENGINES_DIR)" >&2; exit 1; }
command -v "$WRAP" >/dev/null || command -v valgrind >/dev/null || { echo "nri cost: $WRAP missing" >&2; exit 1; }
export PATH="$E:$PATH"
S=$(mktemp -d /tmp/gf-nricost.XXXXXX) # short: containerd caps its socket_dir at 42 characters
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] || rm -rf "$S" 2>/dev/null || true
}
trap cleanup EXIT
. benches/cri/containerd.sh
CFG=$(python3 benches/node_config.py "$S" "$BIN_DIR" "$E/runc")
printf '[allocation]\ntrust-annotations = true\n' >>"$CFG"
export GPUFENCE_CONFIG=$CFG
mkdir -p "$S/cdi" "$S/cdi-node" # containerd_config names them as the CDI spec dirs
bench_image
GPU='{"gpufence.dev/devices": "1", "gpufence.dev/memory": "1Gi"}'
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
echo "nri cost: $PODS GPU pods per arm through containerd $("$E/containerd" --version | awk '{print $3}'), $WRAP ($BIN_DIR)"
for arm in validation no-validation; do
  D=$S/${arm:0:1}
  containerd_config "$D"
  containerd_start "$D"
  CPID=${PIDS[-1]}
  import_image "$D"
  args=(nri --socket "$D/nri.sock")
  [ "$arm" = no-validation ] && args+=(--no-validation)
  : >"$S/gpufence.log"
  case $WRAP in
    strace) strace -f -c -o "$S/$arm.strace" "$BIN_DIR/gpufence" "${args[@]}" >"$S/$arm.out" 2>&1 & ;;
    *) valgrind --tool=callgrind --callgrind-out-file="$S/$arm.cg" "$BIN_DIR/gpufence" "${args[@]}" >"$S/$arm.out" 2>&1 & ;;
  esac
  W=$!
  PIDS+=($W)
  for _ in $(seq 300); do grep -q 'NRI: registered' "$S/gpufence.log" && break; sleep 0.2; done
  grep -q 'NRI: registered' "$S/gpufence.log" || { echo "nri cost: the plugin did not register" >&2; cat "$S/$arm.out" >&2; exit 1; }
  "$PY" benches/cri/pod_timer.py "$D/containerd.sock" 2 localhost/pause:test "warm-up:runc=$GPU" >/dev/null
  [ "$WRAP" = strace ] || callgrind_control -z "$W" >/dev/null
  c0=$(cpu "$CPID")
  "$PY" benches/cri/pod_timer.py "$D/containerd.sock" "$PODS" localhost/pause:test "$arm:runc=$GPU" >/dev/null
  c1=$(cpu "$CPID")
  [ "$WRAP" = strace ] || callgrind_control -d "$W" >/dev/null
  # strace passes SIGTERM on and writes its table when the plugin is gone.
  [ "$WRAP" = strace ] && pkill -TERM -P "$W" -x gpufence || kill -TERM "$W"
  wait "$W" 2>/dev/null || true
  echo "  $arm: containerd CPU $(( (c1 - c0) * 1000 / $(getconf CLK_TCK) / PODS )) ms per pod (clock ticks)"
  if [ "$WRAP" = strace ]; then
    awk -v n="$((PODS + 2))" 'NR > 2 && $NF != "total" && $4 ~ /^[0-9]+$/ {printf "    %-16s %6.1f per pod\n", $NF, $4 / n}' "$S/$arm.strace" | sort -k2 -rn | head -15
    echo "    (all syscalls $(awk '$NF == "total" {print $4}' "$S/$arm.strace") over $((PODS + 2)) pods, start-up included)"
  else
    total=$(grep -h '^summary:' "$S/$arm.cg".* | awk '{print $2}' | sort -n | tail -1)
    echo "    the plugin: $((total / PODS)) instructions per pod"
    callgrind_annotate --inclusive=yes "$(grep -l '^summary: '"$total" "$S/$arm.cg".*)" 2>/dev/null |
      grep -E 'Handler>::(create_container|validate_adjustment|after_the_fact|container_started)|service::decode|inventory::(load|cache::Memo::load)|settle_intake' |
      awk -v n="$PODS" '{gsub(",", "", $1); sub(/ \[.*/, ""); sub(/^\?\?\?:/, "", $NF); printf "    %9d per pod  %s\n", $1 / n, $NF}'
  fi
  kill "$CPID"; wait "$CPID" 2>/dev/null || true
done
