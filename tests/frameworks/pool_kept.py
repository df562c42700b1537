"""Memory a stream-ordered pool keeps is not allocatable twice (PyTorch's cudaMallocAsync
backend, then CuPy's default pool in the same process).

    python pool_kept.py --total BYTES (--stop-at BYTES | --pass BYTES)

PyTorch allocates 1 GiB through `backend:cudaMallocAsync` and frees it: the driver's pool keeps
it (PyTorch sets the pool's release threshold to the maximum). CuPy then fills the GPU through
cudaMalloc: with --stop-at it must stop 1 GiB before the slice (the pool still holds that GiB);
after `torch.cuda.empty_cache()` (a pool trim) CuPy gets the GiB too. With --pass (the control)
CuPy gets that far regardless.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

KEPT = common.GIB


def main():
    a = common.parse(__doc__)
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    import cupy
    import torch
    v = common.Verdict()
    x = torch.empty(KEPT, dtype=torch.uint8, device="cuda")
    del x
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    print(f"kept_by_pool {free} {total}", flush=True)
    v.check(total == a.total, f"mem_get_info total {total} != {a.total}")
    v.check(free <= a.total - KEPT, f"{free} free while the pool keeps {KEPT}")
    keep = []

    def alloc(n):
        return cupy.empty(n, dtype=cupy.uint8)

    a.held = KEPT
    n, refused = common.fill(alloc, cupy.cuda.memory.OutOfMemoryError, a, keep)
    common.judge_fill(v, a, n, refused)
    if a.stop_at is not None:
        torch.cuda.empty_cache()
        try:
            keep.append(alloc(KEPT))
            print("after_trim ok", flush=True)
        except cupy.cuda.memory.OutOfMemoryError as e:
            print("after_trim refused " + str(e)[:120], flush=True)
            v.check(False, "the trimmed pool's memory did not come back")
    v.finish()


if __name__ == "__main__":
    main()
