# Sourced by the CRI benches (benches/cri_appliers.sh, benches/cri/nri_cost.sh, benches/cri_pod.sh), from the
# repository root, with S (the scratch directory), E (the engines' bin directory) and the PIDS
# array (processes to stop at the end) set by the caller.
# A private containerd 2.3 config (version 4) under $1, NRI socket $1/nri.sock.
containerd_config() {
  local d=$1
  mkdir -p "$d"/{opt,nri-plugins,nri-conf,cni,s,runc}
  "$E/containerd" config default | sed \
    -e "s|^root = .*|root = '$d/root'|" -e "s|^state = .*|state = '$d/state'|" -e "s|^imports = .*|imports = []|" \
    -e "/\[plugins.'io.containerd.server.v1.grpc'\]/,/^$/ s|address = .*|address = '$d/containerd.sock'|" \
    -e "/\[plugins.'io.containerd.server.v1.ttrpc'\]/,/^$/ s|address = .*|address = '$d/containerd.sock.ttrpc'|" \
    -e "/\[plugins.'io.containerd.internal.v1.opt'\]/,/^$/ s|path = .*|path = '$d/opt'|" \
    -e "s|socket_path = '/var/run/nri/nri.sock'|socket_path = '$d/nri.sock'|" \
    -e "s|plugin_path = '/opt/nri/plugins'|plugin_path = '$d/nri-plugins'|" \
    -e "s|plugin_config_path = '/etc/nri/conf.d'|plugin_config_path = '$d/nri-conf'|" \
    -e "s|conf_dir = '/etc/cni/net.d'|conf_dir = '$d/cni'|" \
    -e "s|BinaryName = ''|BinaryName = '$E/runc'|" \
    -e "s|            Root = ''|            Root = '$d/runc'|" \
    -e "s|socket_dir = ''|socket_dir = '$d/s'|" \
    -e "s|snapshotter = 'overlayfs'|snapshotter = 'native'|" \
    -e "s|restrict_oom_score_adj = false|restrict_oom_score_adj = true|" \
    -e "s|cdi_spec_dirs = .*|cdi_spec_dirs = ['$S/cdi', '$S/cdi-node']|" \
    -e "s|sandbox = '.*'|sandbox = 'localhost/pause:test'|" >"$d/config.toml"
}
containerd_start() {
  local d=$1
  # GPUFENCE_PHASES: gpufence-runtime (the handler arm, started through containerd's runc shim)
  # times its create path into the state dir (crates/runc-wrapper/src/phases.rs).
  GPUFENCE_PHASES="$S/state/phases.txt" CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1 "$E/containerd" --config "$d/config.toml" >"$d/log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do "$E/ctr" --address "$d/containerd.sock" version >/dev/null 2>&1 && return; sleep 0.2; done
  cat "$d/log" >&2; exit 1
}
# $S/pause.tar: static busybox as localhost/pause:test (the sandbox image too), `sleep` its entrypoint.
bench_image() {
  local L=$S/img UB=$S/img-bundle
  umoci init --layout "$L" >/dev/null; umoci new --image "$L:test" >/dev/null
  umoci unpack --image "$L:test" "$UB" >/dev/null
  mkdir -p "$UB/rootfs/bin"; cp /bin/busybox "$UB/rootfs/bin/"
  for c in sh sleep true; do ln -sf busybox "$UB/rootfs/bin/$c"; done
  umoci repack --image "$L:test" "$UB" >/dev/null
  umoci config --image "$L:test" --config.entrypoint /bin/sleep --config.cmd 2147483647 --config.env PATH=/bin >/dev/null
  tar -C "$L" -cf "$S/pause.tar" .
}
# Import $S/pause.tar into the containerd under $1.
import_image() {
  "$E/ctr" --address "$1/containerd.sock" -n k8s.io images import --local --base-name localhost/pause --snapshotter native "$S/pause.tar" >/dev/null
}
