"""Loads bpf_programs/proc_events.c; attributes exec, exit and OOM records to containers."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.bpf import layouts
from lens_ebpf.bpf.layouts import c_text, record_struct
from lens_ebpf.bpf.loader import BpfLoader, plan_for
from lens_ebpf.bpf.program import RingProgram
from lens_ebpf.bpf.spec import TRACEPOINT, Field, Need, ProbePath, ProgramSpec
from lens_ebpf.config import Config
from lens_ebpf.containers.runtime import ContainerInfo
from lens_ebpf.devices.gpu import rest
from lens_ebpf.enrich import Enrichment
from lens_ebpf.events import ContainerChange, EventBus, ProcessEvent
from lens_ebpf.metrics.cache import COUNTER, MetricCache

log = logging.getLogger(__name__)

NAME = "proc_events"
# What proc_events.c needs, and what is lost without the optional parts (bpf/spec.py).
SPEC = ProgramSpec(
    NAME,
    needs=(
        Need("fork", (ProbePath(TRACEPOINT, ("sched:sched_process_fork",)),)),
        Need("exec", (ProbePath(TRACEPOINT, ("sched:sched_process_exec",)),)),
        Need("exit", (ProbePath(TRACEPOINT, ("sched:sched_process_exit",)),)),
        Need("exit_codes", (ProbePath(TRACEPOINT, ("syscalls:sys_enter_exit_group",
                                                   "syscalls:sys_enter_exit"), "LENS_EXIT_CODES"),),
             optional=True, what_is_lost="exits carry no exit code"),
        Need("signals", (ProbePath(TRACEPOINT, ("signal:signal_deliver",), "LENS_SIGNALS"),),
             optional=True, what_is_lost="exits carry no killing signal"),
        Need("oom", (ProbePath(TRACEPOINT, ("oom:mark_victim",), "LENS_OOM"),), optional=True,
             what_is_lost="no OOM kill events"),
    ),
    fields=(
        Field("sched:sched_process_exit", "group_dead", "LENS_TP_EXIT_GROUP_DEAD",
              "the thread-group leader's exit stands for the process's"),
        Field("oom:mark_victim", "data_loc_comm", "LENS_TP_OOM_COMM",
              "OOM events name the process from its exec"),
    ),
)  # fmt: skip
EV_EXEC, EV_EXIT, EV_OOM = 1, 2, 3
PF_OOM_VICTIM = 4
GPU_NODE = re.compile(r"^/dev/(dri/(card|renderD)\d+|nvidia\d+)$")
UVERBS = re.compile(r"^/dev/infiniband/uverbs\d+$")
PSTATS = ("ringbuf_full", "events")
IDENTITY = ("namespace", "pod", "container")
EXECS = "lens_container_process_execs_total"
EXITS = "lens_container_process_exits_total"
OOMS = "lens_container_oom_kills_total"


def exit_class(exit_code: int, signal: int) -> str:
    if signal:
        return "signal"
    if exit_code < 0:
        return "unknown"
    return "success" if exit_code == 0 else "error"


def container_event(kind: str, c: ContainerInfo) -> ContainerChange:
    return ContainerChange(
        kind=kind, ts_ns=time.clock_gettime_ns(time.CLOCK_MONOTONIC), container_id=c.id,
        container=c.name or c.id, pod=c.pod_name, namespace=c.pod_namespace, pod_uid=c.pod_uid,
        devices=tuple(d.host_path or d.path for d in c.devices),
    )  # fmt: skip


def pods_view(containers: dict[str, ContainerInfo], gpus: dict[str, dict] | None = None,
              rdma: dict[str, dict] | None = None) -> list[dict[str, Any]]:  # fmt: skip
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
                ib.append({**(known or {"name": "", "id": -1, "kind": "RDMA", "uuid": ""}),
                           "path": d.path, "host_path": d.host_path, "major": d.major,
                           "minor": d.minor})  # fmt: skip
            elif d.group in ("gpu", "infiniband"):
                control.append(d.path)
        out.append({
            "id": c.id, "pod_name": c.pod_name, "pod_namespace": c.pod_namespace,
            "pod_uuid": c.pod_uid,
            "devices": {"gpu": rest.pod_gpus(gpu_nodes, gpus or {}), "infiniband": ib},
            # lens-ebpf's additions
            "container_name": c.name, "control_devices": control,
        })  # fmt: skip
    return out


_PROC_EVENT = record_struct(layouts.ProcEvent)


class ProcEvents(RingProgram):
    """The proc_events program: records in, attributed events and counters out."""

    NAME = NAME
    STATS = PSTATS

    def __init__(
        self, cfg: Config, cache: MetricCache, bus: EventBus, loader: BpfLoader,
        enrich: Enrichment,
    ) -> None:  # fmt: skip
        super().__init__(loader)
        self.cfg = cfg
        self.cache = cache
        self.bus = bus
        self.enrich = enrich
        assert enrich.containers is not None, "processes are attributed through containers"
        self.resolver = enrich.containers
        self.resolver.on_change = self._containers_changed
        self._comms: dict[int, str] = {}
        for name, help_text, extra in (
            (EXECS, "Processes started (exec) in containers", ()),
            (EXITS, "Processes ended, by exit class: success, error, signal, unknown",
             ("exit_class",)),
            (OOMS, "Processes the OOM killer chose", ()),
        ):  # fmt: skip
            cache.register(name, COUNTER, help_text, (*IDENTITY, *extra))

    @staticmethod
    def static_defines(cfg: Config) -> dict[str, int | str]:
        """The cflags proc_events.c is compiled with."""
        return {"MAX_PROCS": cfg.bpf.max_processes, "RINGBUF_PAGES": cfg.bpf.ringbuf_pages}

    def start(self) -> bool:
        self.bpf = self.loader.load(plan_for(SPEC), self.static_defines(self.cfg))
        if self.bpf is None:
            return False
        layouts.check_layout("proc_event", layouts.ProcEvent, self.bpf[b"layout_proc_event"].Leaf)
        self.refresh_containers()
        self.open_events(b"proc_events", self._on_event)
        return True

    def _on_event(self, rec: bytes) -> None:
        ts_ns, cgroup_id, kind, pid, ppid, exit_code, signal, flags, raw_comm, raw_file = (
            _PROC_EVENT.unpack_from(rec)
        )
        self.events_received += 1
        ref, who = self.enrich.cgroup(cgroup_id)
        labels = (who["namespace"], who["pod"], who["container"])
        comm = c_text(raw_comm)
        common = dict(ts_ns=ts_ns, pid=pid, ppid=ppid, cgroup_id=cgroup_id, cgroup=ref.path,
                      **who)  # fmt: skip
        if kind == EV_EXEC:
            ev = ProcessEvent(kind="process_exec", comm=comm, **common,
                              filename=c_text(raw_file))  # fmt: skip
            self.cache.inc(EXECS, labels)
            self._remember_comm(pid, comm)
        elif kind == EV_EXIT:
            self._comms.pop(pid, None)
            ev = ProcessEvent(kind="process_exit", comm=comm, **common, exit_code=exit_code,
                              signal=signal, oom_killed=bool(flags & PF_OOM_VICTIM))  # fmt: skip
            self.cache.inc(EXITS, (*labels, exit_class(exit_code, signal)))
        elif kind == EV_OOM:
            # a kernel whose mark_victim has no comm: the one its exec had
            ev = ProcessEvent(kind="oom_kill", comm=comm or self._comms.get(pid, ""), **common)
            self.cache.inc(OOMS, labels)
        else:
            return
        self.bus.publish(ev)

    def _remember_comm(self, pid: int, comm: str) -> None:
        """pid -> its comm at exec, bounded like the kernel's process map."""
        self._comms.pop(pid, None)
        self._comms[pid] = comm
        if len(self._comms) > self.cfg.bpf.max_processes:
            self._comms.pop(next(iter(self._comms)))

    def refresh_containers(self) -> None:
        self.resolver.refresh()

    def _containers_changed(
        self, started: list[ContainerInfo], exited: list[ContainerInfo]
    ) -> None:
        for c in started:
            self.bus.publish(container_event("container_start", c))
        for c in exited:
            self.bus.publish(container_event("container_exit", c))

    def read(self) -> None:
        if self.bpf is None:
            return
        self.refresh_containers()
        self.read_stats(b"pstats")


class ProcEventsCollector(Collector):
    def __init__(self, procs: ProcEvents) -> None:
        self._procs = procs

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        running = Metric("lens_containers_running", "Containers the runtime reports", "gauge")
        running.add_sample("lens_containers_running", {}, len(self._procs.resolver.containers))
        yield running
