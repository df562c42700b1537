#!/usr/bin/env bash
# The CUDA frameworks that tests/frameworks_container.rs runs over the simulated node (docs/frameworks.md):
# a virtual environment OUTSIDE the clone, built with Debian's own python3.11 (so that a container that
# binds the host's /usr runs it too), with the pinned PyTorch and CuPy wheels and the CUDA 13 runtime
# wheels they bring (about 5.5 GiB). Idempotent: when every pin is installed it downloads nothing and
# prints the venv's path only.
#   scripts/frameworks.sh            install what is missing, print the venv's path
#   FRAMEWORKS_VENV=/elsewhere ...   another place for it
set -euo pipefail
VENV=${FRAMEWORKS_VENV:-/var/cache/gpufence/frameworks/venv}
PYTHON=${FRAMEWORKS_PYTHON:-/usr/bin/python3.11}
PINS=(torch==2.15.0 cupy-cuda13x==14.2.0 numpy)

installed() {
  [ -x "$VENV/bin/python" ] || return 1
  "$VENV/bin/python" - "${PINS[@]}" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version, PackageNotFoundError
for pin in sys.argv[1:]:
    name, _, want = pin.partition("==")
    try:
        have = version(name)
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
