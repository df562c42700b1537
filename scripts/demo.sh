#!/usr/bin/env bash
# The demo behind `make demo`: a simulated 4-GPU node, its inventory and CDI spec, and a real
# container started by podman with `--device gpufence.dev/gpu=1` that sees /dev/nvidia1 only;
# then gpufence-runtime under a pod annotation, a HAMi pod admitted from kubelet's checkpoint, a
# forged pod (GPU annotation, no kubelet record) refused, an image-env grab neutralised, two
# containers sharing one GPU's time at 30 % and 70 %, two pods holding one time-slicing
# replica each of a GPU shared 4 ways: a quarter each, and a DRA pod whose claimed GPU arrives as
# a device: a 4 GiB slice of it.
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
# podman left the empty mount targets of the spec's binary binds in the shared rootfs; the
# runtime below links the driver's binaries at their host paths only where the image has none.
find "$rootfs/usr/bin" -maxdepth 1 -type f -empty -name 'nvidia-*' -delete 2>/dev/null || true

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

say "6. gpufence-runtime run: the same pod through the runc wrapper; nvidia-smi inside shows the 4 GiB slice"
sed -i 's/"gpufence.dev\/devices":"1,7"/"gpufence.dev\/devices":"1"/' "$dir/bundle/config.json"
# A glibc rootfs (busybox + the host's loader and libc) so the driver's dynamically linked
# nvidia-smi runs; the bundle is runc's default spec plus the pod's allocation annotations.
mkdir -p "$rootfs/lib/x86_64-linux-gnu" "$rootfs/lib64" "$rootfs/usr/bin"
for l in libc.so.6 libm.so.6 libgcc_s.so.1 libdl.so.2 libpthread.so.0; do
  [ -e "/lib/x86_64-linux-gnu/$l" ] && cp "/lib/x86_64-linux-gnu/$l" "$rootfs/lib/x86_64-linux-gnu/"
done
cp /lib64/ld-linux-x86-64.so.2 "$rootfs/lib64/"
for c in id cat; do ln -sf busybox "$rootfs/bin/$c"; done
( cd "$dir/bundle" && rm -f config.json && runc spec )
python3 - "$dir/bundle/config.json" "$rootfs" <<'PY'
import json, sys
p, rootfs = sys.argv[1:]
s = json.load(open(p))
s["process"]["terminal"] = False
s["process"]["env"] += ["NVIDIA_VISIBLE_DEVICES=all"]   # what every CUDA image sets: not trusted
s["process"]["args"] = ["/bin/sh", "-c",
  "echo '$ ls /dev | grep nvidia'; ls /dev | grep nvidia; echo '$ nvidia-smi'; nvidia-smi;"
  " echo '$ cat /etc/ld.so.preload'; cat /etc/ld.so.preload;"
  " echo '$ cat /run/gpufence/quota'; cat /run/gpufence/quota;"
  " echo '$ echo x >> /run/gpufence/quota'; (echo x >> /run/gpufence/quota) 2>&1 | tail -1;"
  " echo \"NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES GPUFENCE_MEMORY_LIMIT_0=$GPUFENCE_MEMORY_LIMIT_0\""]
s["root"] = {"path": rootfs, "readonly": False}
s["annotations"] = {"gpufence.dev/devices": "1", "gpufence.dev/memory": "4Gi"}
json.dump(s, open(p, "w"), indent=2)
PY
GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" run -b "$dir/bundle" gpufence-demo
# delete goes through the wrapper too: it removes the container's state directory (runc itself
# already removed the exited foreground container, so runc's own delete reports it missing).
GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" delete gpufence-demo 2>/dev/null || true
test ! -e "$dir/node/state/gpufence-demo" && echo "state directory removed on delete"
echo "decision log ($dir/node/gpufence.log):"; tail -n 3 "$dir/node/gpufence.log"

say "7. HAMi on Kubernetes: env believed exactly as kubelet's device-manager checkpoint records it"
# allocation.trust-env = "kubelet" is the default; point kubelet.checkpoint into the demo dir.
cp_file="$dir/kubelet/device-plugins/kubelet_internal_checkpoint"
mkdir -p "$(dirname "$cp_file")"
printf '\n[kubelet]\ncheckpoint = "%s"\ndra-checkpoint = "%s"\n' "$cp_file" "$dir/kubelet/dra_manager_state" >> "$cfg"
gpu1=$("$bin/gpufence" --config "$cfg" inventory --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["gpus"][1]["uuid"])')
# What kubelet recorded when it admitted pod "train": HAMi's device plugin gave container "main"
# GPU 1 with 3000 MiB and 30 % of the SMs.
"$bin/gpufence-sim" kubelet-checkpoint --output "$cp_file" --entry "{\"pod\":\"7d1e-train-uid\",\"container\":\"main\",\"resource\":\"nvidia.com/gpu\",\"ids\":[\"$gpu1-3\"],\"env\":{\"NVIDIA_VISIBLE_DEVICES\":\"$gpu1\",\"CUDA_DEVICE_MEMORY_LIMIT_0\":\"3000m\",\"CUDA_DEVICE_SM_LIMIT\":\"30\"}}"
echo "$cp_file:"; cat "$cp_file"; echo
# A pod's container as containerd writes it: CRI annotations naming pod UID and container, the
# image's env first (CUDA images set NVIDIA_VISIBLE_DEVICES=all), then what kubelet passed.
pod_bundle() { # NAME POD_UID CONTAINER ENV_JSON ANNOTATIONS_JSON
  mkdir -p "$dir/$1"; ( cd "$dir/$1" && rm -f config.json && runc spec )
  python3 - "$dir/$1/config.json" "$rootfs" "$2" "$3" "$4" "$5" <<'PY'
import json, sys
p, rootfs, uid, ctr, env, ann = sys.argv[1:]
s = json.load(open(p))
s["process"]["terminal"] = False
s["process"]["env"] += ["NVIDIA_VISIBLE_DEVICES=all"] + json.loads(env)
s["process"]["args"] = ["/bin/sh", "-c",
  "echo \"devices: $(ls /dev | grep nvidia | tr '\\n' ' ')\"; nvidia-smi 2>&1 | grep -E 'MiB|failed' | head -2;"
  " echo \"NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES CUDA_DEVICE_MEMORY_LIMIT_0=$CUDA_DEVICE_MEMORY_LIMIT_0\""]
s["root"] = {"path": rootfs, "readonly": False}
s["annotations"] = dict({"io.kubernetes.cri.container-type": "container",
  "io.kubernetes.cri.sandbox-uid": uid, "io.kubernetes.cri.container-name": ctr}, **json.loads(ann))
json.dump(s, open(p, "w"), indent=2)
PY
}
pod_bundle hami-pod 7d1e-train-uid main \
  "[\"NVIDIA_VISIBLE_DEVICES=$gpu1\", \"CUDA_DEVICE_MEMORY_LIMIT_0=3000m\", \"CUDA_DEVICE_SM_LIMIT=30\"]" \
  "{\"hami.io/vgpu-devices-allocated\": \"$gpu1,NVIDIA,3000,30:;\"}"
echo "\$ gpufence plan --bundle hami-pod   (where each facet came from)"
"$bin/gpufence" --config "$cfg" plan --bundle "$dir/hami-pod" --id hami-pod | sed '/^device nodes/,$d'
echo "\$ gpufence-runtime run hami-pod"
GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" run -b "$dir/hami-pod" hami-pod
GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" delete hami-pod 2>/dev/null || true

say "8. an image-env grab: a pod kubelet allocated nothing sets HAMi's variables itself"
pod_bundle grab-pod 0b9c-grab-uid main "[\"CUDA_DEVICE_MEMORY_LIMIT_0=80000m\"]" "{}"
"$bin/gpufence" --config "$cfg" plan --bundle "$dir/grab-pod" --id grab-pod | sed -n '/^allocation/p;/^kubelet/,$p'
GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" run -b "$dir/grab-pod" grab-pod
GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" delete grab-pod 2>/dev/null || true
echo
echo "a forged pod: no GPU resource, but its author wrote gpufence.dev/devices: all (any pod author"
echo "can; allocation.trust-annotations = \"kubelet\" believes annotations only within kubelet's record):"
pod_bundle forged-pod 5e2f-forged-uid main "[]" "{\"gpufence.dev/devices\": \"all\"}"
GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" run -b "$dir/forged-pod" forged-pod \
  && { echo "FAIL: the forged pod ran"; exit 1; } || echo "(refused, exit $?)"
echo
echo "and with kubelet's checkpoint gone, a pod whose GPU comes from HAMi's env alone is refused"
echo "in one line (fail closed; so is a GPU annotation on a Kubernetes container):"
rm -f "$cp_file"
pod_bundle env-pod 7d1e-train-uid main \
  "[\"NVIDIA_VISIBLE_DEVICES=$gpu1\", \"CUDA_DEVICE_MEMORY_LIMIT_0=3000m\", \"CUDA_DEVICE_SM_LIMIT=30\"]" "{}"
GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" run -b "$dir/env-pod" env-pod || echo "(exit $?)"

say "9. compute shares: two containers on GPU 2 at gpufence.dev/cores 30 % and 70 %"
# The client spins gpufence_spin_1000us kernels (device time on the simulated GPU's node-wide
# timeline) for 5 s, reaching the driver like libcudart, and reports the share of the GPU its
# kernels got after the first second.
gcc -O2 -o "$dir/cuda_client" "$(dirname "$0")/../tests/fixtures/cuda_client.c" -ldl
for share in 30 70; do
  r="$dir/rootfs-$share"; b="$dir/bundle-$share"
  rm -rf "$r" "$b"; cp -a "$rootfs" "$r"; mkdir -p "$r/usr/local/bin" "$b"
  cp "$dir/cuda_client" "$r/usr/local/bin/"
  ( cd "$b" && runc spec )
  python3 - "$b/config.json" "$r" "$share" <<'PY'
import json, sys
p, rootfs, share = sys.argv[1:]
s = json.load(open(p))
s["process"]["terminal"] = False
s["process"]["args"] = ["/bin/sh", "-c",
  "/usr/local/bin/cuda_client proc spin 1000 5 1 plain | while read w how k dev win pct; do"
  f" echo \"container asking {share} %: its kernels got $pct % of GPU 2 ($k kernels of 1 ms in"
  " $((win / 1000000)) ms)\"; done"]
s["root"] = {"path": rootfs, "readonly": False}
s["annotations"] = {"gpufence.dev/devices": "2", "gpufence.dev/cores": share}
json.dump(s, open(p, "w"), indent=2)
PY
done
for share in 30 70; do
  GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" run -b "$dir/bundle-$share" "gpufence-demo-$share" &
done
wait
for share in 30 70; do
  GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" delete "gpufence-demo-$share" 2>/dev/null || true
done

say "10. time-slicing replicas: NVIDIA's device plugin advertises GPU 3 four times; two pods hold one each"
# What kubelet records on a time-slicing cluster: replica ids <uuid>::<k> per container and, under
# RegisteredDevices, every replica of the resource. gpufence makes 1 of 4 = a quarter of the
# memory (hard) and 25 % of the compute (burst: idle time may be used). Nothing else is installed.
gpu3=$("$bin/gpufence" --config "$cfg" inventory --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["gpus"][3]["uuid"])')
all3=$(for k in 0 1 2 3; do printf '%s::%s,' "$gpu3" "$k"; done); all3=${all3%,}
"$bin/gpufence-sim" kubelet-checkpoint --output "$cp_file" --register "nvidia.com/gpu=$all3" \
  --entry "{\"pod\":\"ts-a-uid\",\"container\":\"main\",\"resource\":\"nvidia.com/gpu\",\"ids\":[\"$gpu3::0\"],\"env\":{\"NVIDIA_VISIBLE_DEVICES\":\"$gpu3\"}}" \
  --entry "{\"pod\":\"ts-b-uid\",\"container\":\"main\",\"resource\":\"nvidia.com/gpu\",\"ids\":[\"$gpu3::2\"],\"env\":{\"NVIDIA_VISIBLE_DEVICES\":\"$gpu3\"}}"
for p in ts-a ts-b; do
  pod_bundle "$p" "$p-uid" main "[\"NVIDIA_VISIBLE_DEVICES=$gpu3\"]" \
    "{\"io.kubernetes.cri.sandbox-namespace\": \"team-a\", \"io.kubernetes.cri.sandbox-name\": \"$p\"}"
  r="$dir/rootfs-$p"; rm -rf "$r"; cp -a "$rootfs" "$r"; mkdir -p "$r/usr/local/bin"; cp "$dir/cuda_client" "$r/usr/local/bin/"
  python3 - "$dir/$p/config.json" "$r" "$p" <<'PY'
import json, sys
p, rootfs, name = sys.argv[1:]
s = json.load(open(p))
s["root"]["path"] = rootfs
s["process"]["args"] = ["/bin/sh", "-c",
  "c=/usr/local/bin/cuda_client; q=$(grep memory /run/gpufence/quota | cut -d= -f2);"
  f" $c proc info alloc $((q + 1)) | sed 's/^/{name}: /' | grep -v gpufence;"
  f" $c proc spin 1000 4 1 plain | while read w how k dev win pct; do echo \"{name}: its kernels got $pct % of GPU 3\"; done"]
json.dump(s, open(p, "w"), indent=2)
PY
done
echo "\$ gpufence plan --bundle ts-a"
"$bin/gpufence" --config "$cfg" plan --bundle "$dir/ts-a" --id ts-a | sed -n '/^allocation/,/^kubelet/p'
echo "\$ gpufence-runtime run ts-a & ts-b   (info = free/total bytes as cuMemGetInfo shows them; alloc one byte past the quota)"
for p in ts-a ts-b; do
  GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" run -b "$dir/$p" "$p" &
done
sleep 2.5; echo "\$ gpufence ps"; "$bin/gpufence" --config "$cfg" ps
wait
for p in ts-a ts-b; do
  GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" delete "$p" 2>/dev/null || true
done

say "11. a DRA claim: GPU 1 arrives as a device the engine resolved; the pod gets a 4 GiB slice of it"
# When kubelet prepares pod dra-train's claim team-a/train-gpu, NVIDIA's DRA driver writes a
# per-claim CDI spec (root-owned, 0644, in a directory both the engine's cdi_spec_dirs and
# gpufence's cdi.spec-dirs name) and kubelet records the claim with its CDI id in its DRA state.
# The engine (containerd, CRI-O) resolves the CRI CDIDevices into linux.devices before gpufence
# sees the container: the device is the grant, backed by kubelet's record; gpufence.dev/memory
# only narrows it.
claim=7a3f0c1e-5b2d-4c8e-9f10-2d4b6a8c0e1f
mkdir -p "$dir/cdi"
printf '\n[cdi]\nspec-dirs = ["%s"]\n' "$dir/cdi" >> "$cfg"
spec_file="$dir/cdi/k8s.gpu.nvidia.com-claim_$claim.json"
cat > "$spec_file" <<JSON
{"cdiVersion": "0.6.0", "kind": "k8s.gpu.nvidia.com/claim",
 "devices": [{"name": "$claim-gpu-1", "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
   "deviceNodes": [{"path": "/dev/nvidia1", "hostPath": "$dir/node/dev/nvidia1"},
                   {"path": "/dev/nvidiactl", "hostPath": "$dir/node/dev/nvidiactl"}]}}]}
JSON
chmod 0644 "$spec_file"
echo "$spec_file:"; cat "$spec_file"
# kubelet's DRA state: {"Data": "<JSON text>", "Checksum": CRC-32 (IEEE) of Data's bytes}.
python3 - "$dir/kubelet/dra_manager_state" "$claim" <<'PY'
import json, sys, zlib
path, claim = sys.argv[1:]
data = json.dumps({"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
  "Entries": [{"ClaimUID": claim, "ClaimName": "train-gpu", "Namespace": "team-a",
    "PodUIDs": {"dra-train-uid": {}}, "DriverState": {"gpu.nvidia.com": {"Devices": [
      {"PoolName": "node-1", "DeviceName": "gpu-1", "RequestNames": ["gpu"],
       "CDIDeviceIDs": [f"k8s.gpu.nvidia.com/claim={claim}-gpu-1"]}]}}}]}, separators=(",", ":"))
json.dump({"Data": data, "Checksum": zlib.crc32(data.encode())}, open(path, "w"))
PY
echo "$dir/kubelet/dra_manager_state: claim team-a/train-gpu of pod dra-train-uid, CDI id k8s.gpu.nvidia.com/claim=$claim-gpu-1"
# The pod's container as containerd writes it after resolving that CDI id (device nodes, their
# cgroup rules, the spec's env after the image's NVIDIA_VISIBLE_DEVICES=all), no GPU annotation.
dra_bundle() { # NAME POD_UID
  pod_bundle "$1" "$2" main "[]" \
    "{\"gpufence.dev/memory\": \"4Gi\", \"io.kubernetes.cri.sandbox-namespace\": \"team-a\", \"io.kubernetes.cri.sandbox-name\": \"$1\"}"
  python3 - "$dir/$1/config.json" <<'PY'
import json, sys
p = sys.argv[1]
s = json.load(open(p))
s["process"]["env"] += ["NVIDIA_VISIBLE_DEVICES=void"]
s["process"]["args"] = ["/bin/sh", "-c",
  "echo \"devices: $(ls /dev | grep nvidia | tr '\\n' ' ')\";"
  " for n in 0 1 2 3; do dd if=/dev/nvidia$n of=/dev/null count=1 2>&1 | grep -q 'No such device or address' && echo \"/dev/nvidia$n: opens (ENXIO: no real GPU behind it)\"; done;"
  " nvidia-smi 2>&1 | grep -E 'MiB' | head -2; grep -E 'uuid|memory' /run/gpufence/quota"]
nodes = [("/dev/nvidia1", 195, 1), ("/dev/nvidiactl", 195, 255)]
s["linux"].setdefault("devices", []).extend(
  {"path": n, "type": "c", "major": a, "minor": b, "fileMode": 438, "uid": 0, "gid": 0} for n, a, b in nodes)
s["linux"]["resources"]["devices"] += [
  {"allow": True, "type": "c", "major": a, "minor": b, "access": "rwm"} for _, a, b in nodes]
json.dump(s, open(p, "w"), indent=2)
PY
}
dra_bundle dra-train dra-train-uid
echo "\$ gpufence plan --bundle dra-train"
"$bin/gpufence" --config "$cfg" plan --bundle "$dir/dra-train" --id dra-train | sed -n '/^allocation/,/^  DRA claim/p'
echo "\$ gpufence-runtime run dra-train"
GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" run -b "$dir/dra-train" dra-train
GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" delete dra-train 2>/dev/null || true
echo
echo "the same CDI device in a pod whose claim it is not (kubelet recorded nothing for it): refused"
dra_bundle dra-thief dra-thief-uid
GPUFENCE_CONFIG="$cfg" "$bin/gpufence-runtime" --root "$dir/runc-root" run -b "$dir/dra-thief" dra-thief \
  && { echo "FAIL: the pod ran"; exit 1; } || echo "(refused, exit $?)"

say "done — the simulated node stays in $dir/node (make clean-demo removes it)"
