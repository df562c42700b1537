"""What the framework checks share: their arguments, the fill loop and the verdict lines.

Each check prints `key value` lines and one `verdict ok` / `verdict FAIL <why>` line, and exits 0
only on `ok`. Nothing here knows the simulated node: the sizes come from the command line, so the
same file runs unchanged on a machine with a real GPU (see docs/frameworks.md).
"""

import argparse
import os
import sys

GIB = 1 << 30
MIB = 1 << 20


def parse(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--total", type=int, required=True,
                   help="bytes the process must see as the GPU's total (the slice under gpufence)")
    p.add_argument("--stop-at", type=int,
                   help="allocating must fail at this many bytes in use (the slice): not more "
                        "than one chunk plus --slack before it, never past it")
    p.add_argument("--pass", dest="must_pass", type=int,
                   help="allocating this many bytes must succeed (the control without gpufence)")
    p.add_argument("--held", type=int, default=0,
                   help="bytes another process of the container already holds")
    p.add_argument("--graph", type=int, default=0,
                   help="first capture and replay a CUDA graph whose memory nodes hold this many "
                        "bytes (half kept after the graph, half freed inside it): the graph "
                        "keeps them, the room shrinks by them")
    p.add_argument("--chunk", type=int, default=256 * MIB)
    p.add_argument("--slack", type=int, default=256 * MIB,
                   help="what an allocator may leave unused below the slice (its granularity)")
    p.add_argument("--mode", default="default")
    a = p.parse_args()
    if (a.stop_at is None) == (a.must_pass is None):
        p.error("exactly one of --stop-at and --pass")
    return a


class Verdict:
    def __init__(self):
        self.failures = []

    def check(self, ok, why):
        if not ok:
            self.failures.append(why)

    def finish(self):
        if self.failures:
            print("verdict FAIL " + "; ".join(self.failures), flush=True)
            sys.exit(1)
        print("verdict ok", flush=True)
        sys.exit(0)


def fill(alloc, oom, a, keep):
    """Allocate chunks until `oom` is raised or the target is reached; returns bytes allocated."""
    target = a.must_pass if a.must_pass is not None else a.stop_at + a.chunk
    n = 0
    refused = False
    while n < target:
        try:
            keep.append(alloc(a.chunk))
        except oom as e:
            print("refused " + str(e).splitlines()[0][:160], flush=True)
            refused = True
            break
        n += a.chunk
    print(f"allocated {n}", flush=True)
    return n, refused


def judge_fill(v, a, n, refused):
    if a.must_pass is not None:
        v.check(not refused and n >= a.must_pass, f"control: allocated {n} < {a.must_pass}")
    else:
        room = a.stop_at - a.held - a.graph
        v.check(refused, f"no out-of-memory error up to {n} bytes (slice {a.stop_at})")
        v.check(n <= room, f"allocated {n} past the room {room} of the slice")
        v.check(n >= room - a.chunk - a.slack,
                f"stopped at {n}, more than a chunk and {a.slack} bytes before the room {room}")


def hold_in_child(script_args, env_extra):
    """Start this same program as a second process of the container; returns its Popen."""
    import subprocess
    env = dict(os.environ, **env_extra)
    return subprocess.Popen([sys.executable] + script_args, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def handles(v, name, run):
    """One check of the "handles" step: `run()` creates a cuBLAS handle or cuFFT plan, or runs a
    GEMM or FFT the framework's way and waits for it.

    Over the simulated driver kernels compute nothing, so only that the libraries start and their
    work launches (their own CUDA runtime, private driver tables, NVML and driver symbols they
    bind by dlsym) is checked, not what a product or transform gives.
    """
    try:
        run()
        print(f"handles {name} ok", flush=True)
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        line = (str(e).splitlines() or [type(e).__name__])[0][:200]
        print(f"handles {name} failed: {line}", flush=True)
        v.check(False, f"{name}: {line}")
