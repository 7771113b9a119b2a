"""Loads bpf/programs/proc_events.c; attributes exec, exit and OOM records to containers."""

from __future__ import annotations

import ctypes
import logging
from types import ModuleType
from typing import Any

from lens_ebpf.agent import native
from lens_ebpf.agent.bpf import layouts
from lens_ebpf.agent.bpf.layouts import c_text, comm_text, record_struct
from lens_ebpf.agent.bpf.loader import BpfLoader, plan_for
from lens_ebpf.agent.bpf.program import Records, RingProgram
from lens_ebpf.agent.bpf.spec import BTF, TRACEPOINT, BtfField, Field, Need, ProbePath, ProgramSpec
from lens_ebpf.agent.config import BpfConfig
from lens_ebpf.agent.containers.cgroups import kernel_path
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.events import EventBus, ProcessEvent, maker
from lens_ebpf.agent.metrics.cache import COUNTER, MetricCache

log = logging.getLogger(__name__)

NAME = "proc_events"


def _cgroup_path_fields(parent: str) -> tuple[BtfField, ...]:
    """The members proc_events.c's remember_path reads, with the kernfs parent's name."""
    return (
        BtfField("LENS_TASK_CGROUPS_OFF", "task_struct.cgroups", 8),
        BtfField("LENS_CSS_SET_DFL_CGRP_OFF", "css_set.dfl_cgrp", 8),
        BtfField("LENS_CGROUP_KN_OFF", "cgroup.kn", 8),
        BtfField("LENS_KERNFS_NAME_OFF", "kernfs_node.name", 8),
        BtfField("LENS_KERNFS_PARENT_OFF", f"kernfs_node.{parent}", 8),
    )


# What proc_events.c needs, and what is lost without the optional parts (bpf/spec.py).
SPEC = ProgramSpec(
    NAME,
    needs=(
        Need("fork", (ProbePath(TRACEPOINT, ("sched:sched_process_fork",)),)),
        Need("exec", (ProbePath(TRACEPOINT, ("sched:sched_process_exec",)),)),
        Need("exit", (ProbePath(TRACEPOINT, ("sched:sched_process_exit",)),)),
        # the task's own exit_code where the kernel's BTF places it: the syscall
        # tracepoints, the fallback, tax every syscall on the node while enabled
        Need(
            "exit_codes",
            (
                ProbePath(
                    BTF,
                    (),
                    "LENS_EXIT_CODE_BTF",
                    btf=(BtfField("LENS_TASK_EXIT_CODE_OFF", "task_struct.exit_code", 4),),
                ),
                ProbePath(
                    TRACEPOINT,
                    ("syscalls:sys_enter_exit_group", "syscalls:sys_enter_exit"),
                    "LENS_EXIT_CODES",
                ),
            ),
            optional=True,
            what_is_lost="exits carry no exit code",
        ),
        Need(
            "signals",
            (ProbePath(TRACEPOINT, ("signal:signal_deliver",), "LENS_SIGNALS"),),
            optional=True,
            what_is_lost="exits carry no killing signal",
        ),
        Need(
            "oom",
            (ProbePath(TRACEPOINT, ("oom:mark_victim",), "LENS_OOM"),),
            optional=True,
            what_is_lost="no OOM kill events",
        ),
        # a cgroup's path read in the kernel, for records read after it is gone; the
        # kernfs node's parent is __parent from Linux 6.15
        Need(
            "cgroup_paths",
            (
                ProbePath(
                    BTF, (), "LENS_CGROUP_PATHS", btf=_cgroup_path_fields("parent"), quiet=True
                ),
                ProbePath(BTF, (), "LENS_CGROUP_PATHS", btf=_cgroup_path_fields("__parent")),
            ),
            optional=True,
            what_is_lost="a container gone before the agent reads its records is not named",
        ),
    ),
    fields=(
        Field(
            "sched:sched_process_exit",
            "group_dead",
            "LENS_TP_EXIT_GROUP_DEAD",
            "the thread-group leader's exit stands for the process's",
        ),
        Field(
            "oom:mark_victim",
            "data_loc_comm",
            "LENS_TP_OOM_COMM",
            "OOM events name the process from its exec",
        ),
    ),
)
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
# native.procs's counts: metric number -> family
_METRICS = (EXECS, EXITS, OOMS)
# made through its slots (events.maker), once per ring record: these fields by position
_make_process = maker(ProcessEvent, ("kind", "ts_ns", "pid", "ppid", "cgroup_id", "cgroup", "comm"))


def process_event(
    kind: int,
    ts_ns: int,
    pid: int,
    ppid: int,
    exit_code: int,
    signal: int,
    flags: int,
    raw_file: bytes,
    cgroup_id: int,
    path: str,
    who: dict[str, str],
    comm: str,
) -> ProcessEvent:
    """An exec, exit or OOM kill record's event, with its cgroup's path and identity and
    the comm it goes by (both paths: the Python one, and materialize's)."""
    name = _KINDS[kind]
    if kind == EV_EXEC:
        return _make_process(
            name, ts_ns, pid, ppid, cgroup_id, path, comm, filename=c_text(raw_file), **who
        )
    if kind == EV_EXIT:
        return _make_process(
            name,
            ts_ns,
            pid,
            ppid,
            cgroup_id,
            path,
            comm,
            exit_code=exit_code,
            signal=signal,
            oom_killed=bool(flags & PF_OOM_VICTIM),
            **who,
        )
    return _make_process(name, ts_ns, pid, ppid, cgroup_id, path, comm, **who)


def materialize(p: Any) -> ProcessEvent:
    """A compiled process event (native.Packed) as the Python path publishes it."""
    # the compiled path keeps the record up to its filename's end: the rest was its NULs
    record = p.record.ljust(_PROC_EVENT.size, b"\0")
    ts_ns, cgroup_id, kind, pid, ppid, exit_code, signal, flags, _comm, raw_file = (
        _PROC_EVENT.unpack_from(record)
    )
    path, who, comm = p.extra
    return native.stamped(
        process_event(
            kind, ts_ns, pid, ppid, exit_code, signal, flags, raw_file, cgroup_id, path, who, comm
        ),
        p,
    )


def compiled_procs() -> tuple[ModuleType | None, str]:
    """The compiled path for process records, its layout checked against ProcEvent; or
    None and why not."""
    mod, why = native.load()
    if mod is None:
        return None, why
    why = native.layout_differs(mod.proc_event_layout(), layouts.ProcEvent)
    if why:
        return None, why
    for kind in ProcessEvent.KINDS:
        mod.set_materializer(kind, materialize)
    return mod, ""


class ProcEvents(RingProgram):
    """The proc_events program: records in, attributed events and counters out."""

    NAME = NAME
    STATS = PSTATS

    def __init__(
        self,
        bpf: BpfConfig,
        cache: MetricCache,
        bus: EventBus,
        loader: BpfLoader,
        enrich: Enrichment,
        encoder: str = "compiled",
    ) -> None:
        super().__init__(loader)
        self.encoder_setting = encoder  # events.encoder: compiled or python
        self.bpf_cfg = bpf
        self.cache = cache
        self.bus = bus
        self.enrich = enrich
        assert enrich.containers is not None, "processes are attributed through containers"
        self.resolver = enrich.containers
        self._comms: dict[int, str] = {}
        for name, help_text, extra in (
            (EXECS, "Processes started (exec) in containers", ()),
            (
                EXITS,
                "Processes ended, by exit class: success, error, signal, unknown",
                ("exit_class",),
            ),
            (OOMS, "Processes the OOM killer chose", ()),
        ):
            cache.register(name, COUNTER, help_text, (*IDENTITY, *extra))

    @staticmethod
    def static_defines(b: BpfConfig) -> dict[str, int | str]:
        """The cflags proc_events.c is compiled with."""
        return {
            "MAX_PROCS": b.max_processes,
            "RINGBUF_PAGES": b.ringbuf_pages,
            "KNOWN_CGROUPS": b.max_known_cgroups,
        }

    def start(self) -> bool:
        self.bpf = self.loader.load(plan_for(SPEC), self.static_defines(self.bpf_cfg))
        if self.bpf is None:
            return False
        layouts.check_layout("proc_event", layouts.ProcEvent, self.bpf[b"layout_proc_event"].Leaf)
        try:
            self._cgroup_paths = self.bpf[b"cgroup_paths"]  # LENS_CGROUP_PATHS chosen
        except KeyError:
            pass
        else:
            self.resolver.kernel_path = self._kernel_path
        self.open_records(
            b"proc_events",
            self._on_event,
            self.bpf_cfg.ring_reader,
            self.encoder_setting,
            compiled_procs,
            self._on_records,
            ctypes.sizeof(layouts.ProcEvent),
            self.bus.node,
        )
        return True

    def _on_event(self, rec: bytes) -> None:
        ts_ns, cgroup_id, kind, pid, ppid, exit_code, signal, flags, raw_comm, raw_file = (
            _PROC_EVENT.unpack_from(rec)
        )
        self.events_received += 1
        if kind not in _KINDS:
            return
        path, who = self._identity(cgroup_id, bool(flags & REC_NEW_CGROUP))
        labels = (who["namespace"], who["pod"], who["container"])
        comm = comm_text(raw_comm)
        if kind == EV_EXEC:
            self.cache.inc(EXECS, labels)
            self._remember_comm(pid, comm)
        elif kind == EV_EXIT:
            self._comms.pop(pid, None)
            self.cache.inc(EXITS, (*labels, exit_class(exit_code, signal)))
        else:
            # a kernel whose mark_victim has no comm: the one its exec had
            comm = comm or self._comms.get(pid, "")
            self.cache.inc(OOMS, labels)
        ev = process_event(
            kind, ts_ns, pid, ppid, exit_code, signal, flags, raw_file, cgroup_id, path, who, comm
        )
        self.bus.publish(ev, owned=True)

    def _identity(self, cgroup_id: int, new: bool) -> tuple[str, dict[str, str]]:
        """A cgroup's path and identity; a new cgroup (its record woke the reader) whose
        answer is final is marked known, so its later records wait for the batch's
        wake-up."""
        path, who, settled = self.enrich.cgroup(cgroup_id)
        if new and settled:
            self.bpf[b"known_cgroups"][ctypes.c_uint64(cgroup_id)] = ctypes.c_uint8(1)
        return path, who

    def _on_records(self, records: Records) -> None:
        """A pass's records through the compiled path (native.procs): the cgroups they
        name resolved first (outside the bus's lock: a new one may mean reading the
        runtime's state), then each event published as its wire bytes, numbered under
        the lock, and the counters added once per series."""
        self.events_received += self.count(records)
        assert self.native is not None
        mod = self.native
        idents = {cg: self._identity(cg, new) for cg, new in mod.proc_cgroups(records)}
        done: list[Any] = []

        def make(seq: int, ts: int) -> list[Any]:
            events: list[Any]
            events, *rest = mod.procs(
                records, seq, ts, self.head, idents, self._comms, self.bpf_cfg.max_processes
            )
            done.extend(rest)
            return events

        self.bus.publish_batch(make)
        counts, bad, first_error = done
        for (metric, namespace, pod, container, cls), n in counts.items():
            labels = (namespace, pod, container)
            self.cache.inc(_METRICS[metric], (*labels, cls) if metric == 1 else labels, n)
        if bad:
            self.records_lost(bad, first_error)

    def _kernel_path(self, cgroup_id: int) -> str | None:
        """The path proc_events.c read for a cgroup when a record named it, if any."""
        try:
            got = self._cgroup_paths[ctypes.c_uint64(cgroup_id)]
        except KeyError:
            return None
        raw, size = bytes(got.names), got.name_len or 1
        names = [raw[i : i + size] for i in range(0, len(raw), size)]
        return kernel_path(names, got.levels, bool(got.complete))

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
