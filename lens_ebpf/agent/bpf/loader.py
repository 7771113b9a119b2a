"""Load bpf/programs/*.c with BCC: src_file plus -D cflags, never C built from strings."""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.agent import tracefs
from lens_ebpf.agent.bpf import syscall
from lens_ebpf.agent.bpf.spec import Kernel, Plan, ProgramSpec, feature_path, resolve
from lens_ebpf.agent.bpf.syscall import (
    enable_run_stats,
    load_btf_tracepoint,
    recursion_misses,
    run_stats,
)
from lens_ebpf.core.exposition import counter, gauge

log = logging.getLogger(__name__)

ATTACHED, OFF, ERROR = "attached", "off", "error"
# Threads that may be inside a return-probed function at once (a thread blocked in recv
# holds an instance while it waits); the kernel's own default is max(10, 2 * CPUs) and
# its ceiling KRETPROBE_MAXACTIVE_MAX is 4096. A return beyond it is missed, and counted.
RETPROBE_MAXACTIVE = 4096
RETPROBE_PREFIX = "kretprobe_"  # not BCC's auto-attached kretprobe__: the loader attaches it
_retprobe_serial = itertools.count(1)


def attach_retprobe(bpf: Any, fn: str) -> str:
    """Attach kretprobe_<fn> to fn's return with RETPROBE_MAXACTIVE instances; the kprobe
    event's name (kprobe_profile shows it). BCC makes a return probe with maxactive
    through kprobe_events, naming it r_<fn>_bcc_<pid>, so a second program of the same
    process could not attach there: each gets a name of its own."""
    from bcc import BPF, lib

    prog = bpf.load_func(f"{RETPROBE_PREFIX}{fn}".encode(), BPF.KPROBE)
    ev_name = f"r_{fn}_lens{next(_retprobe_serial)}".encode()
    fd = lib.bpf_attach_kprobe(prog.fd, 1, ev_name, fn.encode(), 0, RETPROBE_MAXACTIVE)
    if fd < 0:
        raise RuntimeError(f"cannot attach a return probe to {fn}()")
    bpf._add_kprobe_fd(ev_name, prog.name, fd)  # BCC's own record: cleanup() detaches it
    return f"{ev_name.decode()}_bcc_{os.getpid()}"


ITER_PREFIX = "bpf_iter__"  # bpf_iter__<target>: the loader links it; Python runs it
BTF_TP_PREFIX = "tp_btf__"  # tp_btf__<event>: the loader loads and attaches it BTF-typed


def attach_btf_tracepoint(bpf: Any, tracepoint: str, type_id: int | None) -> None:
    """Load tp_btf__<event> from BCC's compiled module as a BTF-typed tracepoint program
    against type_id, the kernel's btf_trace_<event> typedef (Plan.btf_trace_ids; BCC's own
    loader cannot: it takes the attach type from a name prefix it knows), and attach it.
    BCC's records own both descriptors: its funcs (close() closes the program's) and
    raw_tracepoint_fds under "tp_btf:<event>" (cleanup() closes the link, which detaches
    it)."""
    from bcc import BPF, lib

    event = tracepoint.split(":", 1)[-1]
    fname = f"{BTF_TP_PREFIX}{event}".encode()
    if type_id is None:
        raise RuntimeError(f"no BTF type btf_trace_{event} to attach {fname.decode()} to")
    try:
        fd = load_btf_tracepoint(
            bpf.dump_func(fname), lib.bpf_module_license(bpf.module), type_id, event
        )
    except OSError as exc:
        raise RuntimeError(f"cannot load {fname.decode()}: {exc.strerror}") from None
    bpf.funcs[fname] = BPF.Function(bpf, fname, fd)
    try:
        link = syscall.attach_btf_tracepoint(fd)
    except OSError as exc:
        raise RuntimeError(f"cannot attach {fname.decode()}: {exc.strerror}") from None
    bpf.raw_tracepoint_fds[f"tp_btf:{event}".encode()] = link


class BpfIterator:
    """A BPF iterator program linked to its target: each run() makes the kernel walk
    every object of the target (every TCP socket for "tcp") through the program once."""

    def __init__(self, bpf: Any, target: str) -> None:
        import ctypes

        from bcc import BPF, lib

        self.fn = bpf.load_func(f"{ITER_PREFIX}{target}".encode(), BPF.TRACING)
        # libbcc's own calls (BCC's Python wraps neither): a link, then one fd per walk
        self._lib = ctypes.CDLL(lib._name, use_errno=True)
        self._lib.bcc_iter_attach.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32)
        self._lib.bcc_iter_create.argtypes = (ctypes.c_int,)
        self.link = self._lib.bcc_iter_attach(self.fn.fd, None, 0)
        if self.link < 0:
            err = ctypes.get_errno()
            raise RuntimeError(f"cannot link the {target} iterator: {os.strerror(err)}")

    def run(self) -> bytes:
        """One walk; what the program wrote (bpf_seq_write), if anything."""
        fd = self._lib.bcc_iter_create(self.link)
        if fd < 0:
            raise OSError(f"cannot start an iterator walk (errno {abs(fd)})")
        try:
            out = []
            while chunk := os.read(fd, 65536):
                out.append(chunk)
            return b"".join(out)
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.link >= 0:
            os.close(self.link)
            self.link = -1


def program_dir() -> Path:
    """Where the .c files and their headers live: lens_ebpf/agent/bpf/programs/, found as
    package data."""
    return Path(str(resources.files("lens_ebpf.agent.bpf").joinpath("programs")))


def program_source(name: str) -> Path:
    return program_dir() / f"{name}.c"


def render_cflags(defines: Mapping[str, int | str]) -> list[str]:
    """The flags a program is compiled with: its include dir and one -D per setting."""
    flags = [f"-I{program_dir()}"]
    for key, value in sorted(defines.items()):
        if not key.isidentifier() or not key.isupper():
            raise ValueError(f"bad cflag name {key!r}")
        flags.append(f"-D{key}={int(value) if isinstance(value, bool) else value}")
    return flags


@dataclass
class ProgramStatus:
    """What became of one program: attached, off (with why) or error (with why), and the
    path each of its needs took on this kernel."""

    name: str
    state: str
    reason: str = ""
    load_seconds: float = 0.0
    tracepoints: tuple[str, ...] = ()
    kprobes: tuple[str, ...] = ()
    paths: dict[str, str] = field(default_factory=dict)  # need -> tracepoint|kprobe|off
    detail: str = ""  # fallbacks taken and details lost (Plan.summary)
    raw_tracepoints: tuple[str, ...] = ()  # probes() names each "raw:<event>"
    iterators: tuple[str, ...] = ()  # BPF iterator targets; probes() names each "iter:<target>"
    btf_tracepoints: tuple[str, ...] = ()  # attached tp_btf; probes() names each "tp_btf:<event>"


def plan_for(spec: ProgramSpec, disabled: Sequence[str] = (), kernel: Kernel | None = None) -> Plan:
    """spec resolved on the running kernel (or the one given)."""
    return resolve(spec, kernel or Kernel.running((spec,)), disabled)


def feature_view(st: ProgramStatus, needs: Iterable[str] | None = None) -> dict[str, Any]:
    """A program's status as /readyz and check show a feature: state, why, and the path
    (tracepoint, or kprobe where any need fell back to one) of the needs it covers."""
    paths = {n: p for n, p in st.paths.items() if needs is None or n in needs}
    return {
        "state": st.state,
        "reason": st.reason,
        "path": feature_path(paths.values()),
        "paths": paths,
        "detail": st.detail,
    }


class BpfLoader:
    """Loads programs, keeps their status, and detaches them all on close."""

    def __init__(self) -> None:
        self.status: dict[str, ProgramStatus] = {}
        self._loaded: dict[str, Any] = {}
        self._event_counts: dict[str, Callable[[], tuple[int, dict[str, int]]]] = {}
        self._stats_fd: int | None = None
        self._retprobe_events: dict[tuple[str, str], str] = {}  # (program, fn) -> event
        self._iterators: dict[tuple[str, str], BpfIterator] = {}  # (program, target)

    def enable_stats(self) -> bool:
        """Keep the kernel's BPF run-time statistics on until close() (bpf.run_stats)."""
        if self._stats_fd is None:
            try:
                self._stats_fd = enable_run_stats()
            except OSError as exc:
                log.warning("bpf.run_stats: the kernel refused BPF_ENABLE_STATS: %s", exc)
                return False
            log.info("bpf.run_stats: BPF run-time statistics on while the agent runs")
        return True

    def report_events(self, program: str, counts: Callable[[], tuple[int, dict[str, int]]]) -> None:
        """counts() -> (records received, {reason: records lost}) for the event metrics."""
        self._event_counts[program] = counts

    def event_counts(self) -> dict[str, tuple[int, dict[str, int]]]:
        return {name: fn() for name, fn in self._event_counts.items()}

    def load(self, plan: Plan, defines: Mapping[str, int | str] | None = None) -> Any | None:
        """Compile programs/<name>.c with the plan's switches and attach what it
        chose; None (with a status) when it can't."""
        name = plan.spec.name
        tps, raws, kps = plan.tracepoints(), plan.raw_tracepoints(), plan.kprobes()
        iters, btfs = plan.iterators(), plan.btf_tracepoints()

        def status(state: str, reason: str, seconds: float = 0.0) -> ProgramStatus:
            st = ProgramStatus(
                name,
                state,
                reason,
                seconds,
                tps,
                kps,
                plan.paths(),
                plan.summary(),
                raws,
                iters,
                btfs,
            )
            self.status[name] = st
            return st

        if not plan.loadable:
            status(OFF, plan.off_reason)
            log.warning("%s: off: %s", name, plan.off_reason)
            return None
        try:
            from bcc import BPF
        except ImportError as exc:
            reason = f"BCC is not importable ({exc}); install python3-bpfcc"
            status(ERROR, reason)
            log.error("%s: %s", name, reason)
            return None
        started = time.monotonic()
        try:
            # kprobe__fn, tracepoint__cat__name and raw_tracepoint__name functions attach
            # themselves as BCC loads them
            bpf = BPF(
                src_file=str(program_source(name)).encode(),
                cflags=render_cflags({**plan.defines, **(defines or {})}),
            )
            try:
                for tp in btfs:
                    attach_btf_tracepoint(bpf, tp, plan.btf_trace_ids.get(tp))
                for probe in kps:
                    fn, _, where = probe.partition(":")
                    if where == "return":
                        self._retprobe_events[(name, fn)] = attach_retprobe(bpf, fn)
                for target in iters:
                    self._iterators[(name, target)] = BpfIterator(bpf, target)
                n_btf = sum(k.startswith(b"tp_btf:") for k in bpf.raw_tracepoint_fds)
                got = (
                    bpf.num_open_tracepoints(),
                    len(bpf.raw_tracepoint_fds) - n_btf,
                    bpf.num_open_kprobes(),
                    n_btf,
                )
                if got != (len(tps), len(raws), len(kps), len(btfs)):
                    raise RuntimeError(
                        f"{got[0]} of {len(tps)} tracepoints, {got[1]} of {len(raws)} raw "
                        f"tracepoints, {got[3]} of {len(btfs)} BTF-typed tracepoints and "
                        f"{got[2]} of {len(kps)} kprobes attached"
                    )
            except Exception:
                self._close_iterators(name)
                bpf.cleanup()
                for key in [k for k in self._retprobe_events if k[0] == name]:
                    del self._retprobe_events[key]
                raise
        except Exception as exc:  # BCC raises bare Exception for compile and load errors
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            status(ERROR, reason)
            log.error("%s: cannot load: %s", name, reason)
            return None
        elapsed = time.monotonic() - started
        status(ATTACHED, "", elapsed)
        self._loaded[name] = bpf
        log.info(
            "%s: attached %d tracepoints (%d BTF-typed), %d raw tracepoints, %d kprobes "
            "and %d iterators in %.2fs (%s)",
            name,
            len(tps) + len(btfs),
            len(btfs),
            len(raws),
            len(kps),
            len(iters),
            elapsed,
            plan.summary() or "all tracepoints",
        )
        return bpf

    def iterator(self, program: str, target: str) -> BpfIterator:
        """The linked iterator of a loaded program (KeyError when it has none)."""
        return self._iterators[(program, target)]

    def _close_iterators(self, program: str | None = None) -> None:
        for key in [k for k in self._iterators if program is None or k[0] == program]:
            self._iterators.pop(key).close()

    def probes(self) -> list[tuple[str, str, int]]:
        """(program, probe, fd) for each attached tracepoint and kprobe function; a raw
        tracepoint is "raw:<name>", a BTF-typed one "tp_btf:<name>"."""
        out = []
        for name, bpf in self._loaded.items():
            for raw, fn in bpf.funcs.items():
                fname = raw.decode() if isinstance(raw, bytes) else raw
                if fname.startswith("tracepoint__"):
                    out.append((name, ":".join(fname.split("__")[1:3]), fn.fd))
                elif fname.startswith(BTF_TP_PREFIX):
                    out.append((name, f"tp_btf:{fname[len(BTF_TP_PREFIX):]}", fn.fd))
                elif fname.startswith("raw_tracepoint__"):
                    out.append((name, f"raw:{fname[len('raw_tracepoint__'):]}", fn.fd))
                elif fname.startswith("kprobe__"):
                    out.append((name, f"kprobe:{fname[len('kprobe__'):]}", fn.fd))
                elif fname.startswith(RETPROBE_PREFIX):
                    out.append((name, f"kretprobe:{fname[len(RETPROBE_PREFIX):]}", fn.fd))
                elif fname.startswith(ITER_PREFIX):
                    out.append((name, f"iter:{fname[len(ITER_PREFIX):]}", fn.fd))
        return out

    def misses(self) -> list[tuple[str, str, int]]:
        """(program, tracepoint, runs the kernel skipped) for each attached tracepoint."""
        out = []
        for name, probe, fd in self.probes():
            if probe.startswith(("kprobe:", "kretprobe:", "iter:")):
                continue  # the kernel skips tracepoint programs only
            n = recursion_misses(fd)
            if n is not None:
                out.append((name, probe, n))
        return out

    def retprobe_misses(self) -> list[tuple[str, str, int]]:
        """(program, kretprobe:fn, returns missed) for each attached return probe."""
        if not self._retprobe_events:
            return []
        profile = tracefs.kprobe_profile()
        out = []
        for (name, fn), event in self._retprobe_events.items():
            got = profile.get(event)
            if got is not None:
                out.append((name, f"kretprobe:{fn}", got[1]))
        return out

    def run_stats(self) -> list[tuple[str, str, int, int]]:
        """(program, probe, nanoseconds run, runs) for each attached probe that has run
        while the kernel's run-time statistics were on."""
        out = []
        for name, probe, fd in self.probes():
            got = run_stats(fd)
            if got and got[1]:
                out.append((name, probe, got[0], got[1]))
        return out

    def close(self) -> None:
        """Detach every program."""
        self._close_iterators()
        for name, bpf in list(self._loaded.items()):
            try:
                bpf.cleanup()
            except Exception as exc:  # cleanup must go on for the others
                log.warning("%s: detach failed: %s", name, exc)
            self.status[name].state = OFF
            self.status[name].reason = "detached"
        self._loaded.clear()
        self._retprobe_events.clear()
        if self._stats_fd is not None:
            os.close(self._stats_fd)
            self._stats_fd = None


class LoaderCollector(Collector):
    """lens_agent_bpf_program_attached and load duration per program."""

    def __init__(self, loader: BpfLoader) -> None:
        self._loader = loader

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        attached = gauge("lens_agent_bpf_program_attached", "1 when the BPF program is attached")
        seconds = gauge("lens_agent_bpf_program_load_seconds", "Compile and attach time")
        for st in self._loader.status.values():
            attached.add({"program": st.name}, 1.0 if st.state == ATTACHED else 0.0)
            if st.state == ATTACHED:
                seconds.add({"program": st.name}, st.load_seconds)
        missed = counter(
            "lens_agent_bpf_program_missed",
            "Runs the kernel skipped because another BPF program was running on that CPU",
        )
        for program, probe, n in self._loader.misses():
            missed.add({"program": program, "probe": probe}, n)
        ret_missed = counter(
            "lens_agent_kretprobe_missed",
            "Returns of a probed kernel function the program did not see: more threads were "
            "inside the function at once than the return probe has instances for",
        )
        for program, probe, n in self._loader.retprobe_misses():
            ret_missed.add({"program": program, "probe": probe}, n)
        run_s = counter(
            "lens_agent_bpf_program_run_seconds",
            "Time the kernel spent in the probe while its BPF run-time statistics were on",
        )
        runs = counter(
            "lens_agent_bpf_program_runs",
            "Runs of the probe while the kernel's BPF run-time statistics were on",
        )
        for program, probe, ns, n in self._loader.run_stats():
            labels = {"program": program, "probe": probe}
            run_s.add(labels, ns / 1e9)
            runs.add(labels, n)
        got = counter("lens_agent_events", "Ring-buffer records received")
        lost = counter("lens_agent_events_lost", "Events lost before user space")
        for program, (received, losses) in self._loader.event_counts().items():
            got.add({"program": program}, received)
            for reason, n in losses.items():
                lost.add({"program": program, "reason": reason}, n)
        yield attached
        yield seconds
        yield missed
        yield ret_missed
        yield run_s
        yield runs
        yield got
        yield lost
