"""pid -> cgroup -> container: /proc/<pid>/cgroup parsing (pure) and a cgroup-id index.

Layouts recognised (cgroup v1 and v2):
  kubepods, systemd driver: /kubepods.slice/kubepods-burstable.slice/
      kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope
      (crio-<id>.scope for CRI-O, docker-<id>.scope for dockershim)
  kubepods, cgroupfs driver: /kubepods/burstable/pod<uid>/<id>, /kubepods/pod<uid>/<id>
      (under the kubelet's cgroupRoot, if it has one: /<root>/kubepods/...)
  Docker: /docker/<id>, /system.slice/docker-<id>.scope
  containerd without Kubernetes (ctr): /<containerd namespace>/<id>
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_SCOPE = re.compile(r"^(cri-containerd|crio|docker|libpod)-([0-9a-f]{12,64})\.scope$")
RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker", "libpod": "podman"}
_CONMON = re.compile(r"^crio-conmon-")
_POD = re.compile(r"^(?:kubepods-(?:burstable-|besteffort-)?)?pod([0-9a-f_-]{36})(?:\.slice)?$")
_HEX_ID = re.compile(r"^[0-9a-f]{64}$")
QOS = {"burstable": "burstable", "besteffort": "besteffort"}


@dataclass(frozen=True)
class CgroupRef:
    """What a cgroup path says about its container."""

    path: str
    container_id: str = ""
    runtime: str = ""  # containerd, cri-o, docker, or "" when only the runtime can confirm
    pod_uid: str = ""
    qos: str = ""
    runtime_namespace: str = ""  # containerd's namespace for ctr's /<ns>/<id> layout


def cgroup_path(proc_cgroup: str) -> str:
    """The cgroup path of a process from /proc/<pid>/cgroup text (v2 line first)."""
    v1 = ""
    for line in proc_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "" and path not in ("", "/"):
            return path
        if not v1 and ("name=systemd" in controllers or "memory" in controllers.split(",")):
            v1 = path
    return v1 or "/"


def parse_cgroup(path: str) -> CgroupRef:
    """Container id, pod uid and QoS class named by a cgroup path, if any."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return CgroupRef(path)
    pod_uid, qos = "", ""
    for p in parts:
        m = _POD.match(p)
        if m:
            pod_uid = m.group(1).replace("_", "-")
        for word, cls in QOS.items():
            # cgroupfs driver: /kubepods/burstable/...; systemd: kubepods-burstable.slice
            if p == word or p.startswith(f"kubepods-{word}"):
                qos = cls
    if not qos and any(p.startswith("kubepods") for p in parts):  # below a cgroupRoot too
        qos = "guaranteed" if pod_uid else ""
    last = parts[-1]
    if _CONMON.match(last):
        return CgroupRef(path, pod_uid=pod_uid, qos=qos)
    m = _SCOPE.match(last)
    if m:
        return CgroupRef(path, m.group(2), RUNTIMES[m.group(1)], pod_uid, qos)
    if pod_uid and _HEX_ID.match(last):
        return CgroupRef(path, last, "", pod_uid, qos)
    if len(parts) == 2 and parts[0] == "docker" and _HEX_ID.match(last):
        return CgroupRef(path, last, "docker")
    if len(parts) == 2 and not parts[0].endswith((".slice", ".scope")):
        # ctr's /<namespace>/<id>: only the runtime's state can confirm it
        return CgroupRef(path, last, "", runtime_namespace=parts[0])
    return CgroupRef(path, pod_uid=pod_uid, qos=qos)


def kernel_path(names: list[bytes], levels: int, complete: bool) -> str | None:
    """A cgroup's path from proc_events.c's cgroup_paths entry: each name a NUL-ended
    slot, from the cgroup up to its hierarchy's root (whose own name is empty), levels
    of them written; None where the root was not reached or a name may be cut short."""
    if not complete or not 0 < levels <= len(names):
        return None
    parts = []
    for slot in names[:levels]:
        name = slot.split(b"\0", 1)[0]
        if len(name) >= len(slot) - 1:  # the kernel's copy stops a byte short of the slot
            return None
        parts.append(name.decode(errors="replace"))
    if parts[-1]:  # not a hierarchy's root
        return None
    return "/" + "/".join(reversed(parts[:-1]))


def cgroup2_root(mountinfo: str) -> str | None:
    """Where the cgroup v2 hierarchy is mounted, from /proc/self/mountinfo."""
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ")[0] == "cgroup2":
            return left.split()[4]
    return None


class CgroupIndex:
    """cgroup id (the v2 directory's inode, as bpf_get_current_cgroup_id gives) -> path."""

    def __init__(self, root: Path | None, min_rescan: float = 1.0) -> None:
        self.root = root
        self._paths: dict[int, str] = {}
        self._lock = threading.Lock()
        self._min_rescan = min_rescan
        self._last_scan = 0.0

    @classmethod
    def for_host(cls, proc: Path = Path("/proc")) -> CgroupIndex:
        try:
            root = cgroup2_root((proc / "self" / "mountinfo").read_text())
        except OSError:
            root = None
        return cls(Path(root) if root else None)

    def scan(self) -> None:
        if self.root is None:
            return
        found: dict[int, str] = {}
        for dirpath, _dirs, _files in os.walk(self.root):
            try:
                found[os.stat(dirpath).st_ino] = "/" + os.path.relpath(dirpath, self.root)
            except OSError:
                continue
        found[os.stat(self.root).st_ino] = "/"
        with self._lock:
            self._paths.update(found)
            self._last_scan = time.monotonic()

    def remember(self, path: str) -> int | None:
        """Index one cgroup path now (a container's, seen at start), before it can vanish."""
        if self.root is None:
            return None
        try:
            ino = os.stat(self.root / path.lstrip("/")).st_ino
        except OSError:
            return None
        with self._lock:
            self._paths[ino] = path if path.startswith("/") else "/" + path
        return ino

    def learn(self, cgroup_id: int, path: str) -> None:
        """Index a path found another way (the kernel's record of a cgroup now gone)."""
        with self._lock:
            self._paths.setdefault(cgroup_id, path)

    def path(self, cgroup_id: int, rescan: bool = True) -> str | None:
        """The path of a cgroup id; on a miss, walk the hierarchy again (at most 1/s)."""
        with self._lock:
            got = self._paths.get(cgroup_id)
        if got is None and rescan and time.monotonic() - self._last_scan > self._min_rescan:
            self.scan()
            with self._lock:
                got = self._paths.get(cgroup_id)
        return got
