#!/usr/bin/env bash
# Benchmark: median wall time of create+start+delete of one container through gpufence-runtime
# vs plain runc, on the same bundle, alternating runs, on a simulated 8-GPU node with one GPU
# allocated (annotation gpufence.dev/devices=1, memory 4Gi). Each gpufence run starts from the
# pristine config.json (restored outside the timed region), so every run pays the full
# plan + edit + host-file cost, and runc then sets up the extra devices and mounts (the wrapper refreshes the ld cache itself before exec; a createContainer hook
# remains only for user-namespaced containers).
#
# Usage (root): benches/runtime.sh [RUNS]   (default 40; env BIN_DIR, default target/release
# if built, else target/debug). Prints the medians, the ratio and the added milliseconds.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-${RUNS:-40}}
if [ -z "${BIN_DIR:-}" ]; then
  if [ -x target/release/gpufence-runtime ] && [ -f target/release/libgpufence.so ]; then BIN_DIR=target/release; else BIN_DIR=target/debug; fi
fi
BIN_DIR=$(cd "$BIN_DIR" && pwd)
[ "$(id -u)" = 0 ] || { echo "runtime bench: needs root" >&2; exit 1; }
RUNC=$(command -v runc) || { echo "runtime bench: runc not found" >&2; exit 1; }
for f in gpufence gpufence-runtime gpufence-sim libgpufence.so; do
  [ -e "$BIN_DIR/$f" ] || { echo "runtime bench: $BIN_DIR/$f missing (cargo build --release --workspace)" >&2; exit 1; }
done

S=$(mktemp -d /tmp/gpufence-bench-runtime.XXXXXX)
ROOT_GF=$S/root-gf ROOT_RUNC=$S/root-runc
cleanup() {
  for r in "$ROOT_GF" "$ROOT_RUNC"; do
    for id in $("$RUNC" --root "$r" list -q 2>/dev/null); do "$RUNC" --root "$r" delete --force "$id" >/dev/null 2>&1 || true; done
  done
  rm -rf "$S"
}
trap cleanup EXIT

# Simulated 8-GPU node, gpufence config pointing at it, inventory cache.
mkdir -p "$S/node"
SIM_CFG=$("$BIN_DIR/gpufence-sim" node --dir "$S/node" --gpus 8)
CFG=$S/gpufence.toml
python3 - "$SIM_CFG" "$CFG" "$S" "$BIN_DIR" "$RUNC" <<'EOF'
import sys, re
sim, out, s, bindir, runc = sys.argv[1:]
text = open(sim).read()
# Drop the keys we set (top-level and the [runtime]/[shim]/[log] tables are rewritten below).
lines, skip = [], False
for l in text.splitlines():
    m = re.match(r'\s*\[([^\]]+)\]', l)
    if m:
        skip = m.group(1).strip() in ("runtime", "shim", "log")
        if skip:
            continue
    if skip or re.match(r'\s*(state-dir|gpufence-binary)\s*=', l):
        continue
    lines.append(l)
top, rest = [], []
seen_table = False
for l in lines:
    if re.match(r'\s*\[', l):
        seen_table = True
    (rest if seen_table else top).append(l)
top += [f'state-dir = "{s}/state"', f'gpufence-binary = "{bindir}/gpufence"']
rest += ["[runtime]", f'path = "{runc}"', "[shim]", f'library = "{bindir}/libgpufence.so"',
         "[log]", f'file = "{s}/gpufence.log"', 'level = "info"']
open(out, "w").write("\n".join(top + rest) + "\n")
EOF
export GPUFENCE_CONFIG=$CFG
"$BIN_DIR/gpufence" inventory >/dev/null

# Bundle: static busybox running /bin/true, one GPU allocated.
B=$S/bundle
mkdir -p "$B/rootfs/bin" "$B/rootfs/etc" "$B/rootfs/dev" "$B/rootfs/proc" "$B/rootfs/sys" "$B/rootfs/run" "$B/rootfs/tmp"
cp /bin/busybox "$B/rootfs/bin/"
for c in sh true; do ln -sf busybox "$B/rootfs/bin/$c"; done
(cd "$B" && "$RUNC" spec)
python3 - "$B" <<'EOF'
import json, sys
b = sys.argv[1]
p = b + "/config.json"
s = json.load(open(p))
s["process"]["terminal"] = False
s["process"]["args"] = ["/bin/true"]
s["root"] = {"path": b + "/rootfs", "readonly": False}
s["annotations"] = {"gpufence.dev/devices": "1", "gpufence.dev/memory": "4Gi"}
json.dump(s, open(p, "w"), indent=1)
EOF
cp "$B/config.json" "$S/config.pristine.json"

one() { # $1 = runtime binary, $2 = state root, $3 = id; prints elapsed seconds
  local t0 t1
  t0=$EPOCHREALTIME
  "$1" --root "$2" create --bundle "$B" "$3" </dev/null >/dev/null 2>"$S/err" || { cat "$S/err" >&2; return 1; }
  "$1" --root "$2" start "$3" >/dev/null 2>>"$S/err" || { cat "$S/err" >&2; return 1; }
  "$1" --root "$2" delete --force "$3" >/dev/null 2>>"$S/err" || { cat "$S/err" >&2; return 1; }
  t1=$EPOCHREALTIME
  echo "$t0 $t1" | awk '{printf "%.6f\n", $2 - $1}'
}

# Warm-up (page cache, binaries).
cp "$S/config.pristine.json" "$B/config.json"; one "$BIN_DIR/gpufence-runtime" "$ROOT_GF" warm-gf >/dev/null
# What gpufence-runtime makes of the bundle, with its state directory kept, for the breakdown arm.
cp "$S/config.pristine.json" "$B/config.json"
"$BIN_DIR/gpufence-runtime" --root "$ROOT_GF" create --bundle "$B" edited-src </dev/null >/dev/null
cp "$B/config.json" "$S/config.edited.json"
cp -a "$S/state/edited-src" "$S/state-edited-src"
"$BIN_DIR/gpufence-runtime" --root "$ROOT_GF" delete --force edited-src
mv "$S/state-edited-src" "$S/state/edited-src"
cp "$S/config.pristine.json" "$B/config.json"; one "$RUNC" "$ROOT_RUNC" warm-runc >/dev/null

: >"$S/gf.txt"; : >"$S/runc.txt"; : >"$S/edited.txt"
for i in $(seq 1 "$RUNS"); do
  cp "$S/config.pristine.json" "$B/config.json"
  one "$RUNC" "$ROOT_RUNC" "runc-$i" >>"$S/runc.txt"
  cp "$S/config.pristine.json" "$B/config.json"
  one "$BIN_DIR/gpufence-runtime" "$ROOT_GF" "gf-$i" >>"$S/gf.txt"
  # Breakdown: plain runc on the spec gpufence-runtime produced (devices, mounts).
  cp "$S/config.edited.json" "$B/config.json"
  one "$RUNC" "$ROOT_RUNC" "edited-$i" >>"$S/edited.txt"
done
cp "$S/config.pristine.json" "$B/config.json"
one "$BIN_DIR/gpufence-runtime" "$ROOT_GF" "gf-last" >/dev/null
# The edit really happened: the last gpufence run's config.json names the GPU.
grep -q '"/dev/nvidia1"' "$B/config.json" || { echo "runtime bench: gpufence did not edit config.json" >&2; exit 1; }
[ ! -e "$S/state/gf-last" ] || { echo "runtime bench: state dir not removed on delete" >&2; exit 1; }

median() { sort -g "$1" | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.6f\n", (a[NR/2]+a[NR/2+1])/2}'; }
M_RUNC=$(median "$S/runc.txt"); M_GF=$(median "$S/gf.txt"); M_ED=$(median "$S/edited.txt")
awk -v r="$M_RUNC" -v g="$M_GF" -v e="$M_ED" -v n="$RUNS" -v bin="$BIN_DIR" 'BEGIN {
  printf "runtime bench: create+start+delete, %d alternating runs each, 8-GPU simulated node, 1 GPU allocated (%s)\n", n, bin
  printf "  plain runc        median %.2f ms\n", r * 1000
  printf "  gpufence-runtime  median %.2f ms\n", g * 1000
  printf "  ratio %.3f, added %.2f ms (aim: ratio <= 1.15)\n", g / r, (g - r) * 1000
  printf "  breakdown: runc on the edited spec median %.2f ms -> enforcement inside runc (devices, mounts) %.2f ms, gpufence-runtime itself incl. ld cache refresh %.2f ms\n", e * 1000, (e - r) * 1000, (g - e) * 1000
}'
