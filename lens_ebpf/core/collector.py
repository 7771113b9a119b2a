"""Periodic collectors: each refreshes on its own interval, never inside a scrape.

A collector's refresh() builds fresh metric families (and optional JSON views); the
scrape only hands out the last set. The agent's device, kubelet and tuner features are
such collectors (lens_ebpf/agent/feature.py, CollectorFeature).
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.core.exposition import counter, gauge
from lens_ebpf.core.runner import Job, Runner

log = logging.getLogger(__name__)


class CollectorError(Exception):
    """A refresh that failed; reason is a short word for the errors metric."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class PeriodicCollector(abc.ABC):
    """Base: subclasses set name and implement refresh() -> list of Metric."""

    name = "base"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.families: list[Metric] = []
        self.views: dict[str, Any] = {}  # JSON views for REST routes
        self.duration = 0.0
        self.success = False
        self.runs = 0
        self.errors: dict[str, int] = {}
        self.last_error = ""
        self._lock = threading.Lock()

    @abc.abstractmethod
    def refresh(self) -> list[Metric]:
        """Read the source and build this round's metric families."""

    def count_error(self, reason: str) -> None:
        """Count a failure that did not stop the refresh (a parse error, say)."""
        with self._lock:
            self.errors[reason] = self.errors.get(reason, 0) + 1

    def run_once(self) -> None:
        started = time.monotonic()
        try:
            families = self.refresh()
        except CollectorError as exc:
            self._failed(exc.reason, str(exc))
        except Exception as exc:  # a broken collector must not stop the others
            log.exception("collector %s failed", self.name)
            self._failed("exception", str(exc))
        else:
            with self._lock:
                self.families = families
                self.success = True
                self.last_error = ""
        finally:
            self.duration = time.monotonic() - started
            self.runs += 1

    def _failed(self, reason: str, message: str) -> None:
        self.count_error(reason)
        with self._lock:
            self.success = False
            self.last_error = message
        log.warning("collector %s: %s", self.name, message)

    def snapshot(self) -> list[Metric]:
        with self._lock:
            return list(self.families)


class CollectorSet(Collector):
    """Runs collectors on their intervals (jobs of a runner, lens_ebpf/core/runner.py) and
    exposes their metrics and their own health."""

    def __init__(
        self, collectors: list[PeriodicCollector] | None = None, runner: Runner | None = None
    ) -> None:
        self.collectors = {c.name: c for c in collectors or []}
        self.runner = runner if runner is not None else Runner(name="collectors")

    def add(self, collector: PeriodicCollector) -> None:
        self.collectors[collector.name] = collector

    def start(self) -> None:
        """A first refresh of each (data before the first scrape), then the runner."""
        for c in self.collectors.values():
            c.run_once()
            self.runner.add(Job(f"collector-{c.name}", c.interval, c.run_once, leader_only=False))
        self.runner.start()

    def stop(self) -> None:
        self.runner.stop()

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        dur = gauge("lens_agent_collector_duration_seconds", "Last refresh time")
        ok = gauge("lens_agent_collector_success", "1 when the last refresh worked")
        errs = counter("lens_agent_collector_errors", "Refresh errors by reason")
        runs = counter("lens_agent_collector_runs", "Refreshes")
        for c in self.collectors.values():
            yield from c.snapshot()
            lbl = {"collector": c.name}
            dur.add(lbl, c.duration)
            ok.add(lbl, 1.0 if c.success else 0.0)
            runs.add(lbl, c.runs)
            for reason, n in sorted(c.errors.items()):
                errs.add({**lbl, "reason": reason}, n)
        yield from (dur, ok, errs, runs)
