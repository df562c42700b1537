#!/usr/bin/env bash
# `make image`: the installer image, built offline from scratch with umoci (no base image, no
# registry): gpufence, gpufence-runtime, the shim (glibc 2.17 build), the C libraries the
# binaries load (copied from the build machine), the hooks.d drop-ins, the Kubernetes
# manifests, the default config and the CDI examples. Entrypoint `gpufence install`.
#
#   scripts/image.sh [BIN_DIR] [OUT_DIR]    (defaults: target/release, target/image)
#
# Result: the OCI layout OUT_DIR/oci, tagged with the crate version (`gpufence --version`).
# Push it with skopeo:  skopeo copy oci:OUT_DIR/oci:<version> docker://REGISTRY/gpufence:<version>
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release}
OUT=${2:-target/image}
for t in umoci objdump ldd; do
  command -v "$t" >/dev/null || { echo "image: $t missing (make image installs it)" >&2; exit 1; }
done
for f in gpufence gpufence-runtime gpufence-runtime-wrapper libgpufence.so; do
  [ -f "$BIN/$f" ] || { echo "image: $BIN/$f missing (make build)" >&2; exit 1; }
done
version=$("$BIN/gpufence" --version | awk '{print $2}')
# The shim is preloaded into every container, whatever its glibc: refuse a host-glibc build.
max=$(objdump -T "$BIN/libgpufence.so" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
# (ALLOW_HOST_GLIBC_SHIM=1: the end-to-end test's image from a debug build, never shipped.)
if [ "$(printf '%s\n' "$max" GLIBC_2.17 | sort -V | tail -1)" != GLIBC_2.17 ] && [ "${ALLOW_HOST_GLIBC_SHIM:-}" != 1 ]; then
  echo "image: $BIN/libgpufence.so needs $max; build the glibc 2.17 shim first (make shim-compat)" >&2
  exit 1
fi

layout="$OUT/oci"
bundle="$OUT/bundle"
rm -rf "$layout" "$bundle"
mkdir -p "$OUT"
umoci init --layout "$layout"
umoci new --image "$layout:$version"
umoci unpack --image "$layout:$version" "$bundle" >/dev/null
root="$bundle/rootfs"

install -D -m 0755 "$BIN/gpufence" "$root/usr/bin/gpufence"
install -D -m 0755 "$BIN/gpufence-runtime" "$root/usr/bin/gpufence-runtime"
install -D -m 0755 "$BIN/gpufence-runtime-wrapper" "$root/usr/bin/gpufence-runtime-wrapper"
install -D -m 0644 "$BIN/libgpufence.so" "$root/usr/lib/gpufence/libgpufence.so"
install -D -m 0644 packaging/config.toml "$root/etc/gpufence/config.toml"
install -d "$root/usr/share/gpufence/hooks" "$root/usr/share/gpufence/k8s" "$root/usr/share/gpufence/cdi"
install -m 0644 hooks/*.json "$root/usr/share/gpufence/hooks/"
install -m 0644 packaging/k8s/*.yaml "$root/usr/share/gpufence/k8s/"
install -m 0644 cdi/*.json cdi/*.yaml "$root/usr/share/gpufence/cdi/"
# gpufence and the runtime's wrapper are glibc-dynamic: their libraries and loader, from the
# build machine, at the paths they name (`make build` links gpufence-runtime static: ldd lists
# nothing for it; a `cargo build` one is dynamic and needs the same libraries).
for lib in $(ldd "$BIN/gpufence" "$BIN/gpufence-runtime" "$BIN/gpufence-runtime-wrapper" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && NF > 1 {print $1}' | sort -u); do
  install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
done
install -d -m 1777 "$root/tmp"

umoci repack --image "$layout:$version" "$bundle" >/dev/null
umoci config --image "$layout:$version" \
  --config.entrypoint /usr/bin/gpufence --config.entrypoint install \
  --config.cmd --host-root --config.cmd /host --config.cmd --runtime --config.cmd containerd \
  --config.env PATH=/usr/bin:/usr/sbin:/bin:/sbin \
  --config.label "org.opencontainers.image.title=gpufence" \
  --config.label "org.opencontainers.image.version=$version" \
  --history.created_by "make image (scripts/image.sh)"
umoci gc --layout "$layout"
rm -rf "$bundle"
echo "$layout:$version"
