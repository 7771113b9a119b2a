"""Load bpf_programs/*.c with BCC: src_file plus -D cflags, never C built from strings."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf import tracefs
from lens_ebpf.bpf.syscall import recursion_misses

log = logging.getLogger(__name__)

ATTACHED, OFF, ERROR = "attached", "off", "error"


def program_dir() -> Path:
    """Where the .c files and their shared header live (found as package data)."""
    return Path(str(resources.files("bpf_programs")))


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
    """What became of one program: attached, off (with why) or error (with why)."""

    name: str
    state: str
    reason: str = ""
    load_seconds: float = 0.0
    tracepoints: tuple[str, ...] = ()


def missing_tracepoints(tracepoints: Sequence[str], events: Path | None = None) -> list[str]:
    return [tp for tp in tracepoints if not tracefs.tracepoint_exists(tp, events)]


class BpfLoader:
    """Loads programs, keeps their status, and detaches them all on close."""

    def __init__(self) -> None:
        self.status: dict[str, ProgramStatus] = {}
        self._loaded: dict[str, Any] = {}
        self._event_counts: dict[str, Callable[[], tuple[int, dict[str, int]]]] = {}

    def report_events(self, program: str, counts: Callable[[], tuple[int, dict[str, int]]]) -> None:
        """counts() -> (records received, {reason: records lost}) for the event metrics."""
        self._event_counts[program] = counts

    def event_counts(self) -> dict[str, tuple[int, dict[str, int]]]:
        return {name: fn() for name, fn in self._event_counts.items()}

    def load(
        self,
        name: str,
        tracepoints: Sequence[str],
        defines: Mapping[str, int | str] | None = None,
    ) -> Any | None:
        """Compile and attach bpf_programs/<name>.c; None (with a status) when it can't."""
        tps = tuple(tracepoints)
        missing = missing_tracepoints(tps)
        if missing:
            reason = f"tracepoint(s) missing on this kernel: {', '.join(missing)}"
            self.status[name] = ProgramStatus(name, OFF, reason, tracepoints=tps)
            log.warning("%s: off: %s", name, reason)
            return None
        try:
            from bcc import BPF
        except ImportError as exc:
            reason = f"BCC is not importable ({exc}); install python3-bpfcc"
            self.status[name] = ProgramStatus(name, ERROR, reason, tracepoints=tps)
            log.error("%s: %s", name, reason)
            return None
        started = time.monotonic()
        try:
            bpf = BPF(
                src_file=str(program_source(name)).encode(),
                cflags=render_cflags(defines or {}),
            )
            attached = bpf.num_open_tracepoints()
            if attached != len(tps):
                bpf.cleanup()
                raise RuntimeError(f"{attached} of {len(tps)} tracepoints attached")
        except Exception as exc:  # BCC raises bare Exception for compile and load errors
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            self.status[name] = ProgramStatus(name, ERROR, reason, tracepoints=tps)
            log.error("%s: cannot load: %s", name, reason)
            return None
        elapsed = time.monotonic() - started
        self.status[name] = ProgramStatus(name, ATTACHED, "", elapsed, tps)
        self._loaded[name] = bpf
        log.info("%s: attached %d tracepoints in %.2fs", name, len(tps), elapsed)
        return bpf

    def misses(self) -> list[tuple[str, str, int]]:
        """(program, tracepoint, runs the kernel skipped) for each attached probe."""
        out = []
        for name, bpf in self._loaded.items():
            for raw, fn in bpf.funcs.items():
                fname = raw.decode() if isinstance(raw, bytes) else raw
                if not fname.startswith("tracepoint__"):
                    continue
                n = recursion_misses(fn.fd)
                if n is not None:
                    out.append((name, ":".join(fname.split("__")[1:3]), n))
        return out

    def close(self) -> None:
        """Detach every program."""
        for name, bpf in list(self._loaded.items()):
            try:
                bpf.cleanup()
            except Exception as exc:  # cleanup must go on for the others
                log.warning("%s: detach failed: %s", name, exc)
            self.status[name].state = OFF
            self.status[name].reason = "detached"
        self._loaded.clear()


class LoaderCollector(Collector):
    """lens_agent_bpf_program_attached and load duration per program."""

    def __init__(self, loader: BpfLoader) -> None:
        self._loader = loader

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        attached = Metric(
            "lens_agent_bpf_program_attached", "1 when the BPF program is attached", "gauge"
        )
        seconds = Metric("lens_agent_bpf_program_load_seconds", "Compile and attach time", "gauge")
        for st in self._loader.status.values():
            attached.add_sample(
                attached.name, {"program": st.name}, 1.0 if st.state == ATTACHED else 0.0
            )
            if st.state == ATTACHED:
                seconds.add_sample(seconds.name, {"program": st.name}, st.load_seconds)
        missed = Metric(
            "lens_agent_bpf_program_missed",
            "Runs the kernel skipped because another BPF program was running on that CPU",
            "counter",
        )
        for program, probe, n in self._loader.misses():
            missed.add_sample(
                "lens_agent_bpf_program_missed_total", {"program": program, "probe": probe}, n
            )
        got = Metric("lens_agent_events", "Ring-buffer records received", "counter")
        lost = Metric("lens_agent_events_lost", "Events lost before user space", "counter")
        for program, (received, losses) in self._loader.event_counts().items():
            got.add_sample("lens_agent_events_total", {"program": program}, received)
            for reason, n in losses.items():
                lost.add_sample(
                    "lens_agent_events_lost_total", {"program": program, "reason": reason}, n
                )
        yield attached
        yield seconds
        yield missed
        yield got
        yield lost
