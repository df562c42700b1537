"""JAX (jax[cuda13] 0.10.2: XLA's PJRT CUDA plugin, CUDA 13.5 runtime) sees and is held to its slice.

    python jax_slice.py --mode MODE --total BYTES (--stop-at BYTES | --pass BYTES)

MODE picks XLA's device allocator (set through its environment before JAX starts):

    default      BFC allocator: one region of 75 % of the GPU's total, taken at the first allocation
    fraction     the same with XLA_PYTHON_CLIENT_MEM_FRACTION=0.5
    grow         BFC without preallocation (XLA_PYTHON_CLIENT_PREALLOCATE=false)
    platform     no pool: every buffer is its own cuMemAlloc (XLA_PYTHON_CLIENT_ALLOCATOR=platform)
    async        the driver's stream-ordered allocator (XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async)

Checks that the CUDA runtime's cudaMemGetInfo() total is --total, that XLA's allocator limit
(memory_stats()["bytes_limit"]) is its fraction of --total, then fills the device with 256 MiB
arrays: with --stop-at the allocation must fail (RESOURCE_EXHAUSTED) where the allocator's limit or
the slice ends, whichever is lower, never past it; with --pass it must get that far.
--held N: a second JAX process of the container (no pool: XLA_PYTHON_CLIENT_ALLOCATOR=platform)
first holds N bytes; this one then has the rest. Last, with the arrays released (and the
neighbour gone), the "handles" step: a GEMM through XLA's cuBLAS path and an FFT (cuFFT) run.
"""

import argparse
import ctypes
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# mode -> (XLA environment, the fraction of the total its allocator reports as bytes_limit
# (None: it reports the total), whether the allocator stops at that limit itself: the BFC
# allocator does; the stream-ordered pool only sizes itself by it and grows past it)
MODES = {
    "default": ({}, 0.75, True),
    "fraction": ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}, 0.5, True),
    "grow": ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, 0.75, True),
    "platform": ({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, None, False),
    "async": ({"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"}, 0.75, False),
}
# XLA rounds its allocator's size; how far bytes_limit may be from fraction * total
LIMIT_TOLERANCE = 4 * common.MIB


class OutOfMemory(Exception):
    pass


def mem_get_info():
    """cudaMemGetInfo of the CUDA runtime JAX's plugin loaded (libcudart.so.13)."""
    rt = ctypes.CDLL("libcudart.so.13")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    err = rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
    if err != 0:
        raise RuntimeError(f"cudaMemGetInfo failed: error {err}")
    return free.value, total.value


def xla_environment(env):
    for k in [k for k in os.environ if k.startswith("XLA_PYTHON_CLIENT_")]:
        del os.environ[k]
    os.environ.update(env)


def main():
    if "--hold" in sys.argv:
        return hold(int(sys.argv[sys.argv.index("--hold") + 1]))
    a = common.parse(__doc__)
    if a.mode not in MODES:
        sys.exit(f"unknown --mode {a.mode}: one of {', '.join(MODES)}")
    env, fraction, stops_at_limit = MODES[a.mode]
    child = None
    if a.held:
        child = common.hold_in_child([os.path.abspath(__file__), "--hold", str(a.held)], {})
        print(f"neighbour {child.stdout.readline().strip()}", flush=True)
    xla_environment(env)
    import jax
    import jax.numpy as jnp
    import numpy as np

    v = common.Verdict()
    dev = jax.devices()[0]
    print(f"device {dev.platform} {dev.device_kind}", flush=True)
    v.check(dev.platform == "gpu", f"JAX runs on {dev.platform}, not on the GPU")
    free, total = mem_get_info()
    print(f"memGetInfo {free} {total}", flush=True)
    v.check(total == a.total, f"cudaMemGetInfo total {total} != {a.total}")
    v.check(free <= a.total - a.held, f"free {free} above the room {a.total - a.held}")
    stats = dev.memory_stats() or {}
    limit = stats.get("bytes_limit")
    print(f"bytes_limit {limit}", flush=True)
    want = int((1.0 if fraction is None else fraction) * a.total)
    v.check(limit is not None and abs(limit - want) <= LIMIT_TOLERANCE,
            f"bytes_limit {limit} is not {fraction or 1} of the total {a.total} ({want})")
    room = a.stop_at
    if room is not None and stops_at_limit and limit is not None:
        room = min(room, limit + a.held)

    keep = []

    def alloc(n):
        try:
            return jnp.zeros((n,), dtype=jnp.uint8).block_until_ready()
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" in str(e):
                raise OutOfMemory(str(e)) from e
            raise

    # data round trip through device memory (copies are honoured)
    x = np.arange(1 << 16, dtype=np.int32)
    same = bool((np.asarray(jax.device_put(x, dev)) == x).all())
    print(f"roundtrip {same}", flush=True)
    v.check(same, "a host-device-host copy changed the data")
    judged = argparse.Namespace(**dict(vars(a), stop_at=room))
    n, refused = common.fill(alloc, OutOfMemory, judged, keep)
    common.judge_fill(v, judged, n, refused)
    free_after, _ = mem_get_info()
    print(f"used_after {total - free_after}", flush=True)
    v.check(total - free_after >= n, f"the device shows {total - free_after} bytes used, "
            f"less than the {n} bytes of arrays held")
    del keep[:]
    if child is not None:
        # cuBLAS needs memory of its own beside XLA's region (75 % of the slice), which the
        # neighbour's 1 GiB leaves no room for, on a real GPU as here: the neighbour goes first
        child.kill()
        child.wait()
    libraries(v, jax, jnp)
    v.finish()


def libraries(v, jax, jnp):
    """The "handles" step: XLA's cuBLAS GEMM and a cuFFT transform run.

    XLA would compile a small dot to a Triton kernel of its own; with Triton's GEMMs off for this
    one compilation it calls cuBLAS (a `__cublas$...` custom call), which is checked.
    """
    a = jnp.ones((64, 64), dtype=jnp.float32)

    def gemm():
        exe = jax.jit(jnp.dot).lower(a, a).compile(
            compiler_options={"xla_gpu_enable_triton_gemm": False})
        targets = re.findall(r'custom_call_target="([^"]+)"', exe.as_text())
        if not any(t.startswith("__cublas") for t in targets):
            raise RuntimeError(f"XLA compiled the dot without cuBLAS (custom calls: {targets})")
        exe(a, a).block_until_ready()

    common.handles(v, "cuBLAS GEMM float32", gemm)
    common.handles(v, "cuFFT transform",
                   lambda: jnp.fft.fft(jnp.ones(64, dtype=jnp.complex64)).block_until_ready())


def hold(n):
    """The neighbour: exactly `n` bytes in one array, no pool, until killed."""
    xla_environment(MODES["platform"][0])
    import time

    import jax.numpy as jnp
    a = jnp.zeros((n,), dtype=jnp.uint8).block_until_ready()
    print(f"holding {a.size}", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
