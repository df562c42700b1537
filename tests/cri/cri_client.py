#!/usr/bin/env python3
"""A minimal CRI client (what the kubelet does for one pod), for gpufence's containerd e2e test.

Usage: cri_client.py REQUEST_JSON | -   (-: the request on stdin)
REQUEST_JSON: {"socket": "/path/containerd.sock", "handler": "gpufence", "dir": "/scratch",
               "name": "pod1", "pod_annotations": {...}, "pod_labels": {...},
               "container_annotations": {...},
               "image": "localhost/pause:test", "command": ["/bin/sh", "-c", "..."],
               "envs": {"K": "V"}, "timeout": 20, "wait_before_create": "/path/gate",
               "cdi_devices": ["vendor/class=name"],
               "devices": [{"container_path": "/dev/x", "host_path": "/dev/x", "permissions": "rw"}],
               "mounts": [{"container_path": "/opt/x", "host_path": "/opt/x", "readonly": true}]}
"started_file": created once StartContainer returned. "finished_at" (answer): when the
container exited, ns since the epoch.
cdi_devices and devices: what kubelet passes for a device plugin's CDI devices and DeviceSpecs
and a DRA claim's CDI ids (CRI ContainerConfig.CDI_devices and .devices; a device's paths may
also be given as "container"/"host"). While the container runs, a runtime that goes away (a
restart) is waited for until the timeout.
Prints one JSON object: {"stage": "done"|"<failed stage>", "error": "...", "exit_code": N,
                         "log": "<container output>", "sandbox_id": ..., "container_id": ...}
The pod is stopped and removed before exiting, whatever happened.
Needs PyPI container-runtime-interface-api (cri_api) and grpcio.
"""
import json
import os
import sys
import time

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pbg


def main():
    # "-": the request on stdin (one larger than an argument may be).
    req = json.loads(sys.stdin.read() if sys.argv[1] == "-" else sys.argv[1])
    chan = grpc.insecure_channel("unix://" + req["socket"])
    rt = pbg.RuntimeServiceStub(chan)
    timeout = req.get("timeout", 20)
    out = {"stage": "version", "error": "", "exit_code": None, "log": ""}
    sandbox_id = None
    try:
        v = rt.Version(pb.VersionRequest(), timeout=timeout)
        out["runtime"] = f"{v.runtime_name} {v.runtime_version}"
        name = req.get("name", "pod")
        # As containerd sees it; "root": where containerd's root directory is from here (a
        # containerd chrooted into a test's host root).
        log_dir = os.path.join(req["dir"], "pod-logs", name)
        os.makedirs(req.get("root", "") + log_dir, exist_ok=True)
        # kubelet's identity labels (CRI-O names containers to NRI and hooks.d by them)
        labels = {"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "default",
                  "io.kubernetes.pod.uid": name + "-uid"}
        pod_labels = dict(labels, **req.get("pod_labels", {}))
        pod_cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=name + "-uid", namespace="default", attempt=0),
            labels=pod_labels,
            log_directory=log_dir,
            annotations=req.get("pod_annotations", {}),
            linux=pb.LinuxPodSandboxConfig(
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.NODE)
                )
            ),
        )
        out["stage"] = "run_pod_sandbox"
        sandbox_id = rt.RunPodSandbox(
            pb.RunPodSandboxRequest(config=pod_cfg, runtime_handler=req["handler"]), timeout=timeout
        ).pod_sandbox_id
        out["sandbox_id"] = sandbox_id

        # "wait_before_create": a path; with the sandbox running, create "<path>.ready" and wait
        # (up to the timeout) for the test to create <path> before creating the container.
        gate = req.get("wait_before_create")
        if gate:
            open(gate + ".ready", "w").close()
            deadline = time.time() + timeout
            while not os.path.exists(gate) and time.time() < deadline:
                time.sleep(0.05)

        ctr_cfg = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="app", attempt=0),
            labels=dict(labels, **{"io.kubernetes.container.name": "app"}),
            # what kubelet sends (CRI-O refuses a container without the user's image name)
            image=pb.ImageSpec(image=req["image"], user_specified_image=req["image"]),
            command=req["command"],
            envs=[pb.KeyValue(key=k, value=v) for k, v in req.get("envs", {}).items()],
            annotations=req.get("container_annotations", {}),
            log_path="app.log",
            devices=[
                pb.Device(
                    container_path=d.get("container_path", d.get("container")),
                    host_path=d.get("host_path", d.get("host")),
                    permissions=d.get("permissions", "rw"),
                )
                for d in req.get("devices", [])
            ],
            CDI_devices=[pb.CDIDevice(name=n) for n in req.get("cdi_devices", [])],
            mounts=[
                pb.Mount(
                    container_path=m["container_path"],
                    host_path=m["host_path"],
                    readonly=m.get("readonly", True),
                )
                for m in req.get("mounts", [])
            ],
        )
        out["stage"] = "create_container"
        cid = rt.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=ctr_cfg, sandbox_config=pod_cfg),
            timeout=timeout,
        ).container_id
        out["container_id"] = cid
        out["stage"] = "start_container"
        rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=timeout)
        if req.get("started_file"):  # tells the test StartContainer returned
            open(req["started_file"], "w").close()
        out["stage"] = "wait"
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                st = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=timeout).status
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                time.sleep(0.2)  # the runtime restarts
                continue
            if st.state == pb.CONTAINER_EXITED:
                out["exit_code"] = st.exit_code
                out["finished_at"] = st.finished_at  # ns since the epoch
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("container did not exit in time")
        with open(os.path.join(req.get("root", "") + log_dir, "app.log")) as f:
            # CRI log lines: "<time> <stream> <tag> <message>"
            out["log"] = "".join(l.split(" ", 3)[3] if l.count(" ") >= 3 else l for l in f)
        out["stage"] = "done"
    except grpc.RpcError as e:
        out["error"] = e.details() or str(e)
    except Exception as e:  # noqa: BLE001 - reported to the Rust test as data
        out["error"] = repr(e)
    finally:
        if sandbox_id:
            try:
                rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=timeout, wait_for_ready=True)
                rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=timeout)
            except grpc.RpcError as e:
                out["cleanup_error"] = e.details()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
