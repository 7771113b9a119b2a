"""The kubelet's PodResources API (gRPC v1 List on a unix socket): which pod and
container each GPU was allocated to, by the device IDs device plugins report.

NVIDIA's plugin reports GPU UUIDs (GPU-..., with a ::N suffix under time-slicing);
AMD's reports PCI addresses (0000:c1:00.0). A node with no kubelet socket has no
data, quietly.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.core import Metric

from lens_ebpf.agent.config import KubernetesConfig
from lens_ebpf.core.collector import CollectorError, PeriodicCollector
from lens_ebpf.core.exposition import gauge

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceOwner:
    resource: str
    namespace: str
    pod: str
    container: str

    def labels(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container}


def device_key(device_id: str) -> str:
    """The form GPU readings are matched on: lower case, time-slicing replica dropped."""
    return device_id.split("::", 1)[0].strip().lower()


def device_owners(resp: Any, resources: Iterable[str]) -> dict[str, DeviceOwner]:
    """device key -> owner from a ListPodResourcesResponse, for the given resources."""
    wanted = set(resources)
    out: dict[str, DeviceOwner] = {}
    for p in resp.pod_resources:
        for c in p.containers:
            for d in c.devices:
                if d.resource_name not in wanted:
                    continue
                for dev in d.device_ids:
                    out[device_key(dev)] = DeviceOwner(d.resource_name, p.namespace, p.name, c.name)
    return out


class PodResourcesCollector(PeriodicCollector):
    """Polls List; exposes lens_k8s_device_allocated and the mapping for GPU labels."""

    name = "pod_resources"

    def __init__(
        self, interval: float, socket: str, timeout: float, resources: Iterable[str]
    ) -> None:
        super().__init__(interval)
        self.socket = socket
        self.timeout = timeout
        self.resources = list(resources)
        self.assigned: dict[str, DeviceOwner] = {}
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._chan_lock = threading.Lock()

    @classmethod
    def from_config(cls, k: KubernetesConfig) -> PodResourcesCollector:
        """From the config's kubernetes section (its pod_resources and the kubelet's GPU
        resource names)."""
        pr = k.pod_resources
        return cls(pr.interval_seconds, pr.socket, pr.timeout_seconds, k.kubelet.gpu_resources)

    def _list(self) -> Any:
        from lens_ebpf.k8s.gen import podresources_v1_pb2 as pb
        from lens_ebpf.k8s.gen import podresources_v1_pb2_grpc as pb_grpc

        with self._chan_lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(f"unix://{self.socket}")
                self._stub = pb_grpc.PodResourcesListerStub(self._channel)
            stub = self._stub
        return stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout)

    def refresh(self) -> list[Metric]:
        if not Path(self.socket).exists():
            log.debug("no PodResources socket at %s", self.socket)
            self.assigned = {}
            return []
        try:
            resp = self._list()
        except grpc.RpcError as exc:
            self.assigned = {}  # stale owners would label GPUs wrongly
            code = exc.code() if hasattr(exc, "code") else None
            name = code.name.lower() if code is not None else "rpc"
            raise CollectorError(name, f"PodResources List on {self.socket}: {name}") from None
        self.assigned = device_owners(resp, self.resources)
        m = gauge(
            "lens_k8s_device_allocated", "Devices the kubelet allocated to a container (value 1)"
        )
        for dev, owner in sorted(self.assigned.items()):
            labels = {"resource": owner.resource, "device_id": dev, **owner.labels()}
            m.add(labels, 1)
        return [m]

    def close(self) -> None:
        with self._chan_lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._stub = None
