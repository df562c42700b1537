#!/usr/bin/env bash
# Installs what one make target needs and is missing, on Debian 12 / Ubuntu (as root); quiet
# when everything is there. Each target pays only for its own tools:
#   deps.sh demo [--build]  make demo: the containers it runs (runc, podman, busybox), gcc (links
#                    Rust and the demo's CUDA client), python3, the Rust toolchain; --build: and
#                    the debug build, started while apt-get still installs (make demo)
#   deps.sh lint     demo's set + rustfmt and clippy, g++ (libFuzzer, for checking the fuzz targets)
#   deps.sh build    demo's set + the venv with cargo-zigbuild/zig (make build's glibc-2.17 shim)
#   deps.sh test     demo's set + the engines and tools of the end-to-end tests (containerd's and
#                    CRI-O's: conmon, skopeo, umoci) + the venv with
#                    the CRI client and the Prometheus parser
#   deps.sh image    umoci (make image; the build set comes with make build)
#   deps.sh package  rpm, cargo-deb, cargo-generate-rpm: make package, and the packaging test,
#                    which runs this itself (`make package-deps`) when they are missing
#   deps.sh docker   docker.io: the docker test runs this itself (`make docker-deps`)
# On a fresh machine rustup, `cargo fetch` (and for make demo the build) run beside apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

# the demo's: to build (curl for rustup; gcc links Rust and the demo's CUDA client), to run
DEMO_TOOLS_APT=(ca-certificates curl gcc libc6-dev)
DEMO_RUN_APT=(python3 runc podman busybox-static)
BUILD_APT=(python3-venv python3-pip binutils)
# conmon, libsqlite3-0, libseccomp2: CRI-O 1.36.3's monitor and the libraries crio links (the
# engines' build); skopeo puts the tests' image into CRI-O's storage
TEST_APT=(containerd umoci skopeo conmon libsqlite3-0 libseccomp2 bpftool python3-venv python3-pip iproute2 uidmap binutils)
IMAGE_APT=(umoci binutils)
PACKAGE_APT=(rpm)
DOCKER_APT=(docker.io)
LINT_APT=(g++)
PACKAGE_CRATES=(cargo-deb cargo-generate-rpm)
PY_VENV=${PY_VENV:-$PWD/target/venv}

export PATH=$HOME/.cargo/bin:$PATH DEBIAN_FRONTEND=noninteractive

need_root() {
  [ "$(id -u)" = 0 ] || { echo "run as root ($*)" >&2; exit 1; }
}

# The packages of "$@" dpkg does not know as installed.
missing_apt() {
  local p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done
}

APT_UPDATED=
apt_install() { # [--no-install-recommends] PACKAGE...
  local opts=()
  [ "${1:-}" = --no-install-recommends ] && { opts=("$1"); shift; }
  [ $# -gt 0 ] || return 0
  need_root "apt-get install $*"
  [ -n "$APT_UPDATED" ] || { apt-get update -qq; APT_UPDATED=1; }
  apt-get install -y -qq "${opts[@]}" "$@" >/dev/null
}

# rustup's installer, fetched from static.rust-lang.org (where sh.rustup.rs points it) and
# checked against its published sha256; minimal profile: rustc, cargo, rust-std. The toolchain
# the tree is checked with (`make lint` denies warnings, and a later stable deprecates or lints
# what this one accepts — 1.99 deprecates AtomicU64::fetch_update); RUST_TOOLCHAIN=stable for
# the newest.
RUST_TOOLCHAIN=${RUST_TOOLCHAIN:-1.95.0}
install_rust() {
  local url tmp sum
  url=https://static.rust-lang.org/rustup/dist/$(uname -m)-unknown-linux-gnu/rustup-init
  tmp=$(mktemp -d)
  curl --proto '=https' --tlsv1.2 -sSf -o "$tmp/rustup-init" "$url" || return 1
  sum=$(curl --proto '=https' --tlsv1.2 -sSf "$url.sha256") || return 1
  echo "${sum%% *}  $tmp/rustup-init" | sha256sum -c --quiet || return 1
  chmod +x "$tmp/rustup-init"
  "$tmp/rustup-init" -y -q --profile minimal --default-toolchain "$RUST_TOOLCHAIN" >/dev/null || return 1
  rm -rf "$tmp"
}

# The demo's set. What is missing comes in three strands at once: apt-get installs the
# compiler first and the container tools after it; beside it rustup installs the toolchain and
# cargo fetches the crates; with --build (make demo) the debug build starts as soon as the
# compiler is in, while podman and the rest are still unpacking.
demo() {
  local build=${1:-} tools run
  mapfile -t tools < <(missing_apt "${DEMO_TOOLS_APT[@]}")
  mapfile -t run < <(missing_apt "${DEMO_RUN_APT[@]}")
  local have_cargo=1 overlap=1 rust_msg=
  command -v cargo >/dev/null 2>&1 || { have_cargo=; rust_msg=" the Rust toolchain ($RUST_TOOLCHAIN, rustup),"; }
  [ ${#tools[@]} -gt 0 ] || [ ${#run[@]} -gt 0 ] || overlap=
  [ -z "$have_cargo" ] || [ -n "$build" ] || overlap=
  if [ -z "$overlap" ]; then
    # nothing to overlap: install what is missing, in order
    [ ${#tools[@]} -eq 0 ] && [ ${#run[@]} -eq 0 ] || echo ">> installing: ${tools[*]} ${run[*]}"
    apt_install --no-install-recommends "${tools[@]}" "${run[@]}"
    [ -n "$have_cargo" ] || { echo ">> installing the Rust toolchain ($RUST_TOOLCHAIN, rustup)"; install_rust || exit 1; }
    return 0
  fi
  echo ">> installing${tools[*]:+ ${tools[*]}}${run[*]:+ ${run[*]}}, beside them${rust_msg} the crates${build:+ and the debug build}"
  # rustup needs curl and CA certificates before anything else
  apt_install --no-install-recommends $(missing_apt curl ca-certificates)
  local log=target/deps-rust.log ready pid t0=$SECONDS t_tools t_apt
  mkdir -p target
  ready=$(mktemp -u /tmp/gpufence-deps.XXXXXX)
  (
    [ -n "$have_cargo" ] || install_rust || exit 1
    echo "toolchain $((SECONDS - t0))"
    cargo fetch --locked -q || exit 1
    echo "crates $((SECONDS - t0))"
    [ -n "$build" ] || exit 0
    while [ ! -e "$ready" ]; do sleep 0.5; done # the compiler (cc links Rust)
    cargo build --workspace || exit 1
    echo "build $((SECONDS - t0))"
  ) >"$log" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null; rm -f "$ready"' EXIT
  apt_install --no-install-recommends "${tools[@]}"
  t_tools=$((SECONDS - t0))
  touch "$ready"
  apt_install --no-install-recommends "${run[@]}"
  t_apt=$((SECONDS - t0))
  wait "$pid" || { echo "Rust toolchain / crates / build failed ($log):" >&2; tail -40 "$log" >&2; exit 1; }
  trap - EXIT
  rm -f "$ready"
  # where a fresh machine's minutes go (docs/performance.md's newcomer figures)
  echo ">> apt-get: compiler by ${t_tools} s, the rest by ${t_apt} s; beside it the toolchain by" \
    "$(sed -n 's/^toolchain //p' "$log") s, the crates by $(sed -n 's/^crates //p' "$log") s${build:+, the build by $(sed -n 's/^build //p' "$log") s}"
}

venv() { # PIP_PACKAGE...
  if [ ! -x "$PY_VENV/bin/python" ]; then mkdir -p "$(dirname "$PY_VENV")"; python3 -m venv "$PY_VENV"; fi
  "$PY_VENV/bin/python" -m pip install -q "$@"
}

case "${1:?usage: deps.sh demo|lint|build|test|image|package|docker}" in
  demo) demo "${2:-}" ;;
  lint)
    demo
    mapfile -t missing < <(missing_apt "${LINT_APT[@]}")
    [ ${#missing[@]} -eq 0 ] || { echo ">> installing: ${missing[*]}"; apt_install "${missing[@]}"; }
    for c in rustfmt clippy; do
      rustup component list --installed 2>/dev/null | grep -q "^$c" ||
        { echo ">> adding $c"; rustup component add "$c" >/dev/null 2>&1; }
    done
    ;;
  build)
    demo
    mapfile -t missing < <(missing_apt "${BUILD_APT[@]}")
    [ ${#missing[@]} -eq 0 ] || { echo ">> installing: ${missing[*]}"; apt_install "${missing[@]}"; }
    [ -x "$PY_VENV/bin/python" ] || { mkdir -p "$(dirname "$PY_VENV")"; python3 -m venv "$PY_VENV"; }
    ;;
  test)
    demo
    mapfile -t missing < <(missing_apt "${TEST_APT[@]}")
    [ ${#missing[@]} -eq 0 ] || { echo ">> installing: ${missing[*]}"; apt_install "${missing[@]}"; }
    if ! "$PY_VENV/bin/python" -c 'import cri_api, grpc, prometheus_client' 2>/dev/null; then
      echo ">> python venv for the CRI client and the Prometheus text parser"
      venv 'container-runtime-interface-api==2.0.1' grpcio protobuf 'prometheus-client>=0.20'
    fi
    ;;
  image)
    mapfile -t missing < <(missing_apt "${IMAGE_APT[@]}")
    [ ${#missing[@]} -eq 0 ] || { echo ">> installing: ${missing[*]}"; apt_install "${missing[@]}"; }
    ;;
  package)
    mapfile -t missing < <(missing_apt "${PACKAGE_APT[@]}")
    crates=()
    for t in "${PACKAGE_CRATES[@]}"; do command -v "$t" >/dev/null 2>&1 || crates+=("$t"); done
    [ ${#missing[@]} -eq 0 ] && [ ${#crates[@]} -eq 0 ] && exit 0
    echo ">> ${DEPS_FOR:-make package}: installing ${missing[*]}${missing:+ }${crates[*]} (make package-deps; once, later runs reuse them)"
    apt_install "${missing[@]}"
    # into ~/.cargo/bin, built in a throwaway directory (not the workspace's target)
    for t in "${crates[@]}"; do env -u CARGO_TARGET_DIR cargo install --locked -q "$t"; done
    ;;
  docker)
    mapfile -t missing < <(missing_apt "${DOCKER_APT[@]}")
    [ ${#missing[@]} -eq 0 ] && exit 0
    echo ">> ${DEPS_FOR:-make docker-deps}: installing ${missing[*]} (make docker-deps; once)"
    apt_install "${missing[@]}"
    ;;
  *) echo "deps.sh: unknown set $1" >&2; exit 2 ;;
esac
