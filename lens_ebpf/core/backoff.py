"""Exponential backoff with jitter, for whatever reconnects (the API watches, the reporter)."""

from __future__ import annotations

import random


class Backoff:
    """Waits of first, 2*first, 4*first ... up to cap, each scaled by a random factor in
    jitter so that many agents do not retry in step; reset() after a success."""

    def __init__(
        self, cap: float, first: float = 0.5, jitter: tuple[float, float] = (0.5, 1.0)
    ) -> None:
        self.cap, self.first, self.jitter = cap, first, jitter
        self.delay = 0.0

    def reset(self) -> None:
        self.delay = 0.0

    def next(self) -> float:
        """The wait before the next try."""
        self.delay = min(self.cap, self.delay * 2 if self.delay else self.first)
        return self.delay * random.uniform(*self.jitter)
