"""Enrichment: the one stage between the decoders and the cache and bus.

IP -> pod/service/workload comes from the cluster index, pid and cgroup -> container ->
pod from the container runtime's state. Built before any program starts; standalone, the
index is empty (None) and every flow keeps the class its policy gave it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from lens_ebpf.agent.containers.cgroups import CgroupIndex, cgroup_path, parse_cgroup
from lens_ebpf.agent.containers.resolver import ContainerResolver, identity
from lens_ebpf.agent.containers.runtime import ContainerdState
from lens_ebpf.agent.events import FlowClosed
from lens_ebpf.agent.net import identity as remote_identity

# How many cgroups' final answers Enrichment.cgroup keeps, the oldest going first (the
# default of proc_events.c's known_cgroups, bpf.max_known_cgroups: a cache apart from it,
# whose misses cost one lookup again)
SETTLED = 4096


class Enrichment:
    """Who is behind an address, a process or a cgroup, as far as this node knows."""

    def __init__(
        self, containers: ContainerResolver | None = None, procfs_root: Path = Path("/proc")
    ) -> None:
        self.containers = containers
        self.procfs_root = procfs_root
        self.index: Any = None  # k8s.index.ClusterIndex once the API answers; None standalone
        # cgroup id -> (path, identity) of cgroups whose answer is final, oldest first
        self._settled: dict[int, tuple[str, dict[str, str]]] = {}

    @classmethod
    def for_node(cls, procfs_root: Path, sysfs_root: Path, containerd_state: Path) -> Enrichment:
        """The node's cgroups and container runtime; no cluster index yet."""
        state = ContainerdState(containerd_state, sysfs_root)
        return cls(ContainerResolver(CgroupIndex.for_host(procfs_root), state), procfs_root)

    @property
    def lookup(self) -> remote_identity.Lookup | None:
        return self.index.lookup if self.index is not None else None

    def flow_key(self, key_labels: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """A map key's labels with the class refined, and the remote's identity labels:
        the metric path's identity, from the same index as the event path's (flow)."""
        return remote_identity.refine(self.lookup, key_labels)

    def flow(self, ev: FlowClosed) -> FlowClosed:
        """A closed flow with its remote's identity, and the local pod when a pod holds it."""
        lookup = self.lookup
        if lookup is None:
            return ev
        return dataclasses.replace(
            ev, **remote_identity.flow_fields(lookup, ev.cls, ev.raddr, ev.laddr)
        )

    def cgroup(self, cgroup_id: int) -> tuple[str, dict[str, str], bool]:
        """A cgroup's path, its container, pod and owner workload (empty: the host), and
        whether that is final (ContainerResolver.settled). A final answer is kept, the
        SETTLED newest, so a cgroup's later records (most of them) skip the lookup; the
        workload is joined each time, from the index as it is then. The identity returned
        is shared: read it, do not change it."""
        got = self._settled.get(cgroup_id)
        if got is None:
            assert self.containers is not None
            ref, info = self.containers.resolve(cgroup_id)
            who = identity(ref, info)
            if not self.containers.settled(cgroup_id, ref, info):
                return ref.path, self._with_workload(who), False
            got = self._settled[cgroup_id] = (ref.path, who)
            if len(self._settled) > SETTLED:
                del self._settled[next(iter(self._settled))]
        return got[0], self._with_workload(got[1]), True

    def pid(self, pid: int) -> dict[str, str]:
        """Pod identity of a host pid (GPU processes, RDMA queue pairs), from its cgroup,
        with the owner workload where the cluster index knows the pod."""
        if self.containers is None:
            return {}
        try:
            text = Path(self.procfs_root, str(pid), "cgroup").read_text()
        except OSError:
            return {}
        ref = parse_cgroup(cgroup_path(text))
        return self._with_workload(identity(ref, self.containers.container(ref.container_id)))

    def _with_workload(self, who: dict[str, str]) -> dict[str, str]:
        """An identity with its pod's owner workload, where the cluster index knows the pod
        (a new dict then; who itself is left as it was). A pod named by its uid alone (a
        kubepods cgroup whose container the runtime no longer lists) is named in full."""
        if self.index is None:
            return who
        if who["pod"]:
            pod = self.index.pod(who["namespace"], who["pod"])
        elif who["pod_uid"]:
            pod = self.index.pod_by_uid(who["pod_uid"])
            if pod is not None:
                who = {**who, "namespace": pod.namespace, "pod": pod.name}
        else:
            return who
        if pod is not None:
            return {**who, "workload_kind": pod.workload_kind, "workload": pod.workload}
        return who
