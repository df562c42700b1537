"""PyTorch (torch 2.15, CUDA 13.2 runtime) sees and is held to its slice.

    python torch_slice.py --mode default|expandable|async --total BYTES (--stop-at BYTES | --pass BYTES)

--mode picks the caching allocator's configuration (PYTORCH_CUDA_ALLOC_CONF: none,
expandable_segments:True, backend:cudaMallocAsync). Checks: torch.cuda.is_available(),
mem_get_info() and get_device_properties(0).total_memory equal --total; then it fills the GPU with
256 MiB tensors: with --stop-at the allocator must raise torch.cuda.OutOfMemoryError at the slice
(not GiBs before it, never past it); with --pass it must get that far (the control). Last, the
"handles" step: a cuBLAS handle, cuBLAS GEMMs (float32, float16, a linear layer with bias through
cuBLASLt) and a cuFFT transform (plan and launch) run.
--held N: a second process of the container first holds N bytes; this one then has the rest.
--graph N (with --mode async): a CUDA graph whose allocations (memory nodes) total N bytes is
captured and replayed first; the memory it holds counts against the slice.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CONF = {"default": "", "expandable": "expandable_segments:True", "async": "backend:cudaMallocAsync"}


def main():
    if "--hold" in sys.argv:
        return hold(int(sys.argv[sys.argv.index("--hold") + 1]))
    a = common.parse(__doc__)
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = CONF[a.mode]
    child = None
    if a.held:
        child = common.hold_in_child([os.path.abspath(__file__), "--hold", str(a.held)],
                                     {"PYTORCH_CUDA_ALLOC_CONF": CONF[a.mode]})
        line = child.stdout.readline().strip()
        print(f"neighbour {line}", flush=True)
    import torch
    v = common.Verdict()
    avail = torch.cuda.is_available()
    print(f"available {avail}", flush=True)
    v.check(avail, "torch.cuda.is_available() is False")
    if not avail:
        v.finish()
    free, total = torch.cuda.mem_get_info()
    props = torch.cuda.get_device_properties(0)
    print(f"mem_get_info {free} {total}", flush=True)
    print(f"total_memory {props.total_memory}", flush=True)
    print(f"device {props.name}", flush=True)
    v.check(total == a.total, f"mem_get_info total {total} != {a.total}")
    v.check(props.total_memory == a.total, f"total_memory {props.total_memory} != {a.total}")
    v.check(free <= a.total - a.held, f"free {free} above the room {a.total - a.held}")
    keep = []
    if a.graph:
        keep.append(graph_holding(torch, a.graph))

    def alloc(n):
        return torch.empty(n, dtype=torch.uint8, device="cuda")

    n, refused = common.fill(alloc, torch.cuda.OutOfMemoryError, a, keep)
    common.judge_fill(v, a, n, refused)
    del keep[:]
    torch.cuda.empty_cache()
    free_after, _ = torch.cuda.mem_get_info()
    print(f"free_after_release {free_after}", flush=True)
    # a destroyed graph's memory stays with the device's graph pool until it is trimmed
    room = a.total - a.held - a.graph - a.slack
    v.check(free_after >= room, f"only {free_after} free after releasing everything")
    # data round trip through device memory (copies are honoured)
    x = torch.arange(1024, dtype=torch.int32)
    y = x.to("cuda").cpu()
    same = bool((x == y).all())
    print(f"roundtrip {same}", flush=True)
    v.check(same, "a host-device-host copy changed the data")
    # after the fill: the libraries' own workspaces are not part of what it measures
    libraries(v, torch)
    if child is not None:
        child.kill()
        child.wait()
    v.finish()


def libraries(v, torch):
    """The "handles" step: cuBLAS and cuFFT start and their work launches."""
    def ones(*shape, dtype=torch.float32):
        return torch.ones(*shape, dtype=dtype, device="cuda")

    def run(f):
        return lambda: (f(), torch.cuda.synchronize())

    common.handles(v, "cuBLAS", torch.cuda.current_blas_handle)
    common.handles(v, "cuBLAS GEMM float32", run(lambda: ones(64, 64) @ ones(64, 64)))
    half = torch.float16
    common.handles(v, "cuBLAS GEMM float16",
                   run(lambda: ones(64, 64, dtype=half) @ ones(64, 64, dtype=half)))
    common.handles(v, "cuBLASLt linear",
                   run(lambda: torch.nn.functional.linear(ones(8, 32), ones(16, 32), ones(16))))
    common.handles(v, "cuFFT", run(lambda: torch.fft.fft(ones(64, dtype=torch.complex64))))


def graph_holding(torch, n):
    """Capture and replay a graph allocating n bytes: half kept, half freed inside the graph."""
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        kept = torch.empty(n // 2, dtype=torch.uint8, device="cuda")
        transient = torch.empty(n - n // 2, dtype=torch.uint8, device="cuda")
        del transient
    g.replay()
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info()
    print(f"graph_replayed {free}", flush=True)
    return (g, kept)


def hold(n):
    import torch
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    print(f"holding {t.numel()}", flush=True)
    import time
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
