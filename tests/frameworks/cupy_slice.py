"""CuPy (cupy-cuda13x 14.2, CUDA 13.2 runtime) sees and is held to its slice.

    python cupy_slice.py --mode default|async --total BYTES (--stop-at BYTES | --pass BYTES)

Checks cupy.cuda.runtime.memGetInfo() shows --total, then fills the GPU with 256 MiB arrays
through CuPy's default memory pool (--mode default) or cupy.cuda.MemoryAsyncPool (--mode async,
the driver's stream-ordered allocator): with --stop-at the pool must raise
cupy.cuda.memory.OutOfMemoryError at the slice, with --pass it must get that far. Last, the
"handles" step: a cuBLAS handle and a cuFFT plan are created, GEMMs (float32, complex64) and an
FFT run.
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
    pool = cupy.get_default_memory_pool()
    if a.mode == "async":
        pool = cupy.cuda.MemoryAsyncPool()
        cupy.cuda.set_allocator(pool.malloc)
    keep = []

    def alloc(n):
        return cupy.empty(n, dtype=cupy.uint8)

    n, refused = common.fill(alloc, cupy.cuda.memory.OutOfMemoryError, a, keep)
    common.judge_fill(v, a, n, refused)
    del keep[:]
    pool.free_all_blocks()  # the async pool: trimmed, its memory back to the device
    import numpy
    x = numpy.arange(1024, dtype=numpy.int32)
    same = bool((cupy.asnumpy(cupy.asarray(x)) == x).all())
    print(f"roundtrip {same}", flush=True)
    v.check(same, "a host-device-host copy changed the data")
    # after the fill: the libraries' own workspaces are not part of what it measures
    libraries(v, cupy)
    v.finish()


def libraries(v, cupy):
    """The "handles" step: cuBLAS and cuFFT start and their work launches."""
    from cupy.cuda import cufft

    def run(f):
        return lambda: (f(), cupy.cuda.runtime.deviceSynchronize())

    def gemm(dtype):
        a = cupy.ones((64, 64), dtype=dtype)
        return a @ a

    common.handles(v, "cuBLAS", cupy.cuda.device.get_cublas_handle)
    common.handles(v, "cuBLAS GEMM float32", run(lambda: gemm(cupy.float32)))
    common.handles(v, "cuBLAS GEMM complex64", run(lambda: gemm(cupy.complex64)))
    common.handles(v, "cuFFT", lambda: cufft.Plan1d(64, cufft.CUFFT_C2C, 1))
    common.handles(v, "cuFFT transform",
                   run(lambda: cupy.fft.fft(cupy.ones(64, dtype=cupy.complex64))))


if __name__ == "__main__":
    main()
