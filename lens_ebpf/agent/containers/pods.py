"""What the container runtime says, as the node exporter showed it: /pods (each
container with the GPUs and RDMA devices it was given), container_start and
container_exit events, and the running count. No BPF: the container_runtime feature
serves these wherever the runtime's state can be read."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.agent.containers.runtime import ContainerInfo
from lens_ebpf.agent.events import ContainerChange
from lens_ebpf.core.exposition import gauge

GPU_NODE = re.compile(r"^/dev/(dri/(card|renderD)\d+|nvidia\d+)$")
UVERBS = re.compile(r"^/dev/infiniband/uverbs\d+$")


def container_event(kind: str, c: ContainerInfo) -> ContainerChange:
    return ContainerChange(
        kind=kind,
        ts_ns=time.clock_gettime_ns(time.CLOCK_MONOTONIC),
        container_id=c.id,
        container=c.label,
        pod=c.pod_name,
        namespace=c.pod_namespace,
        pod_uid=c.pod_uid,
        devices=tuple(d.host_path or d.path for d in c.devices),
    )


def pods_view(
    containers: dict[str, ContainerInfo],
    gpus: dict[str, dict[str, Any]] | None = None,
    rdma: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """/pods in the node exporter's shape: each container with the GPUs and RDMA devices
    it was given. gpus and rdma map a host device path to the device behind it (the GPU
    and RDMA collectors' views); a node neither knows keeps id -1. Shared control nodes
    (/dev/kfd, /dev/nvidiactl, /dev/infiniband/rdma_cm, ...) go under control_devices."""
    out = []
    for c in sorted(containers.values(), key=lambda c: c.id):
        if c.sandbox:
            continue
        gpu_nodes, ib, control = [], [], []
        for d in c.devices:
            if d.group == "gpu" and GPU_NODE.match(d.host_path or d.path):
                gpu_nodes.append(d)
            elif d.group == "infiniband" and UVERBS.match(d.host_path or d.path):
                known = (rdma or {}).get(d.host_path or d.path)
                ib.append(
                    {
                        **(known or {"name": "", "id": -1, "kind": "RDMA", "uuid": ""}),
                        "path": d.path,
                        "host_path": d.host_path,
                        "major": d.major,
                        "minor": d.minor,
                    }
                )
            elif d.group in ("gpu", "infiniband"):
                control.append(d.path)
        out.append(
            {
                "id": c.id,
                "pod_name": c.pod_name,
                "pod_namespace": c.pod_namespace,
                "pod_uuid": c.pod_uid,
                "devices": {"gpu": pod_gpus(gpu_nodes, gpus or {}), "infiniband": ib},
                # lens-ebpf's additions
                "container_name": c.name,
                "control_devices": control,
            }
        )
    return out


def pod_gpus(devices: list[Any], nodes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A container's GPU device nodes as /pods entries: one per GPU (the card node's path
    when the container has it); a node no GPU reading explains keeps id -1."""
    by_gpu: dict[tuple[str, int], dict[str, Any]] = {}
    out = []
    for d in devices:
        host = d.host_path or d.path
        known = nodes.get(host)
        extra = {"host_path": d.host_path, "major": d.major, "minor": d.minor}
        if known is None:
            out.append(
                {
                    "name": "",
                    "id": -1,
                    "path": d.path,
                    "kind": "GPU",
                    "uuid": "",
                    "serial": "",
                    "slot": "",
                    "vendor": "",
                    **extra,
                }
            )
            continue
        key = (known["vendor"], known["id"])
        entry = by_gpu.get(key)
        if entry is None:
            entry = by_gpu[key] = {**known, "path": d.path, **extra}
            out.append(entry)
        elif "card" in d.path and "card" not in entry["path"]:
            entry.update(path=d.path, **extra)
    return out


class ContainersCollector(Collector):
    def __init__(self, containers: Callable[[], dict[str, ContainerInfo]]) -> None:
        self._containers = containers

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        running = gauge("lens_containers_running", "Containers the runtime reports")
        running.add({}, len(self._containers()))
        yield running
