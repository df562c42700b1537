#!/usr/bin/env bash
# The prepared proof on a real GPU (docs/frameworks.md, "On a real GPU: the prepared proof"): one
# command on a machine lent for minutes, with no network and no Rust, that shows what gpufence does
# with NVIDIA's real driver, and a rehearsal of the very same steps over the simulated node here.
#
#   scripts/gpu-proof.sh prepare     on the build machine: the bundle, ./gpu-proof (release gpufence,
#                                    gpufence-runtime + its wrapper, libgpufence.so, a static runc,
#                                    the C CUDA client), to carry to the GPU machine; prints its size
#   scripts/gpu-proof.sh [run]       on the GPU machine, from the repository root: every check below,
#                                    each under `timeout`, within BUDGET seconds all together; one
#                                    `PASS|FAIL|SKIP name: reason` line per check in $OUT/summary.txt,
#                                    the logs beside it (8 files); exit 1 when a check failed
#   SIM=1 scripts/gpu-proof.sh run   the rehearsal: the same run over a simulated node (gpufence-sim
#                                    and the mock driver of SIM_BIN) with the frameworks venvs of
#                                    scripts/frameworks.sh standing in for the image's python
#
# The checks: the driver is found and answers (the C client); `gpufence inventory`; `gpufence cdi
# generate`, every path it names present; NVML (nvidia-smi, pynvml, the C client) shows a 4 GiB
# slice under the shim and the whole GPU without; every device-memory path of the driver charged
# and refused past a 64 MiB slice (the C client, tests/shim_quota.rs's table); the frameworks
# programs of tests/frameworks, unchanged, under the shim with a 4 GiB slice in every allocator
# mode tests/frameworks_container.rs runs, then inside one container that gpufence-runtime starts
# on runc with that slice, then without gpufence (the control: the whole GPU, past 4 GiB).
#
# Env of `run`: OUT (default /tmp/gpu-proof-out), BUDGET (seconds, default 480), PYTHON (default
# python3: torch + cupy), PYTHON_JAX (default PYTHON), STEPS (a subset of: driver inventory cdi
# nvml paths shim container control), PATH_MODES (how the C client reaches the driver: proc, the
# default, as the CUDA runtime does, and/or dlsym: dlopen + dlsym), BUNDLE (default ./gpu-proof), SIM=1,
# SIM_BIN (the build whose gpufence-sim and mocks make the simulated node; default target/debug),
# KEEP_WORK=1 (keep the work folder in /tmp: the node, state, rootfs, each program's output).
# Env of `prepare`: PROFILE (release, the default, or debug), FROM (a folder of built binaries to
# take instead of building: tests/gpu_proof.rs's), ENGINES_DIR (where runc is).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUNDLE=${BUNDLE:-$REPO/gpu-proof}
GIB=$((1 << 30))
MIB=$((1 << 20))
SLICE=$((4 * GIB))
PATHS_SLICE=$((64 * MIB))

# ---------------------------------------------------------------------------------------------
# prepare: the bundle
# ---------------------------------------------------------------------------------------------

# runc for the GPU machine: static (it has no runc of its own, and nothing is installed there)
find_runc() {
  local d
  for d in "${ENGINES_DIR:-}" "$REPO/../shared/engines/bin" "$REPO/../../shared/engines/bin" \
    "$REPO/target/engines"; do
    if [ -n "$d" ] && [ -x "$d/runc" ]; then
      echo "$d/runc"
      return 0
    fi
  done
  return 1
}

# the highest GLIBC_x.y symbol version an ELF file needs (none for a static one)
glibc_needed() {
  objdump -T "$1" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1
}

prepare() {
  set -e
  local profile=${PROFILE:-release} runc f g dir=${FROM:-}
  cd "$REPO"
  [ -n "$dir" ] && profile="prebuilt ($dir)"
  case "$profile" in
    prebuilt*) ;;
    release)
      cargo build --release -p gpufence --bins
      cargo build --release -p gpufence-shim
      # as `make build`: the entry that execs the wrapper, linked static
      cargo rustc --release -p gpufence --bin gpufence-runtime -- -C target-feature=+crt-static
      ;;
    debug) cargo build -p gpufence --bins && cargo build -p gpufence-shim ;;
    *) echo "gpu-proof: PROFILE is release or debug, not '$profile'" >&2; return 2 ;;
  esac
  dir=${dir:-target/$profile}
  runc=$(find_runc) || { echo "gpu-proof: no runc: set ENGINES_DIR or run scripts/engines.sh" >&2; return 1; }
  # static (or static-pie): no shared library NEEDED
  if readelf -d "$runc" 2>/dev/null | grep -q '(NEEDED)'; then
    echo "gpu-proof: $runc is linked dynamically; the GPU machine needs a static runc: the" \
      "official release binary (scripts/engines.sh target/engines fetches it)" >&2
    return 1
  fi
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
  cp "$dir/gpufence" "$dir/gpufence-runtime" "$dir/gpufence-runtime-wrapper" "$BUNDLE/bin/"
  cp "$dir/libgpufence.so" "$BUNDLE/lib/"
  cp "$runc" "$BUNDLE/bin/runc"
  gcc -O2 -Wall -Werror -o "$BUNDLE/bin/cuda_client" tests/fixtures/cuda_client.c -ldl
  {
    echo "gpufence $(git describe --always --dirty 2>/dev/null || echo unknown), $profile build, prepared $(date -u +%FT%TZ) on $(uname -n)"
    echo "runc: $("$BUNDLE/bin/runc" --version | head -1)"
    for f in "$BUNDLE"/bin/* "$BUNDLE"/lib/*; do
      g=$(glibc_needed "$f" || true)
      echo "$(basename "$f") $(stat -c %s "$f") bytes, sha256 $(sha256sum "$f" | cut -c1-16), needs ${g:-no glibc (static)}"
    done
  } >"$BUNDLE/MANIFEST"
  cat "$BUNDLE/MANIFEST"
  du -sh "$BUNDLE"
}

# ---------------------------------------------------------------------------------------------
# run: helpers
# ---------------------------------------------------------------------------------------------

T0=$SECONDS
left() { echo $((BUDGET - (SECONDS - T0))); }

# SECONDS CMD...: the command under timeout, the limit cut to what the budget has left; 125
# without running it when under 10 seconds are left
run_t() {
  local t=$1 l
  shift
  l=$(($(left) - 5))
  [ "$l" -lt "$t" ] && t=$l
  if [ "$t" -lt 10 ]; then
    echo "(not run: the budget of ${BUDGET}s is spent)"
    return 125
  fi
  timeout -k 5 "$t" "$@"
}

# STATUS NAME REASON: one line of the summary
result() {
  printf '%s %s: %s\n' "$1" "$2" "$3" | tee -a "$SUMMARY"
  case "$1" in
    PASS) NPASS=$((NPASS + 1)) ;;
    FAIL) NFAIL=$((NFAIL + 1)) ;;
    SKIP) NSKIP=$((NSKIP + 1)) ;;
  esac
}

wanted() { [[ " $STEPS " == *" $1 "* ]]; }

# LOG TITLE: a header in a log file
header() { printf '\n===== %s (%ss into the run)\n' "$2" "$((SECONDS - T0))" >>"$1"; }

# NAME BYTES: a state directory whose quota gives GPU 0 BYTES (the shim's file, as gpufence
# writes it into a container; GPUFENCE_STATE points the shim at it outside one)
quota_dir() {
  local d=$WORK/state/$1
  rm -rf "$d"
  mkdir -p "$d"
  printf 'version=1\ndevice.0.uuid=%s\ndevice.0.memory=%s\n' "$UUID" "$2" >"$d/quota"
  echo "$d"
}

# the words of a client script with 40M-style sizes in bytes
mib_words() {
  local w
  for w in "$@"; do
    case "$w" in *M) echo $((${w%M} * MIB)) ;; *) echo "$w" ;; esac
  done
}

# KEY FILE: the last number of the first `KEY ...` line
value() { awk -v k="$1" '$1 == k { print $NF; exit }' "$2"; }

# ---------------------------------------------------------------------------------------------
# run: the driver, real or simulated
# ---------------------------------------------------------------------------------------------

# Where the real driver's NVML is: LD_LIBRARY_PATH, the ld cache, the usual folders. Sets
# NVML_LIB and DRIVER_ROOT (its folder less the library folder gpufence searches under
# driver-root: /usr/local/nvidia/lib64 -> /usr/local/nvidia).
find_real_driver() {
  local d dir suffix ldpath=${LD_LIBRARY_PATH:-}
  NVML_LIB=
  for d in ${ldpath//:/ }; do
    [ -e "$d/libnvidia-ml.so.1" ] && { NVML_LIB=$d/libnvidia-ml.so.1; break; }
  done
  [ -n "$NVML_LIB" ] || NVML_LIB=$(ldconfig -p 2>/dev/null | awk '$1 == "libnvidia-ml.so.1" && /x86-64/ { print $NF; exit }')
  if [ -z "$NVML_LIB" ]; then
    for d in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64 /lib/x86_64-linux-gnu; do
      [ -e "$d/libnvidia-ml.so.1" ] && { NVML_LIB=$d/libnvidia-ml.so.1; break; }
    done
  fi
  [ -n "$NVML_LIB" ] || return 1
  dir=$(dirname "$NVML_LIB")
  DRIVER_ROOT=/
  for suffix in /usr/lib/x86_64-linux-gnu /usr/lib64 /lib/x86_64-linux-gnu /lib64 /usr/lib; do
    if [[ "$dir" == *"$suffix" ]]; then
      DRIVER_ROOT=${dir%"$suffix"}
      break
    fi
  done
  DRIVER_ROOT=${DRIVER_ROOT:-/}
  SMI=$(command -v nvidia-smi || true)
  for d in "$DRIVER_ROOT/bin" "$DRIVER_ROOT/usr/bin"; do
    [ -z "$SMI" ] && [ -x "$d/nvidia-smi" ] && SMI=$d/nvidia-smi
  done
  SMI=${SMI:-nvidia-smi}
  DEV_ROOT=/
  PROC_ROOT=/
  DRV_ENV=(env)
  DEV_WRAP=()
}

# The simulated node standing in for the driver: its libraries on LD_LIBRARY_PATH of every
# process on the host side, its device nodes over /dev for the python programs (JAX looks for
# /dev/nvidia0 before it loads its CUDA plugin; the host has none).
make_sim_driver() {
  local node=$WORK/node lib
  "$SIM_BIN/gpufence-sim" node --dir "$node" --gpus 1 >/dev/null || return 1
  lib=$node/driver/usr/lib/x86_64-linux-gnu
  NVML_LIB=$lib/libnvidia-ml.so.1
  DRIVER_ROOT=$node/driver
  DEV_ROOT=$node
  PROC_ROOT=$node
  SMI=$node/driver/usr/bin/nvidia-smi
  DRV_ENV=(env "LD_LIBRARY_PATH=$lib")
  # shellcheck disable=SC2016 # $0 and $@ are the inner shell's
  DEV_WRAP=(unshare -m sh -c 'mount --make-rprivate / && mount -t overlay overlay -o "lowerdir=$0/dev:/dev" /dev && exec "$@"' "$node")
}

write_config() {
  CFG=$WORK/gpufence.toml
  cat >"$CFG" <<EOF
# written by scripts/gpu-proof.sh for this run
driver-root = "$DRIVER_ROOT"
dev-root = "$DEV_ROOT"
proc-root = "$PROC_ROOT"
nvml-library = "$NVML_LIB"
state-dir = "$WORK/gpufence-state"
gpufence-binary = "$BUNDLE/bin/gpufence"

[log]
file = "$WORK/gpufence.log"
level = "debug"

[runtime]
path = "$BUNDLE/bin/runc"
driver-folders = "$WORK/driver-folders"

[shim]
library = "$BUNDLE/lib/libgpufence.so"
EOF
}

step_env() {
  local log=$OUT/env.txt pkg py
  {
    echo "mode: $MODE; repository $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo '(no git)')"
    date -u
    uname -a
    ldd --version 2>&1 | head -1
    for py in "$PYTHON" "$PYTHON_JAX"; do
      echo "python $py ($("$py" --version 2>&1)):"
      for pkg in torch cupy-cuda13x jax jaxlib jax-cuda13-plugin nvidia-ml-py cuda-bindings numpy; do
        printf '  %s %s\n' "$pkg" "$("$py" -c "import importlib.metadata as m; print(m.version('$pkg'))" 2>/dev/null || echo -)"
      done
      [ "$PYTHON_JAX" = "$PYTHON" ] && break
    done
    echo "bundle:"
    cat "$BUNDLE/MANIFEST" 2>&1
    echo "driver: NVML $NVML_LIB, driver-root $DRIVER_ROOT, nvidia-smi $SMI"
    ls -la /dev/nvidia* 2>&1
    ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libnvidia-ml\.so'
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    echo "cgroup: $(stat -f -c %T /sys/fs/cgroup 2>&1)"
    echo "gpufence config:"
    cat "$CFG"
  } >>"$log" 2>&1
}

# LOG: without nvidia-persistenced the driver tears the GPU down when its last process exits
# and every process after pays its start again (seconds on an H100): a context held open for the
# whole run keeps it up, changing no setting of the GPU. Not when the compute mode is exclusive
# (the holder would lock every check out), nor over the simulated driver.
keep_driver_up() {
  local mode
  [ "$MODE" = real ] || return 0
  mode=$(run_t 30 "$SMI" --query-gpu=compute_mode --format=csv,noheader 2>&1 | head -1)
  echo "compute mode: $mode" >>"$1"
  [ "$mode" = Default ] || return 0
  "$BUNDLE/bin/cuda_client" proc hold >>"$1" 2>&1 </dev/null &
  HOLDER=$!
  echo "a context held open by process $HOLDER for the run" >>"$1"
}

# The driver answers the C client (no shim): its totals, which the control checks expect
step_driver() {
  local log=$OUT/nvml.txt out=$WORK/totals.txt
  header "$log" "the driver, without gpufence: cuda_client proc info totalmem; cuda_client - nvml"
  run_t 60 "${DRV_ENV[@]}" "$BUNDLE/bin/cuda_client" proc info totalmem >"$out" 2>&1
  run_t 60 "${DRV_ENV[@]}" "$BUNDLE/bin/cuda_client" - nvml >>"$out" 2>&1
  cat "$out" >>"$log"
  WHOLE_CUDA=$(awk '$1 == "info" { print $3; exit }' "$out")
  WHOLE_TOTALMEM=$(value totalmem "$out")
  WHOLE_NVML=$(awk '$1 == "nvml" { print $2; exit }' "$out")
  UUID=$(run_t 30 "${DRV_ENV[@]}" "$SMI" -L 2>/dev/null | grep -o 'GPU-[0-9a-fA-F-]*' | head -1)
  # what the checks after expect: 0 (and none) when the driver did not say
  WHOLE_CUDA=${WHOLE_CUDA:-0} WHOLE_TOTALMEM=${WHOLE_TOTALMEM:-0} WHOLE_NVML=${WHOLE_NVML:-0}
  UUID=${UUID:-none}
  keep_driver_up "$log"
  if [ "$WHOLE_CUDA" != 0 ] && [ "$WHOLE_NVML" != 0 ] && [ "$UUID" != none ]; then
    result PASS driver "$UUID: cuMemGetInfo total $WHOLE_CUDA, cuDeviceTotalMem $WHOLE_TOTALMEM, NVML total $WHOLE_NVML"
  else
    result FAIL driver "the C client or nvidia-smi -L got no answer from the driver (nvml.txt)"
  fi
}

step_inventory() {
  local log=$OUT/inventory.txt out=$WORK/inventory.out rc
  header "$log" "gpufence inventory"
  run_t 60 "$BUNDLE/bin/gpufence" --config "$CFG" inventory >"$out" 2>&1
  rc=$?
  cat "$out" >>"$log"
  if [ $rc = 0 ] && grep -q "^GPU 0 .*$UUID" "$out" && grep -q 'library .*libcuda\.so\.' "$out"; then
    result PASS inventory "$(head -1 "$out"); GPU 0 $UUID; libcuda among the driver files"
  else
    result FAIL inventory "exit $rc: $(grep -v '^ ' "$out" | head -1)"
  fi
}

step_cdi() {
  local log=$OUT/inventory.txt spec=$WORK/cdi.json rc verdict
  header "$log" "gpufence cdi generate --format json"
  run_t 60 "$BUNDLE/bin/gpufence" --config "$CFG" cdi generate --format json >"$spec" 2>>"$log"
  rc=$?
  cat "$spec" >>"$log"
  header "$log" "every path the spec names"
  verdict=$("$PYTHON" - "$spec" <<'PY' 2>&1 | tee -a "$log" | tail -1
import json, os, sys
spec = json.load(open(sys.argv[1]))
edits = [spec.get("containerEdits", {})] + [d.get("containerEdits", {}) for d in spec["devices"]]
paths = set()
for e in edits:
    paths.update(n.get("hostPath") or n["path"] for n in e.get("deviceNodes", []))
    paths.update(m["hostPath"] for m in e.get("mounts", []))
    paths.update(h["path"] for h in e.get("hooks", []))
missing = sorted(p for p in paths if not os.path.exists(p))
for p in sorted(paths):
    print(("present " if p not in missing else "MISSING ") + p)
names = [d["name"] for d in spec["devices"]]
ok = not missing and paths and "0" in names
print(("ok " if ok else "FAIL ") + f"{spec['kind']}: devices {', '.join(names)}; {len(paths)} paths, "
      + (f"missing: {' '.join(missing)}" if missing else "all present"))
PY
)
  if [ $rc = 0 ] && [[ "$verdict" == ok* ]]; then
    result PASS cdi "${verdict#ok }"
  else
    result FAIL cdi "exit $rc: ${verdict#FAIL }"
  fi
}

# NAME LOG WANT_MIB SLACK_MIB [ENV...]: nvidia-smi's memory.total (MiB) is WANT_MIB, give or take
# SLACK_MIB (its rounding of a whole GPU's bytes)
smi_check() {
  local name=$1 log=$2 want=$3 slack=$4 out=$WORK/$1.out got
  shift 4
  header "$log" "$name: nvidia-smi, then its memory query"
  run_t 60 "${DRV_ENV[@]}" "$@" "$SMI" >>"$log" 2>&1
  run_t 60 "${DRV_ENV[@]}" "$@" "$SMI" --query-gpu=memory.total,memory.used,memory.free \
    --format=csv,noheader,nounits >"$out" 2>&1
  cat "$out" >>"$log"
  # the real tool answers "81559, 0, 81080"; the simulated node's prints memory.total=81559MiB
  got=$(sed -n 's/.*memory\.total=\([0-9]*\)MiB.*/\1/p' "$out" | head -1)
  [ -n "$got" ] || got=$(head -1 "$out" | cut -d, -f1 | tr -d ' ')
  if [[ "$got" =~ ^[0-9]+$ ]] && [ $((got - want)) -le "$slack" ] && [ $((want - got)) -le "$slack" ]; then
    result PASS "$name" "nvidia-smi memory.total $got MiB"
  else
    result FAIL "$name" "nvidia-smi memory.total '${got}' MiB, not $want: $(head -1 "$out")"
  fi
}

# NAME LOG WANT_BYTES [ENV...]: tests/frameworks/nvml_slice.py and the C client's NVML see WANT
nvml_checks() {
  local name=$1 log=$2 want=$3 out=$WORK/$1-py.out c
  shift 3
  header "$log" "$name: nvml_slice.py --total $want"
  run_t 60 "${DRV_ENV[@]}" "$@" "$PYTHON" "$REPO/tests/frameworks/nvml_slice.py" --total "$want" >"$out" 2>&1
  cat "$out" >>"$log"
  if grep -q '^verdict ok' "$out"; then
    result PASS "$name-py" "$(value via "$out"): nvmlDeviceGetMemoryInfo(_v2) totals $want"
  else
    result FAIL "$name-py" "$(grep -m1 '^verdict' "$out" || tail -1 "$out")"
  fi
  out=$WORK/$name-c.out
  header "$log" "$name: cuda_client - nvml"
  run_t 60 "${DRV_ENV[@]}" "$@" "$BUNDLE/bin/cuda_client" - nvml >"$out" 2>&1
  cat "$out" >>"$log"
  c="$(awk '$1 == "nvml" { print $2 }' "$out") $(awk '$1 == "nvml2" { print $2 }' "$out")"
  if [ "$want" != 0 ] && [ "$c" = "$want $want" ]; then
    result PASS "$name-c" "dlopen + dlsym of libnvidia-ml.so.1: both totals $want"
  else
    result FAIL "$name-c" "NVML totals (v1, v2) '$c', not $want"
  fi
}

step_nvml() {
  local log=$OUT/nvml.txt st
  st=$(quota_dir nvml "$SLICE")
  smi_check nvml-smi-whole "$log" $((WHOLE_NVML / MIB)) 1
  smi_check nvml-smi-slice "$log" $((SLICE / MIB)) 0 "GPUFENCE_STATE=$st" "LD_PRELOAD=$SHIM"
  nvml_checks nvml-whole "$log" "$WHOLE_NVML"
  nvml_checks nvml-slice "$log" "$SLICE" "GPUFENCE_STATE=$st" "LD_PRELOAD=$SHIM"
}

# tests/shim_quota.rs's DEVICE_MEMORY_PATHS: the client's command, its arguments for 40 MiB and
# for 30 MiB
PATH_ROWS=(
  "alloc|40M|30M" "managed|40M|30M" "pitch|40960 1024|30720 1024" "async|40M|30M"
  "ptsz|40M|30M" "pool|40M|30M" "newpool|40M|30M" "vmm|40M|30M" "vmmmapped|40M|30M"
  "vmmretained|40M|30M" "vmmimport|40M|30M" "array|2048 1280|2048 960"
  "array3d|128 128 160|128 128 120" "mipmap|2048 1280 1|2048 960 1" "graphmem|20M|15M"
  "graphnode|40M|30M" "graphaddnode|40M|30M" "graphaddnode2|40M|30M" "graphclone|40M|30M"
  "graphchild|40M|30M" "graphupload|40M|30M" "graphinstupload|40M|30M"
)

# Every path to device memory under a 64 MiB slice: 40 MiB charged (24 MiB left), 30 MiB more
# refused with CUDA_ERROR_OUT_OF_MEMORY, everything back once freed
step_paths() {
  local log=$OUT/cuda-paths.txt mode row cmd first second st out ok bad n want
  want="info $((24 * MIB)) $PATHS_SLICE|info $PATHS_SLICE $PATHS_SLICE"
  for mode in $PATH_MODES; do
    ok=0
    bad=()
    for row in "${PATH_ROWS[@]}"; do
      IFS='|' read -r cmd first second <<<"$row"
      st=$(quota_dir "paths-$mode-$cmd" "$PATHS_SLICE")
      out=$WORK/paths-$mode-$cmd.out
      header "$log" "$mode $cmd $first, then $second, under a 64 MiB slice"
      # shellcheck disable=SC2046,SC2086 # the words of the client's script
      run_t 30 "${DRV_ENV[@]}" "GPUFENCE_STATE=$st" "LD_PRELOAD=$SHIM" "$BUNDLE/bin/cuda_client" "$mode" \
        $(mib_words "$cmd" $first info "$cmd" $second free graphtrim info) >"$out" 2>&1
      cat "$out" >>"$log"
      n=$(awk -v c="$cmd" '$1 == c { print $NF }' "$out" | tr '\n' ' ')
      if [ "$n" = "ok 2 " ] && [ "$(grep '^info ' "$out" | paste -sd'|')" = "$want" ]; then
        ok=$((ok + 1))
      else
        bad+=("$cmd")
      fi
    done
    if [ ${#bad[@]} = 0 ]; then
      result PASS "paths-$mode" "$ok of ${#PATH_ROWS[@]} device-memory paths: 40 MiB charged, 30 MiB more refused, all given back"
    else
      result FAIL "paths-$mode" "$ok of ${#PATH_ROWS[@]} held; not: ${bad[*]} (cuda-paths.txt)"
    fi
  done
}

# ---------------------------------------------------------------------------------------------
# run: the frameworks programs
# ---------------------------------------------------------------------------------------------

# tests/frameworks_container.rs's `checks` and `jax_checks`: name, program, which python, arguments
slice_checks() {
  local s="--total $SLICE --stop-at $SLICE" m
  for m in default expandable async; do echo "torch-$m torch_slice.py py --mode $m $s"; done
  echo "torch-graph torch_slice.py py --mode async $s --graph $GIB"
  echo "torch-shared torch_slice.py py --mode default $s --held $GIB"
  for m in default async; do echo "cupy-$m cupy_slice.py py --mode $m $s"; done
  echo "pool-kept pool_kept.py py $s"
  for m in default fraction grow platform async; do echo "jax-$m jax_slice.py jax --mode $m $s"; done
  echo "jax-shared jax_slice.py jax --mode default $s --held $GIB"
}

# the control: the same programs without gpufence, the whole GPU seen, 6 GiB allocated; the
# first of each program first, so that a short budget still runs each once
control_checks() {
  local w="--total $WHOLE_CUDA --pass $((6 * GIB))" m
  echo "torch-default torch_slice.py py --mode default $w"
  echo "cupy-default cupy_slice.py py --mode default $w"
  echo "jax-default jax_slice.py jax --mode default $w"
  echo "pool-kept pool_kept.py py --mode default $w"
  for m in expandable async; do echo "torch-$m torch_slice.py py --mode $m $w"; done
  echo "cupy-async cupy_slice.py py --mode async $w"
  for m in fraction grow platform async; do echo "jax-$m jax_slice.py jax --mode $m $w"; done
}

# FILE: the summary's reason for one program's output: the total it saw, what it allocated,
# XLA's limit, its verdict
describe() {
  local facts=() v
  v=$(awk '$1 == "mem_get_info" || $1 == "memGetInfo" || $1 == "kept_by_pool" { print $3; exit }' "$1")
  [ -n "$v" ] && facts+=("total $v")
  v=$(value allocated "$1")
  [ -n "$v" ] && facts+=("allocated $v")
  v=$(value bytes_limit "$1")
  [ -n "$v" ] && facts+=("bytes_limit $v")
  v=$(grep -m1 '^verdict' "$1" || echo "no verdict: $(tail -1 "$1")")
  [ ${#facts[@]} = 0 ] && facts=("nothing seen")
  printf '%s, ' "${facts[@]}" | sed 's/, $//'
  echo "; $v"
}

# PREFIX LOG [ENV...] < checks: each program on the host, one result each
run_programs() {
  local prefix=$1 log=$2 name prog which py args out st rc
  shift 2
  while read -r name prog which args; do
    py=$PYTHON
    [ "$which" = jax ] && py=$PYTHON_JAX
    out=$WORK/$prefix-$name.out
    header "$log" "$prefix/$name: $prog $args"
    local env=("$@")
    if [ "$prefix" = shim ]; then
      st=$(quota_dir "$prefix-$name" "$SLICE")
      env+=("GPUFENCE_STATE=$st" "LD_PRELOAD=$SHIM")
    fi
    # shellcheck disable=SC2086 # the program's arguments
    (cd "$WORK" && run_t 180 "${DRV_ENV[@]}" "${env[@]}" HOME="$WORK" "${DEV_WRAP[@]}" "$py" \
      "$REPO/tests/frameworks/$prog" $args) >"$out" 2>&1 </dev/null
    rc=$?
    cat "$out" >>"$log"
    if [ $rc = 125 ]; then
      result SKIP "$prefix/$name" "the budget of ${BUDGET}s is spent"
    elif grep -q '^verdict ok' "$out"; then
      result PASS "$prefix/$name" "$(describe "$out")"
    else
      result FAIL "$prefix/$name" "$([ $rc = 124 ] && echo 'timed out: ')$(describe "$out")"
    fi
  done
}

step_shim() { run_programs shim "$OUT/shim.txt" < <(slice_checks); }

step_control() { run_programs control "$OUT/control.txt" < <(control_checks); }

# ---------------------------------------------------------------------------------------------
# run: the container
# ---------------------------------------------------------------------------------------------

# BUNDLEDIR: the container's rootfs, the host's own files (the image's python and its venv, as
# tests/frameworks_container.rs binds the venv and the host's python): an overlay of the host's
# root filesystem whose changes go to a tmpfs (gpufence adds its mount points, the ld cache and
# /etc/ld.so.preload there), each python's prefixes that lie on another filesystem bound
# read-only at their places. Without overlayfs: rootfs_binds. Writes the bound folders to
# BUNDLEDIR/binds, the mounts to take down to BUNDLEDIR/mounts.
make_rootfs() {
  local b=$1 r=$1/rootfs t=$1/layers py p binds=()
  mkdir -p "$r" "$t"
  if ! { mount -t tmpfs tmpfs "$t" && echo "$t" >"$b/mounts" && mkdir "$t/upper" "$t/work" &&
    mount -t overlay overlay -o "lowerdir=/,upperdir=$t/upper,workdir=$t/work" "$r"; }; then
    echo "no overlay of / here: the rootfs is made of read-only binds"
    rootfs_binds "$b"
    return
  fi
  echo "$r" >>"$b/mounts"
  echo "rootfs: an overlay of the host's / (changes on a tmpfs)"
  for py in "$PYTHON" "$PYTHON_JAX"; do
    for p in $("$py" -c 'import os, sys; print(sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)))'); do
      p=$(realpath "$p")
      [ -n "$(ls -A "$r$p" 2>/dev/null)" ] || binds+=("$p")
    done
  done
  printf '%s\n' "${binds[@]}" | sort -u >"$b/binds"
}

# BUNDLEDIR: the rootfs as read-only binds of the host's folders: the top-level library and
# binary folders (or their links), /usr's and /usr/local's folders (but /usr/local/nvidia, where
# gpufence puts the driver), /opt's, and each python's prefixes wherever they are. gpufence's
# mount points under a bound folder (the driver's firmware under /lib/firmware, links of its
# binaries in /usr/bin) then cannot be made: the overlay is the way that works.
rootfs_binds() {
  local b=$1 r=$1/rootfs e p py binds=() covered
  mkdir -p "$r"/{dev,proc,sys,tmp,run,etc,root,usr/local}
  chmod 1777 "$r/tmp"
  add() { # a host folder or link at the same place in the rootfs
    if [ -L "$1" ]; then
      mkdir -p "$r$(dirname "$1")"
      ln -sfn "$(readlink "$1")" "$r$1"
    elif [ -d "$1" ]; then
      binds+=("$1")
    fi
  }
  for e in /bin /sbin /lib /lib64 /lib32 /libx32; do add "$e"; done
  for e in /usr/*; do [ "$e" = /usr/local ] || add "$e"; done
  for e in /usr/local/*; do [ "$e" = /usr/local/nvidia ] || add "$e"; done
  for e in /opt/*; do add "$e"; done
  for py in "$PYTHON" "$PYTHON_JAX"; do
    for p in $("$py" -c 'import os, sys; print(sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)))'); do
      p=$(realpath "$p")
      # the folders whose entries are bound one by one, or inside a bound one
      covered=0
      case "$p" in / | /usr | /usr/local | /opt) covered=1 ;; esac
      for e in "${binds[@]}"; do [[ "$p/" == "$e/"* ]] && covered=1; done
      [ $covered = 1 ] || binds+=("$p")
    done
  done
  for e in passwd group nsswitch.conf ld.so.cache ld.so.conf; do
    [ -e "/etc/$e" ] && cp -L "/etc/$e" "$r/etc/"
  done
  [ -d /etc/ld.so.conf.d ] && cp -rL /etc/ld.so.conf.d "$r/etc/"
  printf '%s\n' "${binds[@]}" >"$b/binds"
}

# BUNDLEDIR SCRIPT [ANNOTATIONS]: runc's spec running SCRIPT, the rootfs's binds, the programs
# at /gpufence-proof/frameworks, gpufence's annotations
make_spec() {
  rm -f "$1/config.json"
  "$BUNDLE/bin/runc" spec --bundle "$1" || return 1
  "$PYTHON" - "$1" "$2" "$REPO/tests/frameworks" "${3:-}" <<'PY'
import json, sys
b, script, programs, ann = sys.argv[1:5]
p = f"{b}/config.json"
spec = json.load(open(p))
spec["process"]["terminal"] = False
spec["process"]["args"] = ["/bin/sh", "-c", script]
spec["process"]["env"] = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                          "HOME=/tmp"]
spec["root"] = {"path": f"{b}/rootfs", "readonly": False}
ro = ["rbind", "ro", "nosuid", "nodev"]
binds = [(h, h) for h in open(f"{b}/binds").read().split()]
binds.append((programs, "/gpufence-proof/frameworks"))
spec["mounts"] += [{"destination": d, "source": s, "type": "bind", "options": ro} for s, d in binds]
if ann:
    spec["annotations"] = dict(kv.split("=", 1) for kv in ann.split(","))
json.dump(spec, open(p, "w"), indent=1)
PY
}

step_container() {
  local log=$OUT/container.txt b=$WORK/ctr
  mkdir -p "$b"
  header "$log" "the rootfs"
  make_rootfs "$b" >>"$log" 2>&1
  cat "$b/binds" >>"$log"
  if [ "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" != cgroup2fs ] && ! mountpoint -q /sys/fs/cgroup/memory 2>/dev/null; then
    echo "no cgroup hierarchy at /sys/fs/cgroup: mounting cgroup2 there" >>"$log"
    mount -t cgroup2 none /sys/fs/cgroup >>"$log" 2>&1
  fi
  header "$log" "smoke: plain runc runs a shell in that rootfs"
  container_programs "$log" "$b"
  # the rootfs's mounts, last made first taken down
  [ -f "$b/mounts" ] && tac "$b/mounts" | while read -r m; do umount "$m" >>"$log" 2>&1; done
}

# LOG BUNDLEDIR: a smoke container on plain runc, then the programs in one gpufence container
container_programs() {
  local log=$1 b=$2 out=$WORK/ctr.out err=$WORK/ctr.err rc script id name prog which args py sec
  make_spec "$b" 'echo smoke ok' >>"$log" 2>&1
  run_t 60 "$BUNDLE/bin/runc" --root "$WORK/runc-root" run --bundle "$b" "smoke-$$" >"$out" 2>"$err" </dev/null
  rc=$?
  cat "$out" "$err" >>"$log"
  "$BUNDLE/bin/runc" --root "$WORK/runc-root" delete --force "smoke-$$" >/dev/null 2>&1
  if [ $rc != 0 ] || ! grep -q 'smoke ok' "$out"; then
    result SKIP container "runc cannot run a container here (exit $rc): $(tail -1 "$err")"
    return
  fi
  script="cd /tmp; export HOME=/tmp"$'\n'
  while read -r name prog which args; do
    py=$PYTHON
    [ "$which" = jax ] && py=$PYTHON_JAX
    script+="echo '== $name'; timeout 180 $py /gpufence-proof/frameworks/$prog $args 2>&1 | grep -v '^gpufence: '"$'\n'
  done < <(slice_checks)
  script+="echo '== end'"
  make_spec "$b" "$script" "gpufence.dev/devices=0,gpufence.dev/memory=4Gi" >>"$log" 2>&1
  id=gpu-proof-$$
  header "$log" "gpufence-runtime run: the programs in one container, GPU 0, 4Gi"
  run_t 420 env GPUFENCE_CONFIG="$CFG" "$BUNDLE/bin/gpufence-runtime" --root "$WORK/runc-root" \
    --log "$WORK/runc.log" --log-format json run --bundle "$b" "$id" >"$out" 2>"$err" </dev/null
  rc=$?
  env GPUFENCE_CONFIG="$CFG" "$BUNDLE/bin/gpufence-runtime" --root "$WORK/runc-root" delete --force "$id" >/dev/null 2>&1
  if [ $rc = 125 ]; then
    result SKIP container "the budget of ${BUDGET}s is spent"
    return
  fi
  cat "$out" >>"$log"
  header "$log" "gpufence-runtime's stderr (exit $rc), runc's log"
  cat "$err" >>"$log"
  tail -c 100000 "$WORK/runc.log" >>"$log" 2>/dev/null
  if ! grep -q '^== ' "$out"; then
    result FAIL container "gpufence-runtime run exit $rc, no program ran: $(tail -1 "$err")"
    return
  fi
  while read -r name prog which args; do
    sec=$WORK/ctr-$name.out
    awk -v n="== $name" '$0 == n { on = 1; next } /^== / { on = 0 } on' "$out" >"$sec"
    if grep -q '^verdict ok' "$sec"; then
      result PASS "container/$name" "$(describe "$sec")"
    else
      result FAIL "container/$name" "$(describe "$sec")"
    fi
  done < <(slice_checks)
}

run() {
  MODE=real
  [ "${SIM:-}" = 1 ] && MODE=simulated
  BUDGET=${BUDGET:-480}
  OUT=${OUT:-/tmp/gpu-proof-out}
  # absolute (the container finds them at the same paths), not resolved (a venv's python is
  # its link)
  [ -z "${PYTHON:-}" ] && ! command -v python3 >/dev/null && PYTHON=/opt/torch/.venv/bin/python3
  PYTHON=$(command -v "${PYTHON:-python3}" || echo "${PYTHON:-python3}")
  PYTHON_JAX=$(command -v "${PYTHON_JAX:-$PYTHON}" || echo "${PYTHON_JAX:-$PYTHON}")
  STEPS=${STEPS:-driver inventory cdi nvml paths shim container control}
  PATH_MODES=${PATH_MODES:-proc}
  SIM_BIN=${SIM_BIN:-$REPO/target/debug}
  SHIM=$BUNDLE/lib/libgpufence.so
  NPASS=0 NFAIL=0 NSKIP=0
  mkdir -p "$OUT"
  SUMMARY=$OUT/summary.txt
  : >"$SUMMARY"
  for f in env nvml inventory cuda-paths shim control container; do : >"$OUT/$f.txt"; done
  WORK=$(mktemp -d /tmp/gpu-proof.XXXXXX)
  echo "gpufence GPU proof, $MODE driver, budget ${BUDGET}s, started $(date -u +%FT%TZ); logs beside this file" >>"$SUMMARY"
  if [ ! -f "$BUNDLE/bin/gpufence" ]; then
    result FAIL bundle "no $BUNDLE/bin/gpufence: run scripts/gpu-proof.sh prepare, carry gpu-proof"
    rm -rf "$WORK"
    return 1
  fi
  if [ ! -x "$BUNDLE/bin/gpufence" ]; then
    # carried without its modes: a copy that runs
    cp -r "$BUNDLE" "$WORK/bundle" && chmod -R u+rwx "$WORK/bundle" && BUNDLE=$WORK/bundle
    SHIM=$BUNDLE/lib/libgpufence.so
  fi
  # what a driver that is not found leaves: every check then fails on its own
  NVML_LIB=libnvidia-ml.so.1 DRIVER_ROOT=/ DEV_ROOT=/ PROC_ROOT=/ SMI=nvidia-smi
  DRV_ENV=(env)
  DEV_WRAP=()
  if [ "$MODE" = real ]; then
    find_real_driver || result FAIL driver-found "no libnvidia-ml.so.1 on LD_LIBRARY_PATH, in the ld cache or the usual folders"
  else
    make_sim_driver || result FAIL driver-found "gpufence-sim node failed ($SIM_BIN)"
  fi
  write_config
  step_env
  WHOLE_CUDA=0 WHOLE_NVML=0 UUID=none
  wanted driver && step_driver
  wanted inventory && step_inventory
  wanted cdi && step_cdi
  wanted nvml && step_nvml
  wanted paths && step_paths
  wanted shim && step_shim
  wanted container && step_container
  wanted control && step_control
  if [ -n "${HOLDER:-}" ]; then
    kill "$HOLDER" 2>/dev/null
    wait "$HOLDER" 2>/dev/null
  fi
  tail -c 2000000 "$WORK/gpufence.log" >>"$OUT/container.txt" 2>/dev/null
  local kept="work folder removed (KEEP_WORK=1 keeps it)"
  if [ "${KEEP_WORK:-}" = 1 ] || grep -q " $WORK/" /proc/self/mounts; then
    kept="work folder $WORK"
  else
    rm -rf "$WORK"
  fi
  printf 'TOTAL %d passed, %d failed, %d skipped in %ds (%s driver; %s)\n' \
    "$NPASS" "$NFAIL" "$NSKIP" "$((SECONDS - T0))" "$MODE" "$kept" | tee -a "$SUMMARY"
  [ "$NFAIL" = 0 ]
}

case "${1:-run}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: scripts/gpu-proof.sh [prepare|run]  (SIM=1 run: the rehearsal)" >&2; exit 2 ;;
esac
