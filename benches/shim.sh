#!/usr/bin/env bash
# Added cost of libgpufence.so per cuMemAlloc_v2 + cuMemFree_v2 pair, per cuMemAllocAsync +
# cuMemFreeAsync pair, per cuStreamSynchronize and per cuLaunchKernel,
# against the unshimmed mock driver, in one run: the same client binary (dlopen + dlsym, like
# libcudart) runs interleaved without the shim, with the shim and a memory quota (enforcing),
# with a memory quota and a compute share (cores: every launch paced, one in 128 timed with an
# event pair), and with the shim but no quota (pass-through); ROUNDS rounds, medians reported.
# The launched kernel takes no device time, so pacing never sleeps: what is measured is the
# limiter's bookkeeping on every launch. Then, with valgrind present (CALLGRIND=0 skips it), the
# instructions one alloc+free pair, one async pair and one synchronization cost with and without
# the shim, counted by callgrind: a figure the machine's load does not move.
# Needs root (fake device node for the simulated GPU) and gcc. Usage: benches/shim.sh [PROFILE]
# SHIM_BEFORE=/path/to/an/older/libgpufence.so adds "enforce-before" and "cores-before" arms (same client, same
# rounds, interleaved) to compare two builds of the shim in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-release}
ROUNDS=${ROUNDS:-7}
PAIRS=${PAIRS:-2000000}
LAUNCHES=${LAUNCHES:-20000000}
SYNCS=${SYNCS:-2000000}
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
# the client's script: sync alloc+free pairs, stream-ordered alloc+free pairs (the shim asks the
# driver for the current pool on each), stream synchronizations (hooked: pools release there),
# kernel launches
SCRIPT="bench $PAIRS 4096 benchasync $PAIRS 4096 benchsync $SYNCS launch $LAUNCHES"
env_of() { # variant -> the environment it runs the client in
  case $1 in
    base) echo "GPUFENCE_X=" ;;
    enforce) echo "GPUFENCE_STATE=$W/state LD_PRELOAD=$SHIM" ;;
    cores) echo "GPUFENCE_STATE=$W/cores LD_PRELOAD=$SHIM" ;;
    pass) echo "GPUFENCE_STATE=$W/nostate LD_PRELOAD=$SHIM" ;;
    enforce-before) echo "GPUFENCE_STATE=$W/state LD_PRELOAD=$SHIM_BEFORE" ;;
    cores-before) echo "GPUFENCE_STATE=$W/cores LD_PRELOAD=$SHIM_BEFORE" ;;
  esac
}
run() { # variant -> "pair_ns async_ns sync_ns launch_ns"
  local out
  rm -f "$W"/state/accounting "$W"/cores/accounting
  # shellcheck disable=SC2046,SC2086
  out=$(env $(env_of "$1") "$W/client" dlsym $SCRIPT)
  awk '/^bench /{p=$2} /^benchasync/{a=$2} /^benchsync/{s=$2} /^launch/{l=$2} END{print p, a, s, l}' <<<"$out"
}
VARIANTS="base enforce cores pass${SHIM_BEFORE:+ enforce-before cores-before}"
declare -A P A S L
for r in $(seq "$ROUNDS"); do
  for v in $VARIANTS; do
    read -r p a s l < <(run $v)
    P[$v]+="$p "; A[$v]+="$a "; S[$v]+="$s "; L[$v]+="$l "
  done
done
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
echo "libgpufence.so overhead ($PROFILE build, $ROUNDS interleaved rounds, medians of thread CPU ns; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%-16s %14s %14s %14s %12s\n' variant "alloc+free ns" "async pair ns" "stream sync ns" "launch ns"
for v in $VARIANTS; do
  printf '%-16s %14s %14s %14s %12s\n' "$v" "$(median "${P[$v]}")" "$(median "${A[$v]}")" "$(median "${S[$v]}")" "$(median "${L[$v]}")"
done
for v in ${VARIANTS#base }; do
  echo "$(median "${P[base]}") $(median "${P[$v]}") $(median "${A[base]}") $(median "${A[$v]}")" \
    "$(median "${S[base]}") $(median "${S[$v]}") $(median "${L[base]}") $(median "${L[$v]}")" | awk -v n="$v" '{printf "added by shim (%s): %+.1f ns/pair (x%.2f), %+.1f ns/async pair (x%.2f), %+.1f ns/sync (x%.2f), %+.1f ns/launch (x%.2f)\n", n, $2-$1, $2/$1, $4-$3, $4/$3, $6-$5, $6/$5, $8-$7, $8/$7}'
done
# Instructions per call under callgrind (independent of the machine's load): each call type run
# N and 2N times, base and enforcing; (Ir(2N) - Ir(N)) / N is one call's count.
if [ "${CALLGRIND:-1}" = 1 ] && command -v valgrind >/dev/null; then
  N=${CALLGRIND_CALLS:-20000}
  ir() { # variant, command words -> total instructions
    local f="$W/cg.out"
    # shellcheck disable=SC2046
    env $(env_of "$1") valgrind --tool=callgrind --callgrind-out-file="$f" "$W/client" dlsym "${@:2}" >/dev/null 2>&1
    awk '/^(summary|totals):/{print $2; exit}' "$f"
  }
  CG="base enforce${SHIM_BEFORE:+ enforce-before}"
  echo "instructions per call (callgrind, $N and $((2 * N)) calls, difference / $N; added: over base)"
  printf '%-32s' call; for v in $CG; do printf ' %15s' "$v"; done; echo
  for c in "bench:cuMemAlloc_v2+cuMemFree_v2" "benchasync:cuMemAllocAsync+cuMemFreeAsync" "benchsync:cuStreamSynchronize"; do
    cmd=${c%%:*}
    extra=4096; [ "$cmd" = benchsync ] && extra=
    printf '%-32s' "${c#*:}"
    for v in $CG; do
      rm -f "$W"/state/accounting
      # shellcheck disable=SC2086
      one=$(ir $v $cmd "$N" $extra); two=$(ir $v $cmd $((2 * N)) $extra)
      per=$(( (two - one) / N ))
      if [ "$v" = base ]; then b=$per; printf ' %15s' "$per"; else printf ' %15s' "$per ($(printf %+d $((per - b))))"; fi
    done
    echo
  done
fi
echo "targets: < 100 ns/pair, < 20 ns/launch without a compute share, < 300 ns/launch with one"
