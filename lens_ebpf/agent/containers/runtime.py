"""Container metadata from containerd's state on the host, without its API.

containerd keeps each running task's OCI spec at
<state>/io.containerd.runtime.v2.task/<namespace>/<id>/config.json. From it this
module keeps only identity (CRI annotations or kubernetes labels) and the device
list; environment variables, mounts and the rest of the spec are never kept.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TASK_DIRS = ("io.containerd.runtime.v2.task", "io.containerd.runtime.v1.linux")
# (CRI annotation, kubernetes label) for each identity field
POD_NAME = ("io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name")
POD_NAMESPACE = ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace")
POD_UID = ("io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid")
CONTAINER_NAME = ("io.kubernetes.cri.container-name", "io.kubernetes.container.name")
CONTAINER_TYPE = "io.kubernetes.cri.container-type"
# a pod sandbox's (pause) container has no name of its own: the kubelet calls it "POD"
SANDBOX_NAME = "POD"


@dataclass(frozen=True)
class Device:
    path: str  # as the container sees it
    kind: str  # "c" or "b"
    major: int
    minor: int
    host_path: str = ""
    group: str = ""  # gpu, infiniband, or other


@dataclass
class ContainerInfo:
    id: str
    runtime_namespace: str
    pod_name: str = ""
    pod_namespace: str = ""
    pod_uid: str = ""
    name: str = ""
    sandbox: bool = False
    cgroup_path: str = ""
    pid: int = 0
    devices: list[Device] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The container label: its name; a sandbox's SANDBOX_NAME; else its id."""
        return self.name or (SANDBOX_NAME if self.sandbox else self.id)


def device_group(path: str) -> str:
    """Which device family a /dev path belongs to."""
    name = path.removeprefix("/dev/")
    if name.startswith("dri/card") or name.startswith("dri/renderD") or name == "kfd":
        return "gpu"
    if name.startswith("nvidia") and (name[6:].isdigit() or name[6:] in ("ctl", "-uvm")):
        return "gpu"
    if name.startswith("infiniband/"):
        return "infiniband"
    return "other"


def host_device_path(kind: str, major: int, minor: int, sysfs: Path = Path("/sys")) -> str:
    """The host's /dev path for major:minor, from /sys/dev/{char,block}/M:m/uevent."""
    sub = "char" if kind == "c" else "block"
    try:
        text = (sysfs / "dev" / sub / f"{major}:{minor}" / "uevent").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith("DEVNAME="):
            return "/dev/" + line.split("=", 1)[1]
    return ""


def _first(annotations: dict[str, Any], keys: tuple[str, str]) -> str:
    for k in keys:
        v = annotations.get(k)
        if isinstance(v, str) and v:
            return v
    return ""


def parse_spec(
    spec: dict[str, Any], cid: str, namespace: str, sysfs: Path = Path("/sys")
) -> ContainerInfo:
    """Identity and devices from an OCI spec; nothing else of it is kept."""
    ann = spec.get("annotations") or {}
    if not isinstance(ann, dict):
        ann = {}
    linux = spec.get("linux") or {}
    devices = []
    for d in linux.get("devices") or []:
        try:
            kind, major, minor = str(d.get("type", "c")), int(d["major"]), int(d["minor"])
            path = str(d["path"])
        except (KeyError, TypeError, ValueError):
            continue
        host = host_device_path(kind, major, minor, sysfs)
        group = device_group(host or path)
        devices.append(Device(path, kind, major, minor, host, group))
    return ContainerInfo(
        id=cid,
        runtime_namespace=namespace,
        pod_name=_first(ann, POD_NAME),
        pod_namespace=_first(ann, POD_NAMESPACE),
        pod_uid=_first(ann, POD_UID),
        name=_first(ann, CONTAINER_NAME),
        sandbox=ann.get(CONTAINER_TYPE) == "sandbox",
        cgroup_path=str(linux.get("cgroupsPath") or ""),
        devices=devices,
    )


class ContainerdState:
    """Running containers read from containerd's state directory, cached by mtime."""

    def __init__(self, state_dir: Path = Path("/run/containerd"), sysfs: Path = Path("/sys")):
        self.state_dir = state_dir
        self.sysfs = sysfs
        self._cache: dict[Path, tuple[float, ContainerInfo]] = {}

    def scan(self) -> dict[str, ContainerInfo]:
        """container id -> info for every task directory present now."""
        out: dict[str, ContainerInfo] = {}
        seen: set[Path] = set()
        for task_dir in TASK_DIRS:
            root = self.state_dir / task_dir
            if not root.is_dir():
                continue
            for ns_dir in root.iterdir():
                if not ns_dir.is_dir():
                    continue
                for cdir in ns_dir.iterdir():
                    info = self._read(cdir, ns_dir.name)
                    if info is not None:
                        seen.add(cdir)
                        out[info.id] = info
        for stale in set(self._cache) - seen:
            del self._cache[stale]
        return out

    def _read(self, cdir: Path, namespace: str) -> ContainerInfo | None:
        spec_path = cdir / "config.json"
        try:
            mtime = spec_path.stat().st_mtime
        except OSError:
            return None
        cached = self._cache.get(cdir)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            spec = json.loads(spec_path.read_text())
        except (OSError, ValueError) as exc:
            log.debug("containerd spec %s unreadable: %s", spec_path, exc)
            return None
        info = parse_spec(spec, cdir.name, namespace, self.sysfs)
        try:
            info.pid = int((cdir / "init.pid").read_text().strip())
        except (OSError, ValueError):
            info.pid = 0
        self._cache[cdir] = (mtime, info)
        return info
