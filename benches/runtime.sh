#!/usr/bin/env bash
# Benchmark: median wall time of create+start+delete (and of create alone) of one container through
# gpufence-runtime vs plain runc, alternating runs, on a simulated 8-GPU node with one GPU allocated
# (annotation gpufence.dev/devices=1, memory 4Gi), laid out as on a containerd node:
#   * the bundle (config.json), runc's --root and gpufence's state-dir on a tmpfs, as
#     /run/containerd/io.containerd.runtime.v2.task/…, /run/runc and /run/gpufence are;
#   * the rootfs a fresh overlayfs snapshot per container (upper/work dirs on disk, as
#     /var/lib/containerd's overlayfs snapshotter makes them) of a glibc image: static busybox,
#     the host's glibc loader + libc and the host's /etc/ld.so.cache (a real-sized cache to
#     parse and rewrite, like a CUDA base image's).
# Mounting and removing the snapshot happen outside the timed region, for every arm alike. Each
# gpufence run starts from the pristine config.json, so every run pays the full plan + edit +
# host-file + ld-cache cost. A third arm runs plain runc on the spec gpufence produced, which
# splits the cost into what runc does for the enforcement (device nodes, mounts) and the
# wrapper's own work.
#
# Usage (root): benches/runtime.sh [RUNS]   (default 40; env BIN_DIR, default target/release
# if built, else target/debug; BEFORE_DIR=<dir of another build> adds a fourth arm running that
# build's gpufence-runtime in the same interleaved loop, for before/after figures; FOLDERS=1 adds
# an arm running this build with runtime.driver-layout = "folders"; FLOOR=1 adds
# two plain-runc arms pricing the floor of runc's own enforcement work, see below; KEEP=1 keeps
# the scratch directory mounted). Prints medians with
# interquartile ranges, the ratio, the added milliseconds (create+start+delete, and create
# alone), and the gpufence create by phase (GPUFENCE_PHASES lines: process start, config,
# bundle, log set-up, inventory, plan, decision log line, spec edit, ld cache, host files,
# config.json write, exec + runc create, CPU time).
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
  [ -e "$BIN_DIR/$f" ] || { echo "runtime bench: $BIN_DIR/$f missing (make build)" >&2; exit 1; }
done

S=$(mktemp -d /tmp/gpufence-bench-runtime.XXXXXX)
RUN=$S/run # the node's /run
mkdir -p "$RUN"
mount -t tmpfs -o size=256m,mode=0755 tmpfs "$RUN"
ROOT_GF=$RUN/runc-gf ROOT_RUNC=$RUN/runc-plain STATE=$RUN/gpufence
B=$RUN/bundle
cleanup() {
  for r in "$ROOT_GF" "$ROOT_RUNC"; do
    for id in $("$RUNC" --root "$r" list -q 2>/dev/null); do "$RUNC" --root "$r" delete --force "$id" >/dev/null 2>&1 || true; done
  done
  umount "$B/rootfs" 2>/dev/null || true
  umount "$RUN" 2>/dev/null || true
  rm -rf "$S"
}
if [ -z "${KEEP:-}" ]; then trap cleanup EXIT; fi

# Simulated 8-GPU node, gpufence config pointing at it (state-dir on the tmpfs), inventory cache.
CFG=$(python3 benches/node_config.py "$S" "$BIN_DIR" "$RUNC" "$STATE")
export GPUFENCE_CONFIG=$CFG
if [ -n "${FOLDERS:-}" ]; then
  # The same node with runtime.driver-layout = "folders" (prepared folders beside the node, on
  # the driver's filesystem), for a fifth arm.
  CFG_FOLDERS=$S/gpufence-folders.toml
  sed "s|^\[runtime\]\$|[runtime]\ndriver-layout = \"folders\"\ndriver-folders = \"$S/driver-folders\"|" "$CFG" >"$CFG_FOLDERS"
  grep -q 'driver-layout = "folders"' "$CFG_FOLDERS" || { echo "runtime bench: no [runtime] table in $CFG" >&2; exit 1; }
fi

# The image (overlay lower layer): static busybox running /bin/true, plus what makes it a glibc
# image to the ld cache step: the loader, libc and a real-sized cache.
IMG=$S/image
mkdir -p "$IMG/bin" "$IMG/etc/ld.so.conf.d" "$IMG/dev" "$IMG/proc" "$IMG/sys" "$IMG/run" "$IMG/tmp" \
  "$IMG/lib64" "$IMG/lib/x86_64-linux-gnu" "$IMG/usr/lib/x86_64-linux-gnu"
cp /bin/busybox "$IMG/bin/"
for c in sh true; do ln -sf busybox "$IMG/bin/$c"; done
cp -L /lib64/ld-linux-x86-64.so.2 "$IMG/lib64/"
cp -L /lib/x86_64-linux-gnu/libc.so.6 "$IMG/lib/x86_64-linux-gnu/"
cp /etc/ld.so.cache "$IMG/etc/ld.so.cache"
printf 'include /etc/ld.so.conf.d/*.conf\n' >"$IMG/etc/ld.so.conf"
mkdir -p "$B/rootfs"
snapshot() { # a fresh overlay rootfs for container $1 (untimed)
  mkdir -p "$S/snap/$1/upper" "$S/snap/$1/work"
  mount -t overlay overlay -o "lowerdir=$IMG,upperdir=$S/snap/$1/upper,workdir=$S/snap/$1/work" "$B/rootfs"
}
unsnapshot() { umount "$B/rootfs"; rm -rf "$S/snap/$1"; }

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

one() { # $1 = runtime binary, $2 = state root, $3 = id, $4 = config.json to start from; prints "id t0 t_created t_deleted" (seconds)
  local t0 t1 t2
  cp "$4" "$B/config.json"
  snapshot "$3"
  t0=$EPOCHREALTIME
  "$1" --root "$2" create --bundle "$B" "$3" </dev/null >/dev/null 2>"$S/err" || { cat "$S/err" >&2; return 1; }
  t1=$EPOCHREALTIME
  "$1" --root "$2" start "$3" >/dev/null 2>>"$S/err" || { cat "$S/err" >&2; return 1; }
  "$1" --root "$2" delete --force "$3" >/dev/null 2>>"$S/err" || { cat "$S/err" >&2; return 1; }
  t2=$EPOCHREALTIME
  unsnapshot "$3"
  echo "$3 $t0 $t1 $t2"
}

# Warm-up (page cache, binaries).
one "$BIN_DIR/gpufence-runtime" "$ROOT_GF" warm-gf "$S/config.pristine.json" >/dev/null
# What gpufence-runtime makes of the bundle, with its state directory kept, for the third arm.
cp "$S/config.pristine.json" "$B/config.json"
snapshot edited-src
"$BIN_DIR/gpufence-runtime" --root "$ROOT_GF" create --bundle "$B" edited-src </dev/null >/dev/null
cp "$B/config.json" "$S/config.edited.json"
cp -a "$STATE/edited-src" "$S/state-edited-src"
"$BIN_DIR/gpufence-runtime" --root "$ROOT_GF" delete --force edited-src
unsnapshot edited-src
mv "$S/state-edited-src" "$STATE/edited-src"
one "$RUNC" "$ROOT_RUNC" warm-runc "$S/config.pristine.json" >/dev/null
if [ -n "${FOLDERS:-}" ]; then
  GPUFENCE_CONFIG=$CFG_FOLDERS one "$BIN_DIR/gpufence-runtime" "$ROOT_GF" warm-folders "$S/config.pristine.json" >/dev/null
fi
if [ -n "${FLOOR:-}" ]; then
  # Two more specs for plain runc, to price the floor any enforcement pays inside runc:
  # floor-dev: the pristine spec plus only gpufence's device nodes and cgroup device rules;
  # floor-dir: gpufence's spec with every driver folder served by ONE read-only directory bind
  # (hard links of exactly the granted files; libraries at /usr/local/nvidia/lib64, binaries at
  # /usr/local/nvidia/bin, firmware at its own folder; the simulator's mock files left out) —
  # the fewest mounts a GPU container with gpufence's shim and quota can have.
  python3 - "$S" "$S/node/driver" <<'PY'
import json, os, sys, copy
s, driver = sys.argv[1], sys.argv[2]
pristine = json.load(open(f"{s}/config.pristine.json"))
edited = json.load(open(f"{s}/config.edited.json"))
dev = copy.deepcopy(pristine)
dev["linux"]["devices"] = edited["linux"].get("devices", [])
dev["linux"]["resources"]["devices"] = edited["linux"]["resources"]["devices"]
json.dump(dev, open(f"{s}/config.floor-dev.json", "w"))
mounts, groups = [], {}
for m in edited["mounts"]:
    src = m.get("source", "")
    if m.get("type") == "bind" or "bind" in m.get("options", []):
        if src.startswith(driver + "/"):
            if not os.path.basename(src).startswith("gpufence-mock"):
                groups.setdefault(os.path.dirname(m["destination"]), []).append(m)
            continue
    mounts.append(m)
where = {"/usr/lib/x86_64-linux-gnu": "/usr/local/nvidia/lib64", "/usr/bin": "/usr/local/nvidia/bin"}
for n, (folder, ms) in enumerate(sorted(groups.items())):
    d = f"{s}/floor/{n}"
    os.makedirs(d)
    for m in ms:
        os.link(m["source"], f"{d}/{os.path.basename(m['destination'])}")
    mounts.append({"destination": where.get(folder, folder), "type": "bind", "source": d,
                   "options": ["ro", "nosuid", "nodev", "bind"]})
dirs = copy.deepcopy(edited)
dirs["mounts"] = mounts
json.dump(dirs, open(f"{s}/config.floor-dir.json", "w"))
print(f"runtime bench: floor-dir serves {sum(map(len, groups.values()))} driver files by {len(groups)} directory binds; "
      f"{len(edited['mounts']) - len(pristine['mounts'])} mounts added by gpufence, {len(mounts) - len(pristine['mounts'])} in floor-dir", file=sys.stderr)
PY
  one "$RUNC" "$ROOT_RUNC" warm-floor "$S/config.floor-dir.json" >/dev/null
fi

: >"$S/gf.txt"; : >"$S/runc.txt"; : >"$S/edited.txt"; : >"$S/before.txt"; : >"$S/floor-dev.txt"; : >"$S/floor-dir.txt"; : >"$S/folders.txt"
if [ -n "${BEFORE_DIR:-}" ]; then
  BEFORE_DIR=$(cd "$BEFORE_DIR" && pwd)
  one "$BEFORE_DIR/gpufence-runtime" "$ROOT_GF" warm-before "$S/config.pristine.json" >/dev/null
fi
# One line per timed gpufence create (GPUFENCE_PHASES, src/runtime/phases.rs: only a path inside
# state-dir is accepted); a binary without it writes none and the phase table is skipped.
PHASES=$STATE/phases.txt; : >"$PHASES"
for i in $(seq 1 "$RUNS"); do
  one "$RUNC" "$ROOT_RUNC" "runc-$i" "$S/config.pristine.json" >>"$S/runc.txt"
  GPUFENCE_PHASES=$PHASES one "$BIN_DIR/gpufence-runtime" "$ROOT_GF" "gf-$i" "$S/config.pristine.json" >>"$S/gf.txt"
  # Third arm: plain runc on the spec gpufence-runtime produced (devices, mounts).
  one "$RUNC" "$ROOT_RUNC" "edited-$i" "$S/config.edited.json" >>"$S/edited.txt"
  if [ -n "${BEFORE_DIR:-}" ]; then
    one "$BEFORE_DIR/gpufence-runtime" "$ROOT_GF" "before-$i" "$S/config.pristine.json" >>"$S/before.txt"
  fi
  if [ -n "${FOLDERS:-}" ]; then
    GPUFENCE_CONFIG=$CFG_FOLDERS GPUFENCE_PHASES=$STATE/phases-folders.txt one "$BIN_DIR/gpufence-runtime" "$ROOT_GF" "folders-$i" "$S/config.pristine.json" >>"$S/folders.txt"
  fi
  if [ -n "${FLOOR:-}" ]; then
    one "$RUNC" "$ROOT_RUNC" "floor-dev-$i" "$S/config.floor-dev.json" >>"$S/floor-dev.txt"
    one "$RUNC" "$ROOT_RUNC" "floor-dir-$i" "$S/config.floor-dir.json" >>"$S/floor-dir.txt"
  fi
done
# Pass-through: every other runc call an engine makes (start, state, kill, delete, list) goes
# through the wrapper too, which only reads its configuration and execs runc. Timed on `list`,
# interleaved with plain runc, 5 × RUNS calls each.
: >"$S/pass.txt"
for i in $(seq 1 $((5 * RUNS))); do
  t0=$EPOCHREALTIME; "$RUNC" --root "$ROOT_RUNC" list >/dev/null; t1=$EPOCHREALTIME
  "$BIN_DIR/gpufence-runtime" --root "$ROOT_RUNC" list >/dev/null; t2=$EPOCHREALTIME
  if [ -n "${BEFORE_DIR:-}" ]; then "$BEFORE_DIR/gpufence-runtime" --root "$ROOT_RUNC" list >/dev/null; fi
  t3=$EPOCHREALTIME
  echo "$t0 $t1 $t2 $t3" >>"$S/pass.txt"
done

cp "$S/config.pristine.json" "$B/config.json"
snapshot gf-last
"$BIN_DIR/gpufence-runtime" --root "$ROOT_GF" create --bundle "$B" gf-last </dev/null >/dev/null
# The edit really happened: config.json names the GPU and the image's ld cache the driver.
grep -q '"/dev/nvidia1"' "$B/config.json" || { echo "runtime bench: gpufence did not edit config.json" >&2; exit 1; }
grep -q 'libcuda.so.1' "$B/rootfs/etc/ld.so.cache" || { echo "runtime bench: gpufence did not write the ld cache" >&2; exit 1; }
"$BIN_DIR/gpufence-runtime" --root "$ROOT_GF" delete --force gf-last
unsnapshot gf-last
[ ! -e "$STATE/gf-last" ] || { echo "runtime bench: state dir not removed on delete" >&2; exit 1; }

python3 - "$S" "$RUNS" "$BIN_DIR" "${BEFORE_DIR:-}" "${FLOOR:-}" "${FOLDERS:-}" <<'EOF'
import sys, statistics as st
s, runs, bindir, beforedir, floor, folders = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
def load(name):
    rows = {}
    for l in open(f"{s}/{name}.txt"):
        i, t0, t1, t2 = l.split()
        rows[i] = (float(t0), float(t1), float(t2))
    return rows
med = st.median
def spread(xs):
    q = st.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"IQR {q[0]:.2f}-{q[2]:.2f}"
runc, gf, ed = load("runc"), load("gf"), load("edited")
ms = lambda rows, f: [f(v) * 1000 for v in rows.values()]
total = lambda v: v[2] - v[0]
create = lambda v: v[1] - v[0]
print(f"runtime bench: {runs} interleaved runs per arm, 8-GPU simulated node, 1 GPU allocated; bundle and state on tmpfs, fresh overlay rootfs of a glibc image ({bindir})")
print("  create+start+delete, median ms (interquartile range):")
for name, rows in (("plain runc", runc), ("gpufence-runtime", gf), ("runc on gpufence's spec", ed)):
    xs = ms(rows, total)
    print(f"    {name:26s} {med(xs):7.2f}  ({spread(xs)})")
r, g, e = med(ms(runc, total)), med(ms(gf, total)), med(ms(ed, total))
print(f"    ratio {g / r:.3f}, added {g - r:.2f} ms (aim: ratio <= 1.10); enforcement inside runc (devices, mounts) {e - r:.2f} ms, the wrapper itself {g - e:.2f} ms")
# Per-run pairing (runc-i and gf-i run back to back) holds up better under load than two medians.
pairs = [(total(gf[f"gf-{i}"]) - total(runc[f"runc-{i}"])) * 1000 for i in range(1, runs + 1)]
print(f"    paired difference gf-i - runc-i: median {med(pairs):.2f} ms ({spread(pairs)})")
if beforedir:
    bf = load("before")
    xs = ms(bf, total)
    pb = [(total(bf[f"before-{i}"]) - total(runc[f"runc-{i}"])) * 1000 for i in range(1, runs + 1)]
    print(f"    {'gpufence-runtime (before)':26s} {med(xs):7.2f}  ({spread(xs)})  ratio {med(xs) / r:.3f}, paired +{med(pb):.2f} ms  [{beforedir}]")
print("  create alone, median ms (interquartile range):")
cr, cg, ce = ms(runc, create), ms(gf, create), ms(ed, create)
for name, xs in (("plain runc create", cr), ("gpufence-runtime create", cg), ("runc create, gpufence's spec", ce)):
    print(f"    {name:29s} {med(xs):7.2f}  ({spread(xs)})")
pc = [(create(gf[f"gf-{i}"]) - create(runc[f"runc-{i}"])) * 1000 for i in range(1, runs + 1)]
print(f"    added {med(cg) - med(cr):.2f} ms (paired median {med(pc):.2f} ms, {spread(pc)}; aim <= +5 ms)")
if beforedir:
    cb = ms(bf, create)
    pcb = [(create(bf[f"before-{i}"]) - create(runc[f"runc-{i}"])) * 1000 for i in range(1, runs + 1)]
    print(f"    {'gpufence-runtime create (before)':29s} {med(cb):7.2f}  ({spread(cb)}), added {med(cb) - med(cr):.2f} ms (paired median {med(pcb):.2f} ms, {spread(pcb)})")
if folders:
    fo = load("folders")
    xc, xt = ms(fo, create), ms(fo, total)
    pf = [(create(fo[f"folders-{i}"]) - create(runc[f"runc-{i}"])) * 1000 for i in range(1, runs + 1)]
    pt = [(total(fo[f"folders-{i}"]) - total(runc[f"runc-{i}"])) * 1000 for i in range(1, runs + 1)]
    print(f"  gpufence-runtime, runtime.driver-layout = \"folders\": create {med(xc):.2f} ({spread(xc)}), added {med(xc) - med(cr):.2f} ms (paired {med(pf):.2f}); "
          f"create+start+delete {med(xt):.2f}, ratio {med(xt) / r:.3f} (paired +{med(pt):.2f} ms)")
if floor:
    print("  the floor: plain runc on reduced specs (no wrapper), create alone and create+start+delete, median ms, added over plain runc:")
    for name, label in (("floor-dev", "devices and cgroup rules only"), ("floor-dir", "gpufence's spec, driver folders as directory binds")):
        fl = load(name)
        xc, xt = ms(fl, create), ms(fl, total)
        pf = [(create(fl[f"{name}-{i}"]) - create(runc[f"runc-{i}"])) * 1000 for i in range(1, runs + 1)]
        print(f"    {label:52s} create {med(xc):6.2f} (+{med(xc) - med(cr):.2f}, paired +{med(pf):.2f}; {spread(xc)})  c+s+d ratio {med(xt) / r:.3f}")
rows = [[float(x) for x in l.split()] for l in open(f"{s}/pass.txt")]
pr = [(b - a) * 1000 for a, b, c, d in rows]
pg = [(c - b) * 1000 for a, b, c, d in rows]
print(f"  pass-through call (`list`), median ms (interquartile range), {len(rows)} interleaved calls each:")
print(f"    {'plain runc':26s} {med(pr):7.3f}  ({spread(pr)})")
print(f"    {'gpufence-runtime':26s} {med(pg):7.3f}  ({spread(pg)}), paired +{med([g - r for g, r in zip(pg, pr)]):.3f} ms")
if beforedir:
    pb = [(d - c) * 1000 for a, b, c, d in rows]
    print(f"    {'gpufence-runtime (before)':26s} {med(pb):7.3f}  ({spread(pb)}), paired +{med([x - r for x, r in zip(pb, pr)]):.3f} ms")
# The gpufence create by phase (GPUFENCE_PHASES lines, src/runtime/phases.rs).
def phases(file, runs_of, title):
    ph = {}
    try:
        for l in open(file):
            f = dict(w.split("=", 1) for w in l.split()[1:])
            ph[f["id"]] = f
    except FileNotFoundError:
        pass
    cols = {}
    for i, v in runs_of.items():
        f = ph.get(i)
        if f is None:
            continue
        row = {"process start": int(f["main_at"]) / 1000 - v[0] * 1000}
        row.update({k: int(x) / 1000 for k, x in f.items() if k not in ("id", "main_at", "exec_at", "cpu")})
        row["exec + runc create"] = v[1] * 1000 - int(f["exec_at"]) / 1000
        row["wrapper CPU (user+sys)"] = int(f["cpu"]) / 1000
        for k, x in row.items():
            cols.setdefault(k, []).append(x)
    if not cols:
        return print(f"  ({title}: no GPUFENCE_PHASES lines: binary without phase timing)")
    print(f"  {title} by phase, median ms (interquartile range), {len(cols['process start'])} runs:")
    for k, xs in cols.items():
        print(f"    {k:24s} {med(xs):7.3f}  ({spread(xs)})")
phases(f"{s}/run/gpufence/phases.txt", gf, "gpufence create")
if folders:
    phases(f"{s}/run/gpufence/phases-folders.txt", load("folders"), 'gpufence create, driver-layout = "folders"')
EOF
