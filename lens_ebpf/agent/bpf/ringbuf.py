"""A BPF ring buffer read from its own mapping, a pass over every record ready, rather
than through BCC's ctypes callback: a trip from C into the interpreter per record cost
about 2 us here, as much as decoding the record.

The kernel lays the map out (kernel/bpf/ringbuf.c, Linux 5.8+) as: a page holding the
consumer position, which the reader writes; a page holding the producer position; the
data area, mapped twice in a row so a record that wraps around the end reads as one
piece. A record starts with an 8-byte header: its length, with the BUSY bit (31: still
being written) and the DISCARD bit (30: its producer dropped it), then a page offset;
records start 8-byte aligned. The kernel writes a record's data before it clears BUSY,
and reads the consumer position to know what space is free.

Each pass reads the producer position, then each record's header and, when it is
committed, copies its data out (one load of the header before the data's: x86-64 keeps
loads in order, and keeps the position's store after them); at a BUSY record it stops
(it and what follows wait for the next pass). Then it stores the new consumer position,
one aligned 8-byte store. Where the CPU may reorder those, the agent keeps BCC's reader
(available()).
"""

from __future__ import annotations

import mmap
import platform
import select
from typing import Any

BUSY = 1 << 31
DISCARD = 1 << 30
HEADER = 8


def available() -> str:
    """Why records are not read from the mapping on this machine; empty when they are."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"{platform.machine()}: its loads and stores need barriers Python cannot give"
    return ""


class MappedRing:
    """One ring buffer map, by its fd and its data size (max_entries: a power of two)."""

    def __init__(self, map_fd: int, size: int) -> None:
        if size <= 0 or size & (size - 1):
            raise ValueError(f"ring buffer size {size}: not a power of two")
        page = mmap.PAGESIZE
        self.mask = size - 1
        self._consumer = mmap.mmap(
            map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0
        )
        try:
            self._producer = mmap.mmap(
                map_fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page
            )
        except BaseException:
            self._consumer.close()
            raise
        # The positions and headers are read and the consumer position written through
        # memoryviews of native words: one aligned load or store each. struct.pack_into
        # zeroes its target before it writes it: the kernel, reading the consumer position
        # in between, saw a position of 0, a ring "full", and dropped records (3 to 29 a
        # run in the bench).
        self._data = memoryview(self._producer)[page:]
        self._headers = self._data.cast("I")
        self._cons = memoryview(self._consumer).cast("Q")
        self._prod = memoryview(self._producer)[:8].cast("Q")
        self._epoll = select.epoll()
        self._epoll.register(map_fd, select.EPOLLIN)

    def wait(self, timeout: float) -> None:
        """Until the kernel wakes the reader (a program asked for it), or timeout seconds."""
        self._epoll.poll(timeout)

    def pending(self) -> int:
        """Bytes between the consumer and producer positions (records and their headers)."""
        return int(self._prod[0] - self._cons[0])

    def take_whole(self, take: Any, size: int) -> tuple[bytes, int]:
        """take, as the compiled reader does it (native.ring_take: with acquire loads and
        a release store, so on any CPU): the records of size bytes back to back in one
        bytes object, and how many of another size it passed over."""
        got: tuple[bytes, int] = take(
            self._consumer, self._producer, self.mask, mmap.PAGESIZE, size
        )
        return got

    def take(self) -> list[bytes]:
        """Every record committed now, oldest first; their space goes back to the kernel
        before they are returned."""
        start = cons = self._cons[0]
        prod = self._prod[0]
        data, headers, mask = self._data, self._headers, self.mask
        out: list[bytes] = []
        append = out.append
        while cons < prod:
            at = cons & mask
            length = headers[at >> 2]
            if length & BUSY:
                break
            size = length & ~(BUSY | DISCARD)
            if not length & DISCARD:
                append(data[at + HEADER : at + HEADER + size].tobytes())
            cons += (size + HEADER + 7) & ~7
        if cons != start:
            self._cons[0] = cons
        return out
