#!/usr/bin/env bash
# Create-path cost of quota.backend = driver against shim: `gpufence-runtime run` + `delete` of a
# /bin/true container granted GPU 1 with a 4 GiB quota, on a simulated 2-GPU node whose driver has
# NVML memory limits, alternating the two backends RUNS times each (the driver arm adds the
# createRuntime hook `gpufence hook memory-limits`, run by runc, and its NVML calls).
# Usage (root): benches/backend.sh [RUNS]   (default 30; env BIN_DIR, default target/release or
# target/debug, whichever has the binaries)
set -euo pipefail
RUNS=${1:-30}
if [ -z "${BIN_DIR:-}" ]; then
  if [ -x target/release/gpufence-runtime ] && [ -x target/release/gpufence-mock-mps-control ]; then BIN_DIR=target/release; else BIN_DIR=target/debug; fi
fi
B=$(cd "$BIN_DIR" && pwd)
S=$(mktemp -d /tmp/gpufence-bench-backend.XXXXXX)
trap 'rm -rf "$S"' EXIT
CFG=$("$B/gpufence-sim" node --dir "$S/node" --gpus 2)
mkdir -p "$S/ml"
python3 - "$CFG" "$S" <<'PY'
import json, sys
cfg, s = sys.argv[1:]
for f in [s + "/node/node.json", s + "/node/driver/usr/lib/x86_64-linux-gnu/gpufence-mock-node.json"]:
    d = json.load(open(f)); d["memory_limits_dir"] = s + "/ml"; json.dump(d, open(f, "w"))
t = open(cfg).read()
for be in ["shim", "driver"]:
    open(f"{s}/{be}.toml", "w").write(
        t.replace("[shim]", f'[quota]\nbackend = "{be}"\n\n[shim]', 1)
         .replace(f'state-dir = "{s}/node/state"', f'state-dir = "{s}/state-{be}"'))
PY
for be in shim driver; do GPUFENCE_CONFIG=$S/$be.toml "$B/gpufence" inventory >/dev/null; done
mkdir -p "$S/b/rootfs/bin" && cp /bin/busybox "$S/b/rootfs/bin/" && ln -sf busybox "$S/b/rootfs/bin/true"
(cd "$S/b" && runc spec && python3 - <<'PY'
import json
d = json.load(open("config.json")); d["process"]["terminal"] = False; d["process"]["args"] = ["/bin/true"]
d["annotations"] = {"gpufence.dev/devices": "1", "gpufence.dev/memory": "4Gi"}
json.dump(d, open("config.json.orig", "w"))
PY
)
for i in $(seq "$RUNS"); do
  for be in shim driver; do
    cp "$S/b/config.json.orig" "$S/b/config.json"
    t0=$(date +%s%N)
    GPUFENCE_CONFIG=$S/$be.toml "$B/gpufence-runtime" --root "$S/root" run --bundle "$S/b" "c-$be-$i" >/dev/null
    GPUFENCE_CONFIG=$S/$be.toml "$B/gpufence-runtime" --root "$S/root" delete "c-$be-$i" 2>/dev/null || true
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000)) >> "$S/t-$be"
  done
done
set_count=$(grep -c "driver memory limit set" "$S/node/gpufence.log" || true)
left=$(find "$S/ml" -name 'limit.*' | wc -l)
for be in shim driver; do
  sort -n "$S/t-$be" | awk -v be="$be" '{a[NR]=$1} END{printf "backend %-6s median %.1f ms (n=%d)\n", be, a[int((NR+1)/2)]/1000, NR}'
done
echo "driver limits set: $set_count, left after delete: $left"
