#!/usr/bin/env bash
# Installs what one make target needs and is missing, on Debian 12 / Ubuntu (as root); quiet
# when everything is there. Each target pays only for its own tools:
#   deps.sh demo     make demo: the containers it runs (runc, podman, busybox), gcc (links Rust and
#                    the demo's CUDA client), python3, the Rust toolchain
#   deps.sh lint     demo's set + rustfmt and clippy
#   deps.sh build    demo's set + the venv with cargo-zigbuild/zig (make build's glibc-2.17 shim)
#   deps.sh test     demo's set + the engines and tools of the end-to-end tests + the venv with
#                    the CRI client and the Prometheus parser
#   deps.sh package  rpm, cargo-deb, cargo-generate-rpm: make package, and the packaging test,
#                    which runs this itself (`make package-deps`) when they are missing
#   deps.sh docker   docker.io: the docker test runs this itself (`make docker-deps`)
# On a fresh machine rustup and `cargo fetch` run beside apt-get, not after it.
set -euo pipefail
cd "$(dirname "$0")/.."

DEMO_APT=(ca-certificates curl gcc libc6-dev python3 runc podman busybox-static)
BUILD_APT=(python3-venv python3-pip binutils)
TEST_APT=(containerd umoci skopeo bpftool python3-venv python3-pip iproute2 uidmap binutils)
PACKAGE_APT=(rpm)
DOCKER_APT=(docker.io)
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

# The demo's set: apt packages and, when cargo is missing, the toolchain and the crates
# (downloaded while apt-get installs).
demo() {
  mapfile -t missing < <(missing_apt "${DEMO_APT[@]}")
  if command -v cargo >/dev/null 2>&1; then
    [ ${#missing[@]} -eq 0 ] && return 0
    echo ">> installing: ${missing[*]}"
    apt_install --no-install-recommends "${missing[@]}"
    return 0
  fi
  echo ">> installing the Rust toolchain ($RUST_TOOLCHAIN, rustup, minimal profile) and the crates${missing:+, beside apt-get: ${missing[*]}}"
  # rustup needs curl and CA certificates before anything else
  apt_install --no-install-recommends $(missing_apt curl ca-certificates)
  local log=target/deps-rust.log pid
  mkdir -p target
  ( install_rust && cargo fetch --locked -q ) >"$log" 2>&1 &
  pid=$!
  mapfile -t missing < <(missing_apt "${DEMO_APT[@]}")
  apt_install --no-install-recommends "${missing[@]}" || { kill "$pid" 2>/dev/null; exit 1; }
  wait "$pid" || { echo "Rust toolchain / cargo fetch failed:" >&2; cat "$log" >&2; exit 1; }
}

venv() { # PIP_PACKAGE...
  if [ ! -x "$PY_VENV/bin/python" ]; then mkdir -p "$(dirname "$PY_VENV")"; python3 -m venv "$PY_VENV"; fi
  "$PY_VENV/bin/python" -m pip install -q "$@"
}

case "${1:?usage: deps.sh demo|lint|build|test|package|docker}" in
  demo) demo ;;
  lint)
    demo
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
