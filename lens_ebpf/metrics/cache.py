"""TTL metric cache: series come and go with flows and processes, memory stays bounded.

Each family keeps its series in a TTL cache with a cap. A series not updated for
its TTL leaves (counted as an eviction); a new series beyond the cap is refused
(counted), while series already present keep updating. Counters only go up while
their series lives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachetools import TTLCache
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
INF = float("inf")

Labels = tuple[str, ...]


class _CountingTTLCache(TTLCache[Labels, Any]):
    """A TTLCache that counts what its expiry removes (it also expires inside set)."""

    def __init__(self, maxsize: int, ttl: float, timer: Callable[[], float]) -> None:
        # One slot of headroom: the cap is enforced before insertion, never by LRU eviction.
        super().__init__(maxsize=maxsize + 1, ttl=ttl, timer=timer)
        self.expired = 0

    def expire(self, time: float | None = None) -> list[tuple[Labels, Any]]:
        gone = list(super().expire(time))
        self.expired += len(gone)
        return gone


@dataclass
class Family:
    """One metric family and its live series."""

    name: str
    kind: str
    help: str
    labelnames: tuple[str, ...]
    ttl: float
    max_series: int
    buckets: tuple[float, ...] = ()
    series: _CountingTTLCache = field(init=False, repr=False)
    refused: int = 0

    def __post_init__(self) -> None:
        if self.kind == HISTOGRAM and (not self.buckets or self.buckets[-1] != INF):
            self.buckets = (*self.buckets, INF)

    def make_series(self, clock: Callable[[], float]) -> None:
        self.series = _CountingTTLCache(self.max_series, self.ttl, clock)

    @property
    def evicted(self) -> int:
        return self.series.expired


class MetricCache:
    """Families of series with a time-to-live and a cap each; thread-safe."""

    def __init__(
        self,
        ttl_seconds: float = 600,
        max_series: int = 20000,
        overrides: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl_seconds
        self._max = max_series
        self._overrides = dict(overrides or {})
        self._clock = clock
        self._lock = threading.Lock()
        self._families: dict[str, Family] = {}

    def register(
        self,
        name: str,
        kind: str,
        help: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = (),
    ) -> Family:
        """Declare a family; registering the same name twice returns the first."""
        if kind not in (COUNTER, GAUGE, HISTOGRAM):
            raise ValueError(f"unknown metric kind {kind!r}")
        with self._lock:
            if name in self._families:
                return self._families[name]
            over = self._overrides.get(name)
            ttl = getattr(over, "ttl_seconds", None) or self._ttl
            cap = getattr(over, "max_series", None) or self._max
            fam = Family(name, kind, help, tuple(labelnames), ttl, cap, tuple(buckets))
            fam.make_series(self._clock)
            self._families[name] = fam
            return fam

    def family(self, name: str) -> Family:
        return self._families[name]

    def _slot(self, fam: Family, labels: Labels) -> bool:
        """True when labels may hold a series (present, or room for a new one)."""
        if len(labels) != len(fam.labelnames):
            raise ValueError(f"{fam.name}: expected labels {fam.labelnames}, got {labels}")
        if labels in fam.series:
            return True
        if len(fam.series) >= fam.max_series:
            fam.series.expire()
            if len(fam.series) >= fam.max_series:
                fam.refused += 1
                return False
        return True

    def inc(self, name: str, labels: Labels, amount: float = 1.0) -> bool:
        """Add to a counter series; False when the series was refused at the cap."""
        if amount < 0:
            raise ValueError(f"{name}: counters only go up (got {amount})")
        with self._lock:
            fam = self._families[name]
            if not self._slot(fam, labels):
                return False
            fam.series[labels] = fam.series.get(labels, 0.0) + amount
            return True

    def set(self, name: str, labels: Labels, value: float) -> bool:
        """Set a gauge series."""
        with self._lock:
            fam = self._families[name]
            if not self._slot(fam, labels):
                return False
            fam.series[labels] = float(value)
            return True

    def observe(self, name: str, labels: Labels, counts: Sequence[int], total: float) -> bool:
        """Add per-bucket (not cumulative) counts and their sum to a histogram series."""
        with self._lock:
            fam = self._families[name]
            if len(counts) != len(fam.buckets):
                raise ValueError(f"{name}: {len(fam.buckets)} buckets, got {len(counts)}")
            if not self._slot(fam, labels):
                return False
            old = fam.series.get(labels)
            if old is None:
                fam.series[labels] = (list(counts), float(total))
            else:
                merged = [a + b for a, b in zip(old[0], counts, strict=True)]
                fam.series[labels] = (merged, old[1] + total)
            return True

    def get(self, name: str, labels: Labels) -> Any:
        """The live value of a series, or None."""
        with self._lock:
            return self._families[name].series.get(labels)

    def snapshot_family(self, name: str) -> list[tuple[Labels, Any]]:
        """A copy of one family's live series."""
        with self._lock:
            fam = self._families[name]
            fam.series.expire()
            return list(fam.series.items())

    def snapshot(self) -> list[tuple[Family, list[tuple[Labels, Any]]]]:
        """Each family with a copy of its live series, taken under the lock."""
        with self._lock:
            out = []
            for fam in self._families.values():
                fam.series.expire()
                out.append((fam, list(fam.series.items())))
            return out


def _base_name(fam: Family) -> str:
    # prometheus_client names a counter family without _total; the seed names have none.
    if fam.kind == COUNTER and fam.name.endswith("_total"):
        return fam.name[: -len("_total")]
    return fam.name


def family_metrics(fam: Family, series: Iterable[tuple[Labels, Any]]) -> Metric:
    """Turn one family's series into a prometheus_client Metric."""
    metric = Metric(_base_name(fam), fam.help, fam.kind)
    names = fam.labelnames
    if fam.kind == HISTOGRAM:
        bounds = [floatToGoString(b) for b in fam.buckets]
        for labels, (counts, total) in series:
            base = dict(zip(names, labels, strict=True))
            acc = 0
            for bound, n in zip(bounds, counts, strict=True):
                acc += n
                metric.add_sample(fam.name + "_bucket", {**base, "le": bound}, acc)
            metric.add_sample(fam.name + "_count", base, acc)
            metric.add_sample(fam.name + "_sum", base, total)
    else:
        for labels, value in series:
            metric.add_sample(fam.name, dict(zip(names, labels, strict=True)), value)
    return metric


class CacheCollector(Collector):
    """Exposes a MetricCache and the cache's own size, evictions and refusals."""

    def __init__(self, cache: MetricCache) -> None:
        self._cache = cache

    def describe(self) -> Iterator[Metric]:
        # Registering must not trigger a collection.
        return iter(())

    def collect(self) -> Iterator[Metric]:
        size = Metric("lens_agent_cache_series", "Live series per metric family", GAUGE)
        evicted = Metric("lens_agent_cache_evictions", "Series removed after their TTL", COUNTER)
        refused = Metric(
            "lens_agent_cache_refused", "New series refused at the family cap", COUNTER
        )
        cap = Metric("lens_agent_cache_max_series", "Series cap per metric family", GAUGE)
        for fam, series in self._cache.snapshot():
            if series:
                yield family_metrics(fam, series)
            lbl = {"family": fam.name}
            size.add_sample("lens_agent_cache_series", lbl, len(series))
            evicted.add_sample("lens_agent_cache_evictions_total", lbl, fam.evicted)
            refused.add_sample("lens_agent_cache_refused_total", lbl, fam.refused)
            cap.add_sample("lens_agent_cache_max_series", lbl, fam.max_series)
        yield from (size, evicted, refused, cap)
