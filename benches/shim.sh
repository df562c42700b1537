#!/usr/bin/env bash
# Added cost of libgpufence.so per cuMemAlloc_v2 + cuMemFree_v2 pair and per cuLaunchKernel,
# against the unshimmed mock driver, in one run: the same client binary (dlopen + dlsym, like
# libcudart) runs interleaved without the shim, with the shim and a memory quota (enforcing),
# with a memory quota and a compute share (cores: every launch paced, one in 128 timed with an
# event pair), and with the shim but no quota (pass-through); ROUNDS rounds, medians reported.
# The launched kernel takes no device time, so pacing never sleeps: what is measured is the
# limiter's bookkeeping on every launch.
# Needs root (fake device node for the simulated GPU) and gcc. Usage: benches/shim.sh [PROFILE]
# SHIM_BEFORE=/path/to/an/older/libgpufence.so adds "enforce-before" and "cores-before" arms (same client, same
# rounds, interleaved) to compare two builds of the shim in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-release}
ROUNDS=${ROUNDS:-7}
PAIRS=${PAIRS:-2000000}
LAUNCHES=${LAUNCHES:-20000000}
if [ "$PROFILE" = release ]; then
  cargo build --release -q -p gpufence-shim -p gpufence-mock-cuda
fi
T=target/$PROFILE
W=$(mktemp -d /tmp/gpufence-bench-shim.XXXXXX)
trap 'rm -rf "$W"' EXIT
gcc -O2 -o "$W/client" tests/fixtures/cuda_client.c -ldl
ln -s "$PWD/$T/libgpufence_mock_cuda.so" "$W/libcuda.so.1"
mkdir -p "$W/dev" "$W/state" "$W/nostate" "$W/cores"
mknod "$W/dev/nvidia0" c 195 0
cat > "$W/node.json" <<JSON
{ "driver_version": "580.65.06", "cuda_driver_version": 12080, "dev_root": "$W",
  "gpus": [ { "uuid": "GPU-2f5d1c3a-0000-1111-2222-333344445555", "name": "NVIDIA H100 80GB HBM3",
              "memory_mib": 81559, "minor": 0, "pci_bus_id": "00000000:19:00.0", "compute_capability": [9, 0] } ] }
JSON
printf 'version=1\ndevice.0.uuid=GPU-2f5d1c3a-0000-1111-2222-333344445555\ndevice.0.memory=%s\n' $((4 << 30)) > "$W/state/quota"
cp "$W/state/quota" "$W/cores/quota"
echo 'device.0.cores=50' >> "$W/cores/quota"
export GPUFENCE_MOCK_NODE="$W/node.json" LD_LIBRARY_PATH="$W"
SHIM="$PWD/$T/libgpufence.so"
run() { # variant -> "pair_ns launch_ns"
  local out
  case $1 in
    base) out=$("$W/client" dlsym bench "$PAIRS" 4096 launch "$LAUNCHES") ;;
    enforce) out=$(GPUFENCE_STATE="$W/state" LD_PRELOAD="$SHIM" "$W/client" dlsym bench "$PAIRS" 4096 launch "$LAUNCHES") ;;
    cores) out=$(GPUFENCE_STATE="$W/cores" LD_PRELOAD="$SHIM" "$W/client" dlsym bench "$PAIRS" 4096 launch "$LAUNCHES") ;;
    pass) out=$(GPUFENCE_STATE="$W/nostate" LD_PRELOAD="$SHIM" "$W/client" dlsym bench "$PAIRS" 4096 launch "$LAUNCHES") ;;
    enforce-before) rm -f "$W/state/accounting"
      out=$(GPUFENCE_STATE="$W/state" LD_PRELOAD="$SHIM_BEFORE" "$W/client" dlsym bench "$PAIRS" 4096 launch "$LAUNCHES")
      rm -f "$W/state/accounting" ;;
    cores-before) rm -f "$W/cores/accounting"
      out=$(GPUFENCE_STATE="$W/cores" LD_PRELOAD="$SHIM_BEFORE" "$W/client" dlsym bench "$PAIRS" 4096 launch "$LAUNCHES")
      rm -f "$W/cores/accounting" ;;
  esac
  echo "$(awk '/^bench/{print $2}' <<<"$out") $(awk '/^launch/{print $2}' <<<"$out")"
}
VARIANTS="base enforce cores pass${SHIM_BEFORE:+ enforce-before cores-before}"
declare -A P L
for r in $(seq "$ROUNDS"); do
  for v in $VARIANTS; do
    read -r p l < <(run $v)
    P[$v]+="$p "; L[$v]+="$l "
  done
done
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
echo "libgpufence.so overhead ($PROFILE build, $ROUNDS interleaved rounds, medians; $(nproc) CPUs)"
printf '%-34s %14s %14s\n' variant "alloc+free ns" "launch ns"
for v in $VARIANTS; do
  printf '%-34s %14s %14s\n' "$v" "$(median "${P[$v]}")" "$(median "${L[$v]}")"
done
bp=$(median "${P[base]}"); bl=$(median "${L[base]}")
for v in ${VARIANTS#base }; do
  awk -v n="$v" -v p="$(median "${P[$v]}")" -v l="$(median "${L[$v]}")" -v bp="$bp" -v bl="$bl" \
    'BEGIN{printf "added by shim (%s): %+.1f ns/pair (x%.2f), %+.1f ns/launch (x%.2f)\n", n, p-bp, p/bp, l-bl, l/bl}'
done
echo "targets: < 100 ns/pair, < 20 ns/launch without a compute share, < 300 ns/launch with one"
