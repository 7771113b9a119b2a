"""What every loaded program with a ring buffer shares: polling, event counts, stats."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from typing import Any

from lens_ebpf.agent.bpf import ringbuf
from lens_ebpf.agent.bpf.loader import BpfLoader
from lens_ebpf.agent.bpf.ringbuf import MappedRing
from lens_ebpf.protocol.gen import lens_pb2 as pb

log = logging.getLogger(__name__)

# a batch of ring records: one bytes each, or whole records back to back (native.ring_take)
Records = list[bytes] | bytes


class RingProgram:
    """A loaded BPF object whose records arrive on a ring buffer and whose losses sit in
    a per-CPU stats array; subclasses name the program and its maps."""

    NAME = ""
    STATS: tuple[str, ...] = ()

    def __init__(self, loader: BpfLoader) -> None:
        self.loader = loader
        self.bpf: Any = None
        self.events_received = 0
        self.handler_errors = 0  # records taken whose handling failed: lost, and counted
        self.kernel_stats: dict[str, int] = dict.fromkeys(self.STATS, 0)
        self.ring: MappedRing | None = None
        self._handle: Callable[[bytes], None] = lambda _rec: None
        self._handle_batch: Callable[[Records], None] | None = None
        self._take: Any = None  # native.ring_take, when the compiled path reads the ring
        self._record_size = 0
        self.native: Any = None  # the compiled event path's module, when records take it
        self.head = b""  # the serialized node fields its events carry (open_records)
        self.encoder = ""  # how its records are encoded: compiled, or python (why)

    def open_events(
        self,
        ring: bytes,
        handle: Callable[[bytes], None],
        reader: str = "mapped",
        batch: Callable[[Records], None] | None = None,
        take: Any = None,
        record_size: int = 0,
    ) -> None:
        """Deliver the ring buffer's records (their bytes) to handle; report received and
        lost. reader "mapped": a pass over the ring's own mapping each time (ringbuf.py)
        where this machine allows it; else, or "callback", BCC's callback per record.
        batch: takes the records of each pass at once instead of handle (which takes
        each one the callback reader delivers); it counts what it cannot handle itself.
        take (native.ring_take) with record_size: the compiled path reads the mapping
        itself and hands batch the pass's records as one bytes object."""
        table = self.bpf[ring]
        self._handle = handle
        self._handle_batch = batch
        self._take, self._record_size = (take, record_size) if batch is not None else (None, 0)
        why = (
            "bpf.ring_reader: callback"
            if reader == "callback"
            else ("" if self._take is not None else ringbuf.available())
        )
        if not why:
            try:
                self.ring = MappedRing(table.map_fd, table.max_entries)
            except (OSError, ValueError) as exc:
                why = f"its mapping failed: {exc}"
        if self.ring is None:
            log.info("%s: ring buffer read through BCC's callback (%s)", self.NAME, why)
            deliver = self._deliver if batch is None else lambda rec: self._deliver_batch([rec])
            table.open_ring_buffer(lambda _ctx, data, size: deliver(ctypes.string_at(data, size)))
        self.loader.report_events(
            self.NAME,
            lambda: (
                self.events_received,
                {
                    "ringbuf_full": self.kernel_stats["ringbuf_full"],
                    "handler_error": self.handler_errors,
                },
            ),
        )

    def _deliver(self, rec: bytes) -> None:
        """One record to the handler, whichever reader took it; one the handler fails on is
        counted and logged, and the next goes on (a record taken from the ring cannot be
        read again)."""
        try:
            self._handle(rec)
        except Exception as exc:
            self.records_lost(1, exc)

    def open_records(
        self,
        ring: bytes,
        handle: Callable[[bytes], None],
        reader: str,
        encoder: str,
        compiled: Callable[[], tuple[Any, str]],
        batch: Callable[[Records], None],
        record_size: int,
        node: tuple[str, str],
    ) -> None:
        """open_events through the compiled path where encoder (events.encoder) asks for it
        and compiled() (its module, or None and why not) has one: batch takes each pass's
        records, read by native.ring_take, and encodes them with node's name and IP
        (self.head: the Event's fields 3 and 4); else handle, record by record.
        self.encoder says which: "compiled", or "python (why)"."""
        self.native, why = compiled() if encoder == "compiled" else (None, "events.encoder: python")
        self.head = pb.Event(node_name=node[0], node_ip=node[1]).SerializeToString()
        on = self.native is not None
        self.open_events(
            ring,
            handle,
            reader,
            batch if on else None,
            getattr(self.native, "ring_take", None),
            record_size,
        )
        self.encoder = "compiled" if on else f"python ({why})"

    def records_lost(self, n: int, error: BaseException | None = None, what: str = "") -> None:
        """n records taken from the ring that could not be handled (error, when one says
        why): counted (handler_errors: lens_agent_events_lost_total{reason="handler_error"})
        and logged, the first time and at each 10,000 after, with error's traceback."""
        before, self.handler_errors = self.handler_errors, self.handler_errors + n
        if before == 0 or before // 10_000 != self.handler_errors // 10_000:
            log.error(
                "%s: %d records %s (%d so far)",
                self.NAME,
                n,
                what or "could not be handled",
                self.handler_errors,
                exc_info=error,
            )

    def count(self, records: Records) -> int:
        """How many records a batch holds (a list, or whole records back to back)."""
        return len(records) // self._record_size if isinstance(records, bytes) else len(records)

    def _deliver_batch(self, records: Records) -> None:
        """A pass's records to the batch handler; if it fails as a whole, all of them are
        counted lost (handler_errors) and logged."""
        assert self._handle_batch is not None
        try:
            self._handle_batch(records)
        except Exception as exc:
            self.records_lost(self.count(records), exc)

    def poll(self, timeout_ms: int) -> None:
        """Deliver pending records (call from one thread). A program may submit without
        waking the reader (it wakes it once per batch), so what is there after the wait is
        taken whether a wakeup came or not."""
        if self.ring is not None:
            self.ring.wait(timeout_ms / 1000)
            if self._take is not None:
                whole, other = self.ring.take_whole(self._take, self._record_size)
                if other:  # records of another size: not this program's, lost and counted
                    self.events_received += other
                    self.records_lost(other, what="of an unexpected size")
                if whole:
                    self._deliver_batch(whole)
                return
            records = self.ring.take()
            if self._handle_batch is not None:
                if records:
                    self._deliver_batch(records)
                return
            for rec in records:
                self._deliver(rec)
        elif self.bpf is not None:
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
