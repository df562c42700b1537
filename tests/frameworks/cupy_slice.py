"""CuPy (cupy-cuda13x 14.2, CUDA 13.2 runtime) sees and is held to its slice.

    python cupy_slice.py --mode default|async --total BYTES (--stop-at BYTES | --pass BYTES)

Checks cupy.cuda.runtime.memGetInfo() shows --total, then fills the GPU with 256 MiB arrays
through CuPy's default memory pool (--mode default) or cupy.cuda.MemoryAsyncPool (--mode async,
the driver's stream-ordered allocator): with --stop-at the pool must raise
cupy.cuda.memory.OutOfMemoryError at the slice, with --pass it must get that far.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    a = common.parse(__doc__)
    import cupy
    v = common.Verdict()
    free, total = cupy.cuda.runtime.memGetInfo()
    print(f"memGetInfo {free} {total}", flush=True)
    v.check(total == a.total, f"memGetInfo total {total} != {a.total}")
    v.check(free <= a.total, f"free {free} above the total {a.total}")
    if a.mode == "async":
        cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
    keep = []

    def alloc(n):
        return cupy.empty(n, dtype=cupy.uint8)

    n, refused = common.fill(alloc, cupy.cuda.memory.OutOfMemoryError, a, keep)
    common.judge_fill(v, a, n, refused)
    del keep[:]
    cupy.get_default_memory_pool().free_all_blocks()
    import numpy
    x = numpy.arange(1024, dtype=numpy.int32)
    same = bool((cupy.asnumpy(cupy.asarray(x)) == x).all())
    print(f"roundtrip {same}", flush=True)
    v.check(same, "a host-device-host copy changed the data")
    v.finish()


if __name__ == "__main__":
    main()
