"""lens-ebpf's own test device plugin: amd.com/gpu over the kubelet's device plugin API
v1beta1, offering the GPUs of a sysfs tree (the fixtures'), for a real kubelet in the lab.

Device IDs are PCI addresses (0000:c1:00.0), as AMD's plugin reports them and as the agent
keys GPU readings and PodResources owners. Allocate gives each container /dev/kfd and the
card and render nodes of its GPUs, read-write, and no environment, as AMD's plugin does;
the lab makes those nodes (host_nodes(), containerlab.make_char_device).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from lens_ebpf.k8s.gen import deviceplugin_v1beta1_pb2 as pb
from lens_ebpf.k8s.gen import deviceplugin_v1beta1_pb2_grpc as pb_grpc

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
DRM_MAJOR = 226  # cardN has minor N, renderDN minor N
CARD = re.compile(r"^card\d+$")
NODE_MINOR = re.compile(r"^\D+")  # card1 -> 1, renderD128 -> 128


@dataclass(frozen=True)
class AmdGpu:
    bdf: str  # the device ID
    card: str  # host path, /dev/dri/card1
    render: str  # /dev/dri/renderD128

    def host_nodes(self) -> list[tuple[str, int, int]]:
        """(path, major, minor) of its card and render nodes."""
        paths = (self.card, self.render)
        return [(p, DRM_MAJOR, int(NODE_MINOR.sub("", Path(p).name))) for p in paths]


def sysfs_gpus(sysfs: Path, dev: Path) -> list[AmdGpu]:
    """amdgpu cards under sysfs class/drm, each with the render node in its drm directory or,
    where the tree has none (the fixtures), the one dev's dri/by-path links name."""
    out = []
    for card in sorted((sysfs / "class" / "drm").glob("card*")):
        try:
            text = (card / "device" / "uevent").read_text()
        except OSError:
            continue
        uevent = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        if not CARD.match(card.name) or uevent.get("DRIVER") != "amdgpu":
            continue
        bdf = uevent["PCI_SLOT_NAME"].lower()
        renders = sorted(p.name for p in (card / "device" / "drm").glob("renderD*"))
        link = dev / "dri" / "by-path" / f"pci-{bdf}-render"
        if not renders and link.is_symlink():
            renders = [Path(os.readlink(link)).name]
        if renders:
            out.append(AmdGpu(bdf, f"/dev/dri/{card.name}", f"/dev/dri/{renders[0]}"))
    return out


class AmdGpuPlugin(pb_grpc.DevicePluginServicer):
    """Serves DevicePlugin on <root>/device-plugins/<socket_name> and registers with the
    kubelet there; again whenever kubelet.sock is re-created (a starting kubelet empties the
    directory, so the plugin's own socket is served anew first)."""

    def __init__(
        self,
        gpus: Iterable[AmdGpu],
        resource: str = "amd.com/gpu",
        socket_name: str = "lens-amdgpu.sock",
        kfd: str | None = "/dev/kfd",
        poll_seconds: float = 0.2,
    ) -> None:
        self.gpus = {g.bdf: g for g in gpus}
        self.resource, self.socket_name, self.kfd = resource, socket_name, kfd
        self.poll_seconds = poll_seconds
        self.health = dict.fromkeys(self.gpus, HEALTHY)
        self.allocate_calls = 0  # Allocate RPCs, failed ones included
        self.allocated: list[list[str]] = []  # device IDs of each container answered
        self.registrations = 0
        self.last_error = ""
        self.dir = Path()
        self._cond = threading.Condition()
        self._version = 0  # bumped on a health change; ListAndWatch sends on each
        self._stop = threading.Event()
        self._server: grpc.Server | None = None
        self._watcher: threading.Thread | None = None
        self._registered_with: tuple[int, int] | None = None  # kubelet.sock's inode, ctime

    @property
    def socket(self) -> Path:
        return self.dir / self.socket_name

    def host_nodes(self) -> list[tuple[str, int, int]]:
        """The DRM nodes Allocate hands out, to be made on the host. Not /dev/kfd: its major
        is dynamic (/sys/class/kfd/kfd/dev); make one or construct with kfd=None."""
        return [n for g in self.gpus.values() for n in g.host_nodes()]

    def start(self, kubelet_root_dir: str | Path) -> None:
        self.dir = Path(kubelet_root_dir) / "device-plugins"
        self._stop.clear()
        self._serve()
        self._sync()
        self._watcher = threading.Thread(target=self._watch, name="deviceplugin", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)

    def wait_registered(self, count: int = 1, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.registrations < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.registrations} registrations: {self.last_error}")
            time.sleep(0.05)

    def set_health(self, bdf: str, healthy: bool) -> None:
        with self._cond:
            self.health[bdf] = HEALTHY if healthy else UNHEALTHY
            self._version += 1
            self._cond.notify_all()

    def _serve(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        self._server.start()

    def _sync(self) -> None:
        if not self.socket.exists():
            self._serve()
            self._registered_with = None
        try:
            st = (self.dir / KUBELET_SOCKET).stat()
        except OSError:
            return
        if (st.st_ino, st.st_ctime_ns) == self._registered_with:
            return
        options = pb.DevicePluginOptions(get_preferred_allocation_available=True)
        req = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_name,
            resource_name=self.resource,
            options=options,
        )
        try:
            with grpc.insecure_channel(f"unix://{self.dir / KUBELET_SOCKET}") as ch:
                pb_grpc.RegistrationStub(ch).Register(req, timeout=5)
        except grpc.RpcError as exc:
            self.last_error = f"Register: {exc}"
            return
        self._registered_with = (st.st_ino, st.st_ctime_ns)
        self.registrations += 1
        self.last_error = ""

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self._sync()

    # -- DevicePlugin ------------------------------------------------------------
    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        sent = -1
        while not self._stop.is_set() and context.is_active():
            with self._cond:
                if sent == self._version:
                    self._cond.wait(0.5)
                    continue
                sent = self._version
                devices = [pb.Device(ID=i, health=h) for i, h in sorted(self.health.items())]
            yield pb.ListAndWatchResponse(devices=devices)

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        out = []
        for r in request.container_requests:
            ids = list(r.must_include_deviceIDs)
            ids += [i for i in sorted(r.available_deviceIDs) if i not in ids]
            out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids[: r.allocation_size]))
        return pb.PreferredAllocationResponse(container_responses=out)

    def Allocate(self, request: Any, context: Any) -> Any:
        with self._cond:
            self.allocate_calls += 1
        wanted = [list(r.devices_ids) for r in request.container_requests]
        unknown = sorted({i for ids in wanted for i in ids} - self.gpus.keys())
        if unknown:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown device IDs: {', '.join(unknown)}")
        out = []
        for ids in wanted:
            paths = [self.kfd] if self.kfd else []
            paths += [p for i in ids for p in (self.gpus[i].card, self.gpus[i].render)]
            specs = [pb.DeviceSpec(container_path=p, host_path=p, permissions="rw") for p in paths]
            out.append(pb.ContainerAllocateResponse(devices=specs))
        with self._cond:
            self.allocated += wanted
        return pb.AllocateResponse(container_responses=out)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()
