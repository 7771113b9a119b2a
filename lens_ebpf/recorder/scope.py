"""The cluster a question is about: its name, its Prometheus, its storage scan's totals, and
its rows of the shared tables."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lens_ebpf.recorder import prom
from lens_ebpf.recorder.store.schema import Scoped, scoped


@dataclass(frozen=True)
class Scope:
    """The cluster a request or a job asks about (`?cluster=`); its tables are its rows only."""

    name: str
    prom: prom.Prom
    storage: Callable[[], dict[str, float]] | None = None

    @property
    def tables(self) -> Scoped:
        return scoped(self.name)
