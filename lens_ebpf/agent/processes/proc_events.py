"""Loads bpf_programs/proc_events.c; attributes exec, exit and OOM records to containers."""

from __future__ import annotations

import ctypes
import logging

from lens_ebpf.agent.bpf import layouts
from lens_ebpf.agent.bpf.layouts import c_text, comm_text, record_struct
from lens_ebpf.agent.bpf.loader import BpfLoader, plan_for
from lens_ebpf.agent.bpf.program import RingProgram
from lens_ebpf.agent.bpf.spec import BTF, TRACEPOINT, BtfField, Field, Need, ProbePath, ProgramSpec
from lens_ebpf.agent.config import BpfConfig
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.events import EventBus, ProcessEvent, maker
from lens_ebpf.agent.metrics.cache import COUNTER, MetricCache

log = logging.getLogger(__name__)

NAME = "proc_events"
# What proc_events.c needs, and what is lost without the optional parts (bpf/spec.py).
SPEC = ProgramSpec(
    NAME,
    needs=(
        Need("fork", (ProbePath(TRACEPOINT, ("sched:sched_process_fork",)),)),
        Need("exec", (ProbePath(TRACEPOINT, ("sched:sched_process_exec",)),)),
        Need("exit", (ProbePath(TRACEPOINT, ("sched:sched_process_exit",)),)),
        # the task's own exit_code where the kernel's BTF places it: the syscall
        # tracepoints, the fallback, tax every syscall on the node while enabled
        Need("exit_codes", (ProbePath(BTF, (), "LENS_EXIT_CODE_BTF",
                                      btf=(BtfField("LENS_TASK_EXIT_CODE_OFF",
                                                    "task_struct.exit_code", 4),)),
                            ProbePath(TRACEPOINT, ("syscalls:sys_enter_exit_group",
                                                   "syscalls:sys_enter_exit"), "LENS_EXIT_CODES")),
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
REC_NEW_CGROUP = 8  # the record's cgroup is not in known_cgroups: it woke the reader
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


_PROC_EVENT = record_struct(layouts.ProcEvent)
_KINDS = {EV_EXEC: "process_exec", EV_EXIT: "process_exit", EV_OOM: "oom_kill"}
# made through its slots (events.maker), once per ring record: these fields by position
_make_process = maker(ProcessEvent, ("kind", "ts_ns", "pid", "ppid", "cgroup_id", "cgroup", "comm"))


class ProcEvents(RingProgram):
    """The proc_events program: records in, attributed events and counters out."""

    NAME = NAME
    STATS = PSTATS

    def __init__(
        self, bpf: BpfConfig, cache: MetricCache, bus: EventBus, loader: BpfLoader,
        enrich: Enrichment,
    ) -> None:  # fmt: skip
        super().__init__(loader)
        self.bpf_cfg = bpf
        self.cache = cache
        self.bus = bus
        self.enrich = enrich
        assert enrich.containers is not None, "processes are attributed through containers"
        self.resolver = enrich.containers
        self._comms: dict[int, str] = {}
        for name, help_text, extra in (
            (EXECS, "Processes started (exec) in containers", ()),
            (EXITS, "Processes ended, by exit class: success, error, signal, unknown",
             ("exit_class",)),
            (OOMS, "Processes the OOM killer chose", ()),
        ):  # fmt: skip
            cache.register(name, COUNTER, help_text, (*IDENTITY, *extra))

    @staticmethod
    def static_defines(b: BpfConfig) -> dict[str, int | str]:
        """The cflags proc_events.c is compiled with."""
        return {"MAX_PROCS": b.max_processes, "RINGBUF_PAGES": b.ringbuf_pages,
                "KNOWN_CGROUPS": b.max_known_cgroups}  # fmt: skip

    def start(self) -> bool:
        self.bpf = self.loader.load(plan_for(SPEC), self.static_defines(self.bpf_cfg))
        if self.bpf is None:
            return False
        layouts.check_layout("proc_event", layouts.ProcEvent, self.bpf[b"layout_proc_event"].Leaf)
        self.open_events(b"proc_events", self._on_event, self.bpf_cfg.ring_reader)
        return True

    def _on_event(self, rec: bytes) -> None:
        ts_ns, cgroup_id, kind, pid, ppid, exit_code, signal, flags, raw_comm, raw_file = (
            _PROC_EVENT.unpack_from(rec)
        )
        self.events_received += 1
        name = _KINDS.get(kind)
        if name is None:
            return
        path, who, settled = self.enrich.cgroup(cgroup_id)
        if flags & REC_NEW_CGROUP and settled:
            # from now on this cgroup's records wait for the batch's wake-up
            self.bpf[b"known_cgroups"][ctypes.c_uint64(cgroup_id)] = ctypes.c_uint8(1)
        labels = (who["namespace"], who["pod"], who["container"])
        comm = comm_text(raw_comm)
        if kind == EV_EXEC:
            ev = _make_process(name, ts_ns, pid, ppid, cgroup_id, path, comm,
                               filename=c_text(raw_file), **who)  # fmt: skip
            self.cache.inc(EXECS, labels)
            self._remember_comm(pid, comm)
        elif kind == EV_EXIT:
            self._comms.pop(pid, None)
            ev = _make_process(name, ts_ns, pid, ppid, cgroup_id, path, comm, exit_code=exit_code,
                               signal=signal, oom_killed=bool(flags & PF_OOM_VICTIM),
                               **who)  # fmt: skip
            self.cache.inc(EXITS, (*labels, exit_class(exit_code, signal)))
        else:
            # a kernel whose mark_victim has no comm: the one its exec had
            ev = _make_process(name, ts_ns, pid, ppid, cgroup_id, path,
                               comm or self._comms.get(pid, ""), **who)  # fmt: skip
            self.cache.inc(OOMS, labels)
        self.bus.publish(ev, owned=True)

    def _remember_comm(self, pid: int, comm: str) -> None:
        """pid -> its comm at exec, bounded like the kernel's process map."""
        self._comms.pop(pid, None)
        self._comms[pid] = comm
        if len(self._comms) > self.bpf_cfg.max_processes:
            self._comms.pop(next(iter(self._comms)))

    def read(self) -> None:
        if self.bpf is None:
            return
        self.read_stats(b"pstats")
