"""TTL metric cache: series come and go with flows and processes, memory stays bounded.

Each family keeps its series in a TTL cache with a cap. A series not updated for
its TTL leaves (counted as an eviction); a new series beyond the cap is refused
(counted), while series already present keep updating. Counters only go up while
their series lives.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from lens_ebpf.core.exposition import RenderedFamily, counter, escape_value, family, gauge

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
INF = float("inf")

Labels = tuple[str, ...]


class _Series:
    """One series: its value, when it was last written, and its exposition line(s)
    without the value, made on first rendering and kept while the series lives."""

    __slots__ = ("value", "touched", "lines")

    def __init__(self, value: Any, touched: float) -> None:
        self.value = value
        self.touched = touched
        self.lines: Any = None


@dataclass
class Family:
    """One metric family and its live series, least recently written first."""

    name: str
    kind: str
    help: str
    labelnames: tuple[str, ...]
    ttl: float
    max_series: int
    buckets: tuple[float, ...] = ()
    series: OrderedDict[Labels, _Series] = field(default_factory=OrderedDict, repr=False)
    refused: int = 0  # new series refused at this family's cap
    refused_budget: int = 0  # new series refused at the cache's total budget
    evicted: int = 0

    def __post_init__(self) -> None:
        if self.kind == HISTOGRAM and (not self.buckets or self.buckets[-1] != INF):
            self.buckets = (*self.buckets, INF)

    @property
    def samples_per_series(self) -> int:
        """Exposition lines one series takes: buckets, _count and _sum for a histogram."""
        return len(self.buckets) + 2 if self.kind == HISTOGRAM else 1

    def expire(self, now: float) -> int:
        """Remove the series not written for the TTL; how many."""
        series, gone = self.series, 0
        while series:
            first = next(iter(series.values()))
            if now - first.touched < self.ttl:
                break
            series.popitem(last=False)
            gone += 1
        self.evicted += gone
        return gone

    def items(self) -> list[tuple[Labels, Any]]:
        return [(labels, s.value) for labels, s in self.series.items()]


class MetricCache:
    """Families of series with a time-to-live and a cap each, and a budget of exposition
    lines for all of them together; thread-safe."""

    def __init__(
        self,
        ttl_seconds: float = 600,
        max_series: int = 20000,
        overrides: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_samples: int = 0,
    ) -> None:
        self._ttl = ttl_seconds
        self._max = max_series
        self._overrides = dict(overrides or {})
        self._clock = clock
        self._lock = threading.Lock()
        self._families: dict[str, Family] = {}
        self.max_samples = max_samples  # 0: no budget
        self.samples = 0  # exposition lines the live series take
        self._swept = -INF

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
            self._families[name] = fam
            return fam

    def family(self, name: str) -> Family:
        return self._families[name]

    def _expire(self, fam: Family, now: float) -> int:
        """Expire one family, its lines leaving the budget; how many series went."""
        gone = fam.expire(now)
        self.samples -= gone * fam.samples_per_series
        return gone

    def _expire_all(self, now: float) -> int:
        self._swept = now
        return sum(self._expire(fam, now) for fam in self._families.values())

    def _slot(self, fam: Family, labels: Labels, now: float) -> _Series | None:
        """The series for labels: present (moved to the young end), new when there is
        room, or None when refused (counted)."""
        s = fam.series.get(labels)
        if s is not None:
            fam.series.move_to_end(labels)
            s.touched = now
            return s
        if len(labels) != len(fam.labelnames):
            raise ValueError(f"{fam.name}: expected labels {fam.labelnames}, got {labels}")
        cost = fam.samples_per_series
        if len(fam.series) >= fam.max_series:
            self._expire(fam, now)
            if len(fam.series) >= fam.max_series:
                fam.refused += 1
                return None
        if self.max_samples and self.samples + cost > self.max_samples:
            if now - self._swept >= 1.0:  # a storm of refusals sweeps once a second
                self._expire_all(now)
            if self.samples + cost > self.max_samples:
                fam.refused_budget += 1
                return None
        s = fam.series[labels] = _Series(None, now)
        self.samples += cost
        return s

    def inc(self, name: str, labels: Labels, amount: float = 1.0) -> bool:
        """Add to a counter series; False when the series was refused at the cap."""
        if amount < 0:
            raise ValueError(f"{name}: counters only go up (got {amount})")
        with self._lock:
            s = self._slot(self._families[name], labels, self._clock())
            if s is None:
                return False
            s.value = (s.value or 0.0) + amount
            return True

    def set(self, name: str, labels: Labels, value: float) -> bool:
        """Set a gauge series."""
        with self._lock:
            s = self._slot(self._families[name], labels, self._clock())
            if s is None:
                return False
            s.value = float(value)
            return True

    def observe(self, name: str, labels: Labels, counts: Sequence[int], total: float) -> bool:
        """Add per-bucket (not cumulative) counts and their sum to a histogram series."""
        with self._lock:
            fam = self._families[name]
            if len(counts) != len(fam.buckets):
                raise ValueError(f"{name}: {len(fam.buckets)} buckets, got {len(counts)}")
            s = self._slot(fam, labels, self._clock())
            if s is None:
                return False
            if s.value is None:
                s.value = (list(counts), float(total))
            else:
                merged = [a + b for a, b in zip(s.value[0], counts, strict=True)]
                s.value = (merged, s.value[1] + total)
            return True

    def move(self, name: str, labels: Labels, to_name: str, to_labels: Labels) -> bool:
        """Move a series whole into another of the same kind (created if absent, else added
        to: a counter's value, a histogram's counts and sum), the first one gone: counts
        that were labelled before it was known whose they are. False, nothing changed, when
        there is no such series (expired, or moved already) or the target is refused (a full
        family or budget: counted as any new series refused)."""
        if (name, labels) == (to_name, to_labels):
            return False
        with self._lock:
            src, dst = self._families[name], self._families[to_name]
            if src.kind != dst.kind:
                raise ValueError(f"{name} is a {src.kind}, {to_name} a {dst.kind}")
            s = src.series.get(labels)
            if s is None:
                return False
            d = self._slot(dst, to_labels, self._clock())
            if d is None:
                return False
            if src.series.pop(labels, None) is not None:  # not expired making room for d
                self.samples -= src.samples_per_series
            if d.value is None:
                d.value = s.value
            elif dst.kind == HISTOGRAM:
                counts = [a + b for a, b in zip(d.value[0], s.value[0], strict=True)]
                d.value = (counts, d.value[1] + s.value[1])
            else:
                d.value += s.value
            return True

    def expire(self) -> int:
        """Remove every series past its TTL now; how many."""
        with self._lock:
            return self._expire_all(self._clock())

    def get(self, name: str, labels: Labels) -> Any:
        """The live value of a series, or None."""
        with self._lock:
            s = self._families[name].series.get(labels)
            return None if s is None else s.value

    def snapshot_family(self, name: str) -> list[tuple[Labels, Any]]:
        """A copy of one family's live series."""
        with self._lock:
            fam = self._families[name]
            self._expire(fam, self._clock())
            return fam.items()

    def snapshot(self) -> list[tuple[Family, list[tuple[Labels, Any]]]]:
        """Each family with a copy of its live series, taken under the lock."""
        with self._lock:
            self._expire_all(self._clock())
            return [(fam, fam.items()) for fam in self._families.values()]

    def render(self) -> list[tuple[Family, int, str]]:
        """Each family's live series as exposition text (without HELP and TYPE): its
        series count and its lines. A series' lines without their values are made once
        and kept while it lives; labels with empty values are left out (to Prometheus
        an empty label is no label). Rendered under the lock, so writers wait for it."""
        out = []
        with self._lock:
            self._expire_all(self._clock())
            for fam in self._families.values():
                out.append((fam, len(fam.series), _render_family(fam)))
        return out


def _label_text(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{k}="{escape_value(v)}"' for k, v in zip(names, values, strict=True) if v]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _render_family(fam: Family) -> str:
    out: list[str] = []
    names, name = fam.labelnames, fam.name
    if fam.kind == HISTOGRAM:
        les = [f'le="{floatToGoString(b)}"' for b in fam.buckets]
        for labels, s in fam.series.items():
            lines = s.lines
            if lines is None:
                lines = s.lines = (
                    [f"{name}_bucket{_label_text(names, labels, le)} " for le in les],
                    f"{name}_count{_label_text(names, labels)} ",
                    f"{name}_sum{_label_text(names, labels)} ",
                )
            counts, total = s.value
            acc = 0
            for prefix, n in zip(lines[0], counts, strict=True):
                acc += n
                out.append(f"{prefix}{floatToGoString(acc)}\n")
            out.append(f"{lines[1]}{floatToGoString(acc)}\n")
            out.append(f"{lines[2]}{floatToGoString(total)}\n")
    else:
        for labels, s in fam.series.items():
            if s.lines is None:
                s.lines = f"{name}{_label_text(names, labels)} "
            out.append(f"{s.lines}{floatToGoString(s.value)}\n")
    return "".join(out)


def _samples(fam: Family) -> list[Any]:
    return family_metrics(fam, fam.items()).samples


def _base_name(fam: Family) -> str:
    # prometheus_client names a counter family without _total; the seed names have none.
    if fam.kind == COUNTER and fam.name.endswith("_total"):
        return fam.name[: -len("_total")]
    return fam.name


def family_metrics(fam: Family, series: Iterable[tuple[Labels, Any]]) -> Metric:
    """Turn one family's series into a prometheus_client Metric."""
    # a counter's samples named as registered: with _total or (the seed's) without
    metric = family(_base_name(fam), fam.help, fam.kind, total=fam.name.endswith("_total"))
    names = fam.labelnames
    if fam.kind == HISTOGRAM:
        bounds = [floatToGoString(b) for b in fam.buckets]
        for labels, (counts, total) in series:
            cumulative = itertools.accumulate(counts)
            metric.add_buckets(
                dict(zip(names, labels, strict=True)),
                zip(bounds, cumulative, strict=True),
                total,
            )
    else:
        for labels, value in series:
            metric.add(dict(zip(names, labels, strict=True)), value)
    return metric


class CacheCollector(Collector):
    """Exposes a MetricCache (already rendered as text; samples built only when asked
    for) and the cache's own size, evictions and refusals."""

    def __init__(self, cache: MetricCache) -> None:
        self._cache = cache

    def describe(self) -> Iterator[Metric]:
        # Registering must not trigger a collection.
        return iter(())

    def collect(self) -> Iterator[Metric]:
        size = gauge("lens_agent_cache_series", "Live series per metric family")
        evicted = counter("lens_agent_cache_evictions", "Series removed after their TTL")
        refused = counter("lens_agent_cache_refused", "New series refused at the family cap")
        over = counter(
            "lens_agent_cache_budget_refused",
            "New series refused at the cache's budget of exposition lines (cache.max_samples)",
        )
        cap = gauge("lens_agent_cache_max_series", "Series cap per metric family")
        for fam, n, text in self._cache.render():
            if n:
                yield RenderedFamily(
                    _base_name(fam),
                    fam.name,
                    fam.help,
                    fam.kind,
                    text,
                    functools.partial(_samples, fam),
                )
            lbl = {"family": fam.name}
            size.add(lbl, n)
            evicted.add(lbl, fam.evicted)
            refused.add(lbl, fam.refused)
            over.add(lbl, fam.refused_budget)
            cap.add(lbl, fam.max_series)
        samples = gauge("lens_agent_cache_samples", "Exposition lines the cached series take")
        samples.add({}, self._cache.samples)
        yield from (size, evicted, refused, over, cap, samples)
        if self._cache.max_samples:
            budget = gauge(
                "lens_agent_cache_max_samples", "Budget of exposition lines for all cached series"
            )
            budget.add({}, self._cache.max_samples)
            yield budget
