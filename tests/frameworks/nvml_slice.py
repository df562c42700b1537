"""NVML from Python sees the slice (under gpufence) or the whole GPU (the control).

    python nvml_slice.py --total BYTES

Reads GPU 0's memory with nvmlDeviceGetMemoryInfo and nvmlDeviceGetMemoryInfo_v2 through
nvidia-ml-py (`pynvml`, what monitoring code imports) when it is installed, else through ctypes
on libnvidia-ml.so.1 (the same two calls, found the way pynvml finds them: dlopen + dlsym).
Checks that both totals are --total and that used + free stay within it. Nothing here knows the
simulated node: the same file runs on a machine with a real GPU (scripts/gpu-proof.sh).
"""

import argparse
import ctypes
import sys

NVML_MEMORY_V2 = 2 << 24


class MemoryV1(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def with_pynvml():
    """(v1, v2) memory of GPU 0 through pynvml; None when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        return (v1.total, v1.free, v1.used), (v2.total, v2.free, v2.used)
    finally:
        pynvml.nvmlShutdown()


def with_ctypes():
    """(v1, v2) memory of GPU 0 through libnvidia-ml.so.1 itself."""
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    dev = ctypes.c_void_p()
    for what, r in [("nvmlInit_v2", nvml.nvmlInit_v2()),
                    ("nvmlDeviceGetHandleByIndex_v2",
                     nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)))]:
        if r != 0:
            raise RuntimeError(f"{what} failed: NVML error {r}")
    m1 = MemoryV1()
    r1 = nvml.nvmlDeviceGetMemoryInfo(dev, ctypes.byref(m1))
    m2 = MemoryV2(version=ctypes.sizeof(MemoryV2) | NVML_MEMORY_V2)
    r2 = nvml.nvmlDeviceGetMemoryInfo_v2(dev, ctypes.byref(m2))
    nvml.nvmlShutdown()
    if r1 != 0 or r2 != 0:
        raise RuntimeError(f"nvmlDeviceGetMemoryInfo: error {r1}, _v2: error {r2}")
    return (m1.total, m1.free, m1.used), (m2.total, m2.free, m2.used)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--total", type=int, required=True,
                   help="bytes NVML must show as GPU 0's total (the slice under gpufence)")
    a = p.parse_args()
    got = with_pynvml()
    via = "pynvml"
    if got is None:
        got, via = with_ctypes(), "ctypes"
    print(f"via {via}", flush=True)
    failures = []
    for name, (total, free, used) in zip(["nvml", "nvml_v2"], got):
        print(f"{name} {total} {free} {used}", flush=True)
        if total != a.total:
            failures.append(f"{name} total {total} != {a.total}")
        if free > total or used > total:
            failures.append(f"{name} free {free} or used {used} above the total {total}")
    if failures:
        print("verdict FAIL " + "; ".join(failures), flush=True)
        sys.exit(1)
    print("verdict ok", flush=True)


if __name__ == "__main__":
    main()
