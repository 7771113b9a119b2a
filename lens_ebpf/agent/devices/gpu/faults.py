"""GPU faults from the kernel log: NVIDIA Xid errors and amdgpu RAS reports.

The NVIDIA driver logs `NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python3, GPU has
fallen off the bus.`; amdgpu logs `amdgpu 0000:c1:00.0: amdgpu: 2 uncorrectable hardware
errors detected in umc block` (amdgpu_ras.c). /dev/kmsg hands out one record per read,
`PRI,SEQ,TIMESTAMP,FLAGS;MESSAGE`, to every reader, without consuming it, so reading it
takes nothing from dmesg or journald. The watcher starts at the end of the log: faults
logged before the agent started are history, not news.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass

from lens_ebpf.agent.devices.gpu.model import norm_bdf

log = logging.getLogger(__name__)

XID = re.compile(
    r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\): "
    r"(\d+)(?:, (.*))?"
)
XID_PID = re.compile(r"\bpid=(\d+)")
AMD_RAS = re.compile(
    r"amdgpu (\S+): (?:amdgpu: )?(\d+) (uncorrectable|correctable) hardware "
    r"errors detected in (\w+) block"
)


@dataclass(frozen=True)
class Fault:
    vendor: str
    bdf: str
    kind: str  # xid, ras_uncorrectable, ras_correctable
    code: str  # the Xid number, or the RAS block (umc, gfx, ...)
    message: str
    count: int = 1  # RAS reports say how many errors
    pid: int = 0  # the process an Xid names, when it names one
    source: str = "kmsg"  # kmsg (the kernel log) or nvml (NVML's event API)


def parse_record(raw: bytes) -> tuple[int, str] | None:
    """(sequence number, message) of one /dev/kmsg record; None when malformed."""
    head, sep, body = raw.decode(errors="replace").partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3 or not fields[1].isdigit():
        return None
    return int(fields[1]), body.split("\n", 1)[0]  # continuation lines follow the message


def parse_fault(message: str) -> Fault | None:
    """The GPU fault a kernel log message reports, or None."""
    if m := XID.search(message):
        bdf = m.group(1) if "." in m.group(1) else m.group(1) + ".0"
        pid = XID_PID.search(m.group(3) or "")
        return Fault(
            "nvidia",
            norm_bdf(bdf),
            "xid",
            m.group(2),
            message[m.start() :][:300],
            pid=int(pid.group(1)) if pid else 0,
        )
    if m := AMD_RAS.search(message):
        return Fault(
            "amd",
            norm_bdf(m.group(1)),
            f"ras_{m.group(3)}",
            m.group(4),
            message[m.start() :][:300],
            count=int(m.group(2)),
        )
    return None


class KmsgWatcher:
    """Reads the kernel log from its end and hands each GPU fault to on_fault."""

    def __init__(self, path: str, on_fault: Callable[[Fault], None]) -> None:
        self.path = path
        self.on_fault = on_fault
        self.records = 0
        self.faults = 0
        self.overruns = 0  # records the kernel overwrote before we read them

    def open(self) -> int:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(fd, 0, os.SEEK_END)
        return fd

    def run(self, stop: threading.Event, fd: int | None = None) -> None:
        """Until stop is set (a thread's whole life)."""
        if fd is None:
            try:
                fd = self.open()
            except OSError as exc:
                log.warning(
                    "gpu faults: cannot read %s: %s; Xid and RAS reports from the "
                    "kernel log are off",
                    self.path,
                    exc.strerror or exc,
                )
                return
        try:
            while not stop.is_set():
                ready, _, _ = select.select([fd], [], [], 0.5)
                if ready:
                    self.drain(fd)
        finally:
            os.close(fd)

    def drain(self, fd: int) -> None:
        while True:
            try:
                raw = os.read(fd, 8192)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten before we read it: go on
                    self.overruns += 1
                    continue
                raise
            if not raw:
                return
            self.records += 1
            got = parse_record(raw)
            fault = parse_fault(got[1]) if got else None
            if fault is not None:
                self.faults += 1
                try:
                    self.on_fault(fault)
                except Exception:  # a bad fault must not stop the watcher
                    log.exception("gpu faults: handling %s failed", fault)
