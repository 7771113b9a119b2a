"""Read a kernel hash map of cumulative counters and hand on what grew since last time."""

from __future__ import annotations

import contextlib
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

    def read(self, table: Any) -> Iterator[tuple[Any, Values]]:
        """(key, increase per value) for each key that grew since the last read."""
        now = self._clock()
        seen: set[bytes] = set()
        for key, val in table.items_lookup_batch():
            raw = bytes(key)
            seen.add(raw)
            cur = self._flatten(val)
            old = self._last.get(raw)
            if old == cur:
                continue
            if old is None or any(c < o for c, o in zip(cur, old, strict=True)):
                old = (0,) * len(cur)
            self._last[raw] = cur
            self._changed[raw] = now
            yield key, tuple(c - o for c, o in zip(cur, old, strict=True))
        self._expire(table, now, seen)

    def _expire(self, table: Any, now: float, seen: set[bytes]) -> None:
        for raw in list(self._last):
            if raw not in seen:
                del self._last[raw]
                self._changed.pop(raw, None)
                continue
            if now - self._changed.get(raw, now) < self._idle:
                continue
            key = table.Key.from_buffer_copy(raw)
            if self._pinned(key):
                continue
            with contextlib.suppress(KeyError):
                del table[key]
            del self._last[raw]
            del self._changed[raw]

    def __len__(self) -> int:
        return len(self._last)
