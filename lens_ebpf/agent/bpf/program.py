"""What every loaded program with a ring buffer shares: polling, event counts, stats."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

from lens_ebpf.agent.bpf.loader import BpfLoader


class RingProgram:
    """A loaded BPF object whose records arrive on a ring buffer and whose losses sit in
    a per-CPU stats array; subclasses name the program and its maps."""

    NAME = ""
    STATS: tuple[str, ...] = ()

    def __init__(self, loader: BpfLoader) -> None:
        self.loader = loader
        self.bpf: Any = None
        self.events_received = 0
        self.kernel_stats: dict[str, int] = dict.fromkeys(self.STATS, 0)

    def open_events(self, ring: bytes, handle: Callable[[bytes], None]) -> None:
        """Deliver the ring buffer's records (their bytes) to handle; report received and
        lost."""
        self.bpf[ring].open_ring_buffer(
            lambda _ctx, data, size: handle(ctypes.string_at(data, size))
        )
        self.loader.report_events(
            self.NAME,
            lambda: (self.events_received, {"ringbuf_full": self.kernel_stats["ringbuf_full"]}),
        )

    def poll(self, timeout_ms: int) -> None:
        """Deliver pending records (call from one thread). A program may submit without
        waking the reader (it wakes it once per batch), so what is there after the wait is
        taken whether a wakeup came or not."""
        if self.bpf is not None:
            self.bpf.ring_buffer_poll(timeout_ms)
            self.bpf.ring_buffer_consume()

    def poll_until(self, stop: threading.Event, timeout_ms: int = 100) -> None:
        """Deliver records until stop is set (a thread's whole life)."""
        while not stop.is_set():
            self.poll(timeout_ms)

    def read_stats(self, table: bytes) -> None:
        """Sum the per-CPU stats array into kernel_stats, by the names in STATS."""
        stats = self.bpf[table]
        for i, name in enumerate(self.STATS):
            self.kernel_stats[name] = sum(stats[ctypes.c_int(i)])
