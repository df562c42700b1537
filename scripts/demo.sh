#!/usr/bin/env bash
# The demo behind `make demo`: a simulated 4-GPU node, its inventory and CDI spec, and a real
# container started by podman with `--device gpufence.dev/gpu=1` that sees /dev/nvidia1 only.
set -euo pipefail

if [ "${1:-}" = "--clean" ]; then
  dir=${2:?dir}
  rm -f /var/run/cdi/gpufence-demo.json
  [ -d "$dir" ] && { mountpoint -q "$dir" || true; rm -rf "$dir"; }
  exit 0
fi

dir=${1:?usage: demo.sh DIR TARGET_DIR}
bin=$(readlink -f "${2:?target dir}")
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

rm -rf "$dir"; mkdir -p "$dir"
say "1. a simulated node with 4 GPUs (real character devices, mock NVML/CUDA driver)"
cfg=$("$bin/gpufence-sim" node --dir "$dir/node" --gpus 4)
echo "config: $cfg"
ls -l "$dir/node/dev" | sed -n '1,12p'

say "2. gpufence inventory"
"$bin/gpufence" --config "$cfg" inventory

say "3. gpufence cdi generate (0.5.0, accepted by podman 4.3) -> /var/run/cdi/gpufence-demo.json"
mkdir -p /var/run/cdi
"$bin/gpufence" --config "$cfg" cdi generate --output /var/run/cdi/gpufence-demo.json
"$bin/gpufence" --config "$cfg" cdi list
head -c 1500 /var/run/cdi/gpufence-demo.json; echo " …"

say "4. podman run --device gpufence.dev/gpu=1 (runc, no network, vfs storage)"
rootfs="$dir/rootfs"
mkdir -p "$rootfs"/{bin,dev,proc,sys,etc,tmp,run}
cp /bin/busybox "$rootfs/bin/"
for c in sh ls cat echo dd test grep; do ln -sf busybox "$rootfs/bin/$c"; done
cat > "$dir/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
netns = "none"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
cat > "$dir/storage.conf" <<CONF
[storage]
driver = "vfs"
runroot = "$dir/podman/run"
graphroot = "$dir/podman/root"
CONF
export CONTAINERS_CONF="$dir/containers.conf" CONTAINERS_STORAGE_CONF="$dir/storage.conf"
podman --runtime "$(command -v runc)" run --rm --device gpufence.dev/gpu=1 --rootfs "$rootfs" /bin/sh -c '
  echo "GPU device nodes in the container:"; ls -l /dev/ | grep nvidia
  if dd if=/dev/nvidia1 of=/dev/null count=1 2>/tmp/err; then echo "opened /dev/nvidia1"; else echo "open /dev/nvidia1: $(cat /tmp/err | tail -1)  <- ENXIO: the cgroup allows it (no real GPU behind it)"; fi
  for n in 0 2 3; do test -e /dev/nvidia$n && { echo "LEAK: /dev/nvidia$n visible"; exit 1; }; done
  echo "no other /dev/nvidiaN: OK"'
rm -f /var/run/cdi/gpufence-demo.json

say "5. gpufence plan: what gpufence-runtime would do for a pod annotated devices=1, memory=4Gi"
mkdir -p "$dir/bundle"
cat > "$dir/bundle/config.json" <<JSON
{"ociVersion":"1.0.2","process":{"args":["/bin/sh"],"env":["PATH=/bin","NVIDIA_VISIBLE_DEVICES=all"],"cwd":"/"},
 "root":{"path":"$rootfs"},"annotations":{"gpufence.dev/devices":"1","gpufence.dev/memory":"4Gi"}}
JSON
"$bin/gpufence" --config "$cfg" plan --bundle "$dir/bundle" --id demo
echo
echo "an invalid allocation is refused with one line (exit 1):"
sed -i 's/"gpufence.dev\/devices":"1"/"gpufence.dev\/devices":"1,7"/' "$dir/bundle/config.json"
"$bin/gpufence" --config "$cfg" plan --bundle "$dir/bundle" --id demo || echo "(exit $?)"
say "done — the simulated node stays in $dir/node (make clean-demo removes it)"
