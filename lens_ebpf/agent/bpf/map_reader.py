"""Read a kernel hash map of cumulative counters and hand on what grew since last time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Values = tuple[int, ...]


def prefill_overflow(table: Any, classes: int) -> None:
    """Create the per-(direction, class) overflow slots a full map falls back to."""
    for direction in (0, 1):
        for cls in range(classes):
            key = table.Key()
            key.direction, key.cls, key.overflow = direction, cls, 1
            table[key] = table.Leaf()


class DeltaReader:
    """Tracks one map's last values; removes keys idle for idle_seconds from the kernel.

    A key removed and created again by the kernel starts from zero, which the
    reader sees as a value below the last one and takes whole.

    The maps read this way (flows, rtt) lose a key only when this reader deletes it,
    which forgets it here too. A batch read that does not return a key it took before
    missed it: a kernel whose batch lookup passes over a bucket another context holds
    (from 5.11 until 66a7a92e4d0d, and its stable backports), or BCC 0.26's batch loop,
    which resumes a partial answer from its count instead of the kernel's token. Such a
    key is looked up alone and its growth taken then (counted in `missed`): forgetting it
    would take its whole value again when it next shows, every byte it held twice.
    """

    def __init__(
        self,
        flatten: Callable[[Any], Values],
        idle_seconds: float,
        clock: Callable[[], float],
        pinned: Callable[[Any], bool] = lambda key: False,
    ) -> None:
        self._flatten = flatten
        self._idle = idle_seconds
        self._clock = clock
        self._pinned = pinned  # keys never removed (the overflow slots)
        self._last: dict[bytes, Values] = {}
        self._changed: dict[bytes, float] = {}
        self.missed = 0  # keys a batch read did not return that the map still held

    def read(self, table: Any) -> Iterator[tuple[Any, Values]]:
        """(key, increase per value) for each key that grew since the last read."""
        now = self._clock()
        seen: set[bytes] = set()
        for key, val in table.items_lookup_batch():
            raw = bytes(key)
            seen.add(raw)
            grew = self._take(raw, self._flatten(val), now)
            if grew is not None:
                yield key, grew
        for raw in [raw for raw in self._last if raw not in seen]:
            key = table.Key.from_buffer_copy(raw)
            val = table.get(key)
            if val is None:  # gone: deleted by someone else
                del self._last[raw]
                self._changed.pop(raw, None)
                continue
            self.missed += 1
            grew = self._take(raw, self._flatten(val), now)
            if grew is not None:
                yield key, grew
        self._expire(table, now)

    def _take(self, raw: bytes, cur: Values, now: float) -> Values | None:
        """What grew since the last values taken of this key (None: nothing)."""
        old = self._last.get(raw)
        if old == cur:
            return None
        if old is None or any(c < o for c, o in zip(cur, old, strict=True)):
            old = (0,) * len(cur)
        self._last[raw] = cur
        self._changed[raw] = now
        return tuple(c - o for c, o in zip(cur, old, strict=True))

    def _expire(self, table: Any, now: float) -> None:
        for raw in list(self._last):
            if now - self._changed.get(raw, now) < self._idle:
                continue
            key = table.Key.from_buffer_copy(raw)
            if self._pinned(key):
                continue
            val = table.get(key)
            if val is not None and self._flatten(val) != self._last[raw]:
                continue  # it grew since this read: the next one takes that
            try:
                del table[key]
            except KeyError:
                # gone, or refused (a bucket another context holds: EBUSY): kept while
                # the kernel still has it, or its whole value would count again
                if table.get(key) is not None:
                    continue
            del self._last[raw]
            del self._changed[raw]

    def __len__(self) -> int:
        return len(self._last)

    def last(self, raw: bytes) -> Values | None:
        """The values last taken for the key with these bytes (None: not tracked)."""
        return self._last.get(raw)
