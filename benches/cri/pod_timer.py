#!/usr/bin/env python3
"""Times whole pod starts through CRI: RunPodSandbox + CreateContainer + StartContainer, for the
handlers given, interleaved, one pod at a time (stopped and removed outside the timed region).

Usage: pod_timer.py SOCKET RUNS IMAGE [LABEL:]HANDLER[@SOCKET][=ANNOTATIONS_JSON] ...
Each arm runs on SOCKET unless it names its own (`@SOCKET`: another containerd in the same run).
Prints one line per arm: label, median ms, interquartile range, runs; and each arm against the
first arm, paired by round (the same round's pods run back to back): the median difference with
its 95 % confidence interval (distribution-free: the order statistics of the paired differences
that bracket their median with 95 % probability), and the median ratio. Each round starts at
another arm (round i runs the arms rotated by i), so no arm always follows the previous round's
teardown or always runs first.
Needs PyPI container-runtime-interface-api (cri_api) and grpcio (make deps: target/venv).
"""
import json
import statistics as st
import sys
import time

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pbg


def pod(rt, handler, ann, image, name):
    # "cdi_devices" (a list) is not an annotation: the CRI CDI devices of the container, as kubelet
    # passes a DRA claim's CDI ids or a device plugin's CDI devices.
    ann = dict(ann)
    cdi = ann.pop("cdi_devices", [])
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=name + "-uid", namespace="default", attempt=0),
        annotations=ann,
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE))
        ),
    )
    ctr = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="app", attempt=0),
        image=pb.ImageSpec(image=image),
        command=["/bin/sleep", "60"],
        CDI_devices=[pb.CDIDevice(name=n) for n in cdi],
    )
    t0 = time.perf_counter()
    sid = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg, runtime_handler=handler), timeout=60).pod_sandbox_id
    try:
        cid = rt.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=sid, config=ctr, sandbox_config=cfg), timeout=60
        ).container_id
        rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
        return (time.perf_counter() - t0) * 1000
    finally:
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=60)
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=60)


def median_ci(diffs):
    """The 95 % confidence interval of the median of `diffs`: the order statistics j and k with
    P(j <= rank of the median < k) >= 0.95 under the binomial(n, 1/2) (normal approximation,
    n >= 6); (nan, nan) for fewer."""
    n = len(diffs)
    if n < 6:
        return float("nan"), float("nan")
    d = sorted(diffs)
    half = 0.98 * n ** 0.5  # 1.96 * sqrt(n) / 2
    j = max(0, int(n / 2 - half))
    k = min(n - 1, int(-(-(n / 2 + half) // 1)))
    return d[j], d[k]


def main():
    sock, runs, image = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    arms, stubs = [], {}
    for a in sys.argv[4:]:
        spec, _, j = a.partition("=")
        label, _, spec = spec.rpartition(":") if ":" in spec.split("@")[0] else ("", "", spec)
        h, _, s = spec.partition("@")
        s = s or sock
        if s not in stubs:
            stubs[s] = pbg.RuntimeServiceStub(grpc.insecure_channel("unix://" + s))
        arms.append((label or a, h, json.loads(j) if j else {}, stubs[s]))
    times = {a: [] for a, _, _, _ in arms}
    for i in range(-1, runs):  # one warm-up round
        r = (i + 1) % len(arms)
        for n, (a, h, ann, rt) in (list(enumerate(arms))[r:] + list(enumerate(arms))[:r]):
            t = pod(rt, h, ann, image, f"bench-{n}-{h}-{i + 1}")
            if i >= 0:
                times[a].append(t)
    base = times[arms[0][0]]
    for a, _, _, _ in arms:
        xs = times[a]
        q = st.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
        diffs = [x - b for x, b in zip(xs, base)]
        paired = st.median(diffs)
        lo, hi = median_ci(diffs)
        ratio = st.median([x / b for x, b in zip(xs, base)])
        print(f"  {a:60s} median {st.median(xs):7.1f} ms (IQR {q[0]:.1f}-{q[2]:.1f}, {len(xs)} pods), "
              f"paired {paired:+.1f} ms (95% CI {lo:+.1f} to {hi:+.1f}), ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
