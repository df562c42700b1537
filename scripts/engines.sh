#!/usr/bin/env bash
# The container engines the end-to-end tests run on: runc v1.5.1 and containerd v2.3.4 (no known
# container escapes; Debian 12's runc 1.1.5 and containerd 1.6 have them, and no NRI).
#   scripts/engines.sh DIR     prints DIR when it holds runc and containerd 2.3 (ctr, the shim);
#                              otherwise fetches the official release binaries into DIR, each
#                              checked against the sha256 pinned below, and prints DIR.
# The Makefile passes ENGINES_DIR (default: the project's shared ../shared/engines/bin where it
# exists, else target/engines) and puts it first on PATH for the tests.
set -euo pipefail
dir=${1:?usage: scripts/engines.sh DIR}
RUNC_VERSION=1.5.1
CONTAINERD_VERSION=2.3.4
# sha256 of the official release assets. runc.amd64 v1.5.1: pinned (the value two independent
# installers pin for that asset). containerd-2.3.4-linux-amd64.tar.gz: not pinned here (this
# project's machines cannot reach the release); without CONTAINERD_SHA256 the tarball is checked
# against the release's own published .sha256sum file, fetched over HTTPS from the same release.
RUNC_SHA256=${RUNC_SHA256:-177df879d50c913eb205e898d5c1c05a18f574053c0ce5524c471208eaf06f6f}
CONTAINERD_SHA256=${CONTAINERD_SHA256:-}

have() { [ -x "$dir/runc" ] && [ -x "$dir/containerd" ] && [ -x "$dir/containerd-shim-runc-v2" ] && [ -x "$dir/ctr" ]; }
if have; then echo "$dir"; exit 0; fi
CTD_URL="https://github.com/containerd/containerd/releases/download/v$CONTAINERD_VERSION/containerd-$CONTAINERD_VERSION-linux-amd64.tar.gz"
if [ -z "$CONTAINERD_SHA256" ]; then
  CONTAINERD_SHA256=$(curl -fsSL --retry 3 "$CTD_URL.sha256sum" | awk '{print $1}') || true
fi
if ! [[ "$RUNC_SHA256" =~ ^[0-9a-f]{64}$ && "$CONTAINERD_SHA256" =~ ^[0-9a-f]{64}$ ]]; then
  echo "engines: $dir lacks runc $RUNC_VERSION / containerd $CONTAINERD_VERSION and no sha256 to check a download against" >&2
  echo "engines: set ENGINES_DIR to built engines, or RUNC_SHA256 / CONTAINERD_SHA256" >&2
  exit 1
fi
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fetch() { # url sha256 out
  echo ">> fetching $1" >&2
  curl -fsSL --retry 3 -o "$3" "$1"
  echo "$2  $3" | sha256sum -c --quiet - >&2
}
fetch "https://github.com/opencontainers/runc/releases/download/v$RUNC_VERSION/runc.amd64" "$RUNC_SHA256" "$tmp/runc"
fetch "$CTD_URL" "$CONTAINERD_SHA256" "$tmp/containerd.tar.gz"
tar -C "$tmp" -xzf "$tmp/containerd.tar.gz" bin/containerd bin/containerd-shim-runc-v2 bin/ctr
install -m 0755 "$tmp/runc" "$tmp/bin/containerd" "$tmp/bin/containerd-shim-runc-v2" "$tmp/bin/ctr" "$dir/"
"$dir/runc" --version | head -1 >&2
"$dir/containerd" --version >&2
echo "$dir"
