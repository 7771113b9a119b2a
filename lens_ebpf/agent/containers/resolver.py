"""cgroup id -> cgroup path -> container -> pod: the container half of enrichment."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from lens_ebpf.agent.containers.cgroups import CgroupIndex, CgroupRef, parse_cgroup
from lens_ebpf.agent.containers.runtime import ContainerdState, ContainerInfo


def systemd_cgroup_path(cgroups_path: str) -> str:
    """'slice:prefix:name' (runc's systemd driver) -> the cgroup path it makes."""
    parts = cgroups_path.split(":")
    if len(parts) != 3:
        return cgroups_path
    slice_name, prefix, name = parts
    nested = ""
    acc = ""
    for piece in slice_name.removesuffix(".slice").split("-"):
        acc = f"{acc}-{piece}" if acc else piece
        nested += f"/{acc}.slice"
    return f"{nested}/{prefix}-{name}.scope"


# How long a container that exited still names its events: a program may hold records
# back for one batch (proc_events.c wakes its reader once per batch for cgroups it has
# named), and the runtime's directory goes the moment the container ends.
KEEP_EXITED_SECONDS = 60.0


class ContainerResolver:
    """cgroup id -> cgroup path -> container id -> container and pod identity."""

    def __init__(
        self,
        index: CgroupIndex,
        state: ContainerdState,
        min_rescan: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        keep_exited: float = KEEP_EXITED_SECONDS,
    ) -> None:
        self.index = index
        self.state = state
        self.containers: dict[str, ContainerInfo] = {}
        # container id -> (when the runtime no longer listed it, what it was), oldest first
        self._exited: dict[str, tuple[float, ContainerInfo]] = {}
        self._keep_exited = keep_exited
        self._min_rescan = min_rescan
        self._clock = clock
        self._last = -1e9
        self._lock = threading.Lock()
        self._missed: set[int] = set()  # cgroup ids a runtime scan was already done for
        self._indexed: set[str] = set()  # containers whose cgroup is in the index
        # cgroup id -> its path as the kernel recorded it when a record named it
        # (proc_events.c's cgroup_paths), for a cgroup gone before it could be indexed
        self.kernel_path: Callable[[int], str | None] = lambda cgroup_id: None
        # told of every change, whichever path (read loop or a lookup miss) found it
        self.on_change: Callable[[list[ContainerInfo], list[ContainerInfo]], None] = (
            lambda started, exited: None
        )

    def refresh(self) -> tuple[list[ContainerInfo], list[ContainerInfo]]:
        """Rescan the runtime; (started, exited) since the last scan."""
        with self._lock:
            now = self.state.scan()
            started = [c for cid, c in now.items() if cid not in self.containers]
            exited = [c for cid, c in self.containers.items() if cid not in now]
            # Index each container's cgroup before anyone sees it listed: a short-lived
            # process (and its cgroup) may be gone before its events are read. runc
            # makes the cgroup after the spec is written, so this is tried again.
            for c in now.values():
                if (
                    c.cgroup_path
                    and c.id not in self._indexed
                    and self.index.remember(systemd_cgroup_path(c.cgroup_path)) is not None
                ):
                    self._indexed.add(c.id)
            self._indexed &= set(now)
            self.containers = now
            self._last = self._clock()
            for c in started:
                self._exited.pop(c.id, None)
            for c in exited:
                self._exited[c.id] = (self._last, c)
            while self._exited:
                oldest = next(iter(self._exited))
                if self._last - self._exited[oldest][0] <= self._keep_exited:
                    break
                del self._exited[oldest]
        if started or exited:
            self.on_change(started, exited)
        return started, exited

    def resolve(self, cgroup_id: int) -> tuple[CgroupRef, ContainerInfo | None]:
        path = self.index.path(cgroup_id, rescan=False) if cgroup_id else None
        if path is None and cgroup_id:
            # a cgroup not seen yet is most often a new container's: the runtime scan
            # indexes its cgroup with one stat, before a full walk of the hierarchy
            if cgroup_id not in self._missed or self._clock() - self._last > self._min_rescan:
                self._missed.add(cgroup_id)
                self.refresh()
            path = self.index.path(cgroup_id, rescan=False)
            if path is None and (path := self.kernel_path(cgroup_id)) is not None:
                # a container gone before its cgroup could be indexed: the kernel's names
                self.index.learn(cgroup_id, path)
            if path is None:
                path = self.index.path(cgroup_id)
        ref = parse_cgroup(path or "/")
        if not ref.container_id:
            return ref, None
        info = self.container(ref.container_id)
        if info is None and self._clock() - self._last > self._min_rescan:
            self.refresh()
            info = self.container(ref.container_id)
        return ref, info

    def container(self, container_id: str) -> ContainerInfo | None:
        """A running container, or one that exited in the last keep_exited seconds."""
        info = self.containers.get(container_id)
        if info is None:
            gone = self._exited.get(container_id)
            info = gone[1] if gone is not None else None
        return info

    def settled(self, cgroup_id: int, ref: CgroupRef, info: ContainerInfo | None) -> bool:
        """Whether what resolve gave for this cgroup is final: its path is known, and it
        is no container's or its container is known (a later lookup gives the same)."""
        known = self.index.path(cgroup_id, rescan=False) is not None
        return known and (not ref.container_id or info is not None)


def identity(ref: CgroupRef, info: ContainerInfo | None) -> dict[str, str]:
    """Event fields naming the container and pod; empty strings for the host."""
    if info is None:
        # a kubepods cgroup we have no runtime record of still names its container
        # (a pod's cgroup: its leaf is the container's id, whatever the runtime)
        return {
            "container_id": ref.container_id if ref.runtime or ref.pod_uid else "",
            "container": "",
            "pod": "",
            "namespace": "",
            "pod_uid": ref.pod_uid,
        }
    return {
        "container_id": info.id,
        "container": info.label,
        "pod": info.pod_name,
        "namespace": info.pod_namespace,
        "pod_uid": info.pod_uid or ref.pod_uid,
    }
