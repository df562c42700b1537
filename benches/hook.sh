#!/usr/bin/env bash
# Benchmark: what the OCI hook adds to container creation, on a simulated 4-GPU node.
#   1. podman run --rm (runc, --hooks-dir) of a container granted GPU 1 through the hook
#      (annotation gpufence.dev/devices=1, memory 4Gi) vs the same container without the
#      annotation (hook not matched) — median wall time, ratio, added milliseconds;
#   2. the hook alone on a container with no allocation (the cost every container pays where
#      the node trusts env and the drop-in matches `always`) vs /bin/true with the same stdin.
# Runs alternate between the two variants of each pair so drift affects both alike.
#
# Usage (root): benches/hook.sh [RUNS]   (default 20; env BIN_DIR, default target/release if
# built, else target/debug).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-${RUNS:-20}}
if [ -z "${BIN_DIR:-}" ]; then
  if [ -x target/release/gpufence ] && [ -f target/release/libgpufence.so ]; then BIN_DIR=target/release; else BIN_DIR=target/debug; fi
fi
BIN_DIR=$(cd "$BIN_DIR" && pwd)
[ "$(id -u)" = 0 ] || { echo "hook bench: needs root" >&2; exit 1; }
for t in podman runc busybox; do command -v $t >/dev/null || { echo "hook bench: $t missing" >&2; exit 1; }; done

S=$(mktemp -d /tmp/gfhb.XXXXXX)   # short: podman limits the runroot path to 50 characters
trap 'rm -rf "$S"' EXIT
CFG=$("$BIN_DIR/gpufence-sim" node --dir "$S/node" --gpus 4)
"$BIN_DIR/gpufence" --config "$CFG" hook install --dir "$S/hooks" >/dev/null
"$BIN_DIR/gpufence" --config "$CFG" inventory >/dev/null   # warm the inventory cache

R=$S/rootfs
mkdir -p $R/{bin,dev,proc,sys,etc,tmp,run,usr/lib}
cp "$(command -v busybox)" $R/bin/busybox
ln -s busybox $R/bin/sh; ln -s busybox $R/bin/true
PODMAN=(podman --root "$S/p/root" --runroot "$S/p/run" --storage-driver vfs --cgroup-manager cgroupfs
        --events-backend file --runtime runc --hooks-dir "$S/hooks")
RUN=(run --rm --network none --ulimit nofile=20000:20000 --ulimit nproc=4096:4096)
"${PODMAN[@]}" "${RUN[@]}" --rootfs "$R" /bin/true   # warm-up (podman database)

now() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.2f", m/1e6}'; }

: > "$S/with"; : > "$S/without"
for _ in $(seq "$RUNS"); do
  t=$(now); "${PODMAN[@]}" "${RUN[@]}" --annotation gpufence.dev/devices=1 --annotation gpufence.dev/memory=4Gi \
    --rootfs "$R" /bin/true; echo $(( $(now) - t )) >> "$S/with"
  t=$(now); "${PODMAN[@]}" "${RUN[@]}" --rootfs "$R" /bin/true; echo $(( $(now) - t )) >> "$S/without"
done
W=$(median < "$S/with"); WO=$(median < "$S/without")
echo "podman run --rm, $RUNS runs each (median ms): with hook + GPU $W, without $WO"
awk -v a="$W" -v b="$WO" 'BEGIN { printf "  ratio %.3f, added %.2f ms per container\n", a/b, a-b }'

# The hook alone, no allocation (bundle without annotations).
B=$S/bundle; mkdir -p $B
echo '{"ociVersion":"1.0.2","root":{"path":"'"$R"'"},"process":{"args":["/bin/true"]},"annotations":{}}' > $B/config.json
STATE='{"ociVersion":"1.0.2","id":"bench","status":"creating","pid":'"$$"',"bundle":"'"$B"'"}'
: > "$S/hook"; : > "$S/true"
for _ in $(seq $((RUNS * 5))); do
  t=$(now); echo "$STATE" | "$BIN_DIR/gpufence" --config "$CFG" hook prestart; echo $(( $(now) - t )) >> "$S/hook"
  t=$(now); echo "$STATE" | /bin/true; echo $(( $(now) - t )) >> "$S/true"
done
H=$(median < "$S/hook"); T=$(median < "$S/true")
echo "hook prestart without allocation, $((RUNS * 5)) runs (median ms): $H vs /bin/true $T"
awk -v a="$H" -v b="$T" 'BEGIN { printf "  ratio %.2f, added %.2f ms\n", a/b, a-b }'
