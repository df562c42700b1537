#!/usr/bin/env bash
# The CUDA frameworks that tests/frameworks_container.rs runs over the simulated node (docs/frameworks.md):
# virtual environments OUTSIDE the clone, built with Debian's own python3.11 (so that a container that
# binds the host's /usr runs them too), with pinned wheels and the CUDA 13 runtime wheels they bring.
# Idempotent: when every pin is installed it downloads nothing and prints the venv's path only.
#   scripts/frameworks.sh            PyTorch + CuPy (about 5.5 GiB): install what is missing, print the venv
#   scripts/frameworks.sh jax        JAX (about 4.4 GiB), in a venv of its own (see below)
#   FRAMEWORKS_VENV=/elsewhere ...   another place for the PyTorch + CuPy venv
#   FRAMEWORKS_JAX_VENV=/elsewhere   another place for the JAX venv
# JAX has its own venv: PyTorch pins its CUDA wheels exactly (CUDA 13.2 runtime, CUPTI 13.2, cuDNN
# 9.26), jax[cuda13] asks only for minimums and installs the CUDA 13.5 set. In one venv JAX would run on
# PyTorch's 13.2 wheels, under which its CUPTI cannot start over the simulated driver
# (docs/frameworks-jax.md); apart, each framework runs on what its own install picks. The JAX pins are
# that set as resolved on 2026-11-27, so that a later wheel cannot change what the test runs.
set -euo pipefail
case "${1:-}" in
  "")
    VENV=${FRAMEWORKS_VENV:-/var/cache/gpufence/frameworks/venv}
    PINS=(torch==2.15.0 cupy-cuda13x==14.2.0 numpy)
    ;;
  jax)
    VENV=${FRAMEWORKS_JAX_VENV:-/var/cache/gpufence/frameworks/venv-jax}
    PINS=("jax[cuda13]==0.10.2" jaxlib==0.10.2 jax-cuda13-plugin==0.10.2 jax-cuda13-pjrt==0.10.2
      nvidia-cuda-runtime==13.5.37 nvidia-cuda-cupti==13.5.25 nvidia-cuda-nvcc==13.5.37
      nvidia-cuda-crt==13.5.37 nvidia-cuda-nvrtc==13.5.37 nvidia-nvjitlink==13.5.37 nvidia-nvvm==13.5.37
      nvidia-cuda-cccl==13.3.5.0.6 nvidia-cublas==13.10.0.20 nvidia-cudnn-cu13==9.28.1.4
      nvidia-cufft==12.5.0.14 nvidia-cusolver==12.4.1.2 nvidia-cusparse==12.9.4.2
      nvidia-nccl-cu13==2.32.3 nvidia-nvshmem-cu13==3.8.0 numpy==2.4.6)
    ;;
  *)
    echo "frameworks.sh: unknown set '$1' (none for PyTorch + CuPy, or jax)" >&2
    exit 2
    ;;
esac
PYTHON=${FRAMEWORKS_PYTHON:-/usr/bin/python3.11}

installed() {
  [ -x "$VENV/bin/python" ] || return 1
  "$VENV/bin/python" - "${PINS[@]}" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version, PackageNotFoundError
for pin in sys.argv[1:]:
    name, _, want = pin.partition("==")
    try:
        have = version(name.split("[")[0])
    except PackageNotFoundError:
        sys.exit(1)
    if want and have != want:
        sys.exit(1)
PY
}

if ! installed; then
  if [ ! -x "$PYTHON" ]; then
    echo "frameworks.sh: $PYTHON is missing (apt-get install python3.11-venv)" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$VENV")"
  if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV" || { apt-get install -y -q python3.11-venv >&2 && "$PYTHON" -m venv "$VENV"; }
  fi
  # pip's cache sits beside the venv: a rebuilt venv reuses the downloaded wheels
  PIP_CACHE_DIR="$(dirname "$VENV")/pip-cache" "$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}" >&2
fi
echo "$VENV"
