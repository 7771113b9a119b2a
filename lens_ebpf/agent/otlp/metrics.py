"""The metrics the agent serves on /metrics as one OTLP ExportMetricsServiceRequest.

Each family becomes a metric of the same name, a counter's without `_total` (an OTLP
consumer that writes Prometheus adds it back): a counter a cumulative monotonic Sum, a
gauge a Gauge, a histogram a cumulative Histogram with the family's own bounds (the same
buckets /metrics shows), a summary a Summary. Its labels are the data point's attributes
under their own names, empty ones left out as /metrics leaves them; a series whose
`namespace` and `pod` name a pod goes under that pod's resource, those labels (and
`container`, `container_id`, `pod_uid`, a `workload_kind` with its `workload`) becoming
the resource's attributes (semconv.py).

A cumulative point carries the time its series started: the exporter's start for a series
it saw in its first snapshot, else the snapshot before the one that first saw it; a
counter or histogram that went down (its series evicted and made again) starts again at
the previous snapshot.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue as PbAnyValue
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric as PbMetric
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from prometheus_client.core import Metric

from lens_ebpf.agent.otlp import semconv, wire
from lens_ebpf.agent.otlp.semconv import NODE, OWNER_FIELDS, Owner
from lens_ebpf.core.exposition import RenderedFamily

COUNTER, GAUGE, HISTOGRAM, SUMMARY = "counter", "gauge", "histogram", "summary"
# base-unit suffixes (docs/reference/metric-conventions.md) -> UCUM, longest first
UNITS = (
    ("_bytes_per_second", "By/s"),
    ("_seconds", "s"),
    ("_bytes", "By"),
    ("_joules", "J"),
    ("_watts", "W"),
    ("_celsius", "Cel"),
    ("_ratio", "1"),
    ("_percent", "%"),
    ("_mhz", "MHz"),
)
# Metric's data field, and its data points' attributes field, by kind
_DATA_FIELD = {GAUGE: 5, COUNTER: 7, HISTOGRAM: 9, SUMMARY: 11}
_ATTR_FIELD = {GAUGE: 7, COUNTER: 7, HISTOGRAM: 9, SUMMARY: 7}
CUMULATIVE = 2  # AggregationTemporality
_SUM_TRAILER = wire.uint(2, CUMULATIVE) + wire.uint(3, 1)  # cumulative, monotonic
_HIST_TRAILER = wire.uint(2, CUMULATIVE)
_NUMBER = struct.Struct("<BQBQBd")  # start_time_unix_nano, time_unix_nano, as_double
_GAUGE = struct.Struct("<BQBd")  # time_unix_nano, as_double
_HIST_HEAD = struct.Struct("<BQBQ")  # start, time; count and sum follow
_Q = struct.Struct("<Q")
_D = struct.Struct("<d")


def otlp_name(name: str, kind: str) -> str:
    """A family's OTLP metric name: a counter's without `_total`."""
    return name.removesuffix("_total") if kind == COUNTER else name


def unit(name: str) -> str:
    """The UCUM unit the name's base-unit suffix says; "" without one."""
    base = name.removesuffix("_total")
    return next((u for suffix, u in UNITS if base.endswith(suffix)), "")


def pod_labels(labelnames: Iterable[str]) -> list[str]:
    """The labels of a family that name a pod's resource (when its namespace and pod are
    set), in semconv.OWNER_FIELDS order; none unless it has namespace and pod."""
    names = set(labelnames)
    if not {"namespace", "pod"} <= names:
        return []
    out = [f for f in OWNER_FIELDS[:5] if f in names]
    if {"workload_kind", "workload"} <= names:
        out += ["workload_kind", "workload"]
    return out


@dataclass
class FamilyView:
    """One family's live series as the encoder takes them: a counter's or gauge's value
    a float; a histogram's (counts per bucket, the last above every bound; sum); a
    summary's (count, sum, ((quantile, value), ...))."""

    name: str
    kind: str
    help: str
    labelnames: tuple[str, ...]
    series: list[tuple[tuple[str, ...], Any]]
    bounds: tuple[float, ...] = ()  # a histogram's upper bounds, +Inf left out


@dataclass
class _Plan:
    """How one family's series are written: its metric's header, its attributes' keys, and
    which labels name the resource."""

    header: bytes
    attrs: wire.StringAttributes
    owner_at: tuple[int, ...]  # for each of OWNER_FIELDS, its label's index, or -1
    moved: frozenset[int]  # the label indices that go to a pod's resource
    bounds: bytes = b""  # a histogram's explicit_bounds field


@dataclass(slots=True)
class _Series:
    attrs: bytes
    owner: Owner
    start: int
    last: float


@dataclass
class Snapshot:
    """One request's bytes and the data points it holds."""

    body: bytes
    points: int
    families: int = 0


@dataclass
class MetricsEncoder:
    """Makes ExportMetricsServiceRequests from the agent's families, snapshot after
    snapshot, remembering each series' start time and attributes while it lives."""

    node: list[tuple[str, str]]  # the node's resource attributes (semconv.node_attributes)
    scope_version: str = ""
    started_ns: int = 0  # the exporter's start: what a series seen at first began at
    _plans: dict[tuple[str, str, tuple[str, ...]], _Plan] = field(default_factory=dict)
    _series: dict[str, dict[tuple[str, ...], _Series]] = field(default_factory=dict)
    _resources: dict[Owner, bytes] = field(default_factory=dict)
    _last_ns: int = 0

    def __post_init__(self) -> None:
        self._scope = wire.ld(
            1,
            InstrumentationScope(name="lens-ebpf", version=self.scope_version).SerializeToString(),
        )

    def encode(self, families: Iterable[FamilyView], now_ns: int) -> Snapshot:
        """One ExportMetricsServiceRequest of these families at now_ns."""
        begun = self._last_ns or self.started_ns or now_ns  # a new series began after it
        by_owner: dict[Owner, list[bytes]] = {}
        points = nfam = 0
        seen: dict[str, dict[tuple[str, ...], _Series]] = {}
        for fam in families:
            if not fam.series:
                continue
            nfam += 1
            plan = self._plan(fam)
            write = _WRITERS[fam.kind]
            before = self._series.get(fam.name, {})
            now_series = seen.setdefault(fam.name, {})
            groups: dict[Owner, list[bytes]] = {}
            for labels, value in fam.series:
                s = before.get(labels) or now_series.get(labels)
                if s is None:
                    ns, pod = plan.owner_at[0], plan.owner_at[1]
                    if ns >= 0 and labels[ns] and labels[pod]:  # a pod's series
                        owner = tuple(labels[i] if i >= 0 else "" for i in plan.owner_at)
                        attrs = plan.attrs.encode(labels, plan.moved)
                    else:
                        owner, attrs = NODE, plan.attrs.encode(labels)
                    s = _Series(attrs, owner, begun, 0.0)
                now_series[labels] = s
                point = write(s, value, now_ns, begun, plan)
                groups.setdefault(s.owner, []).append(point)
                points += 1
            dfield, trailer = _DATA_FIELD[fam.kind], _TRAILERS[fam.kind]
            for owner, pts in groups.items():
                data = wire.ld_many(1, pts) + trailer
                by_owner.setdefault(owner, []).append(plan.header + wire.ld(dfield, data))
        self._series = seen
        self._last_ns = now_ns
        body = wire.ld_many(
            1,
            (
                wire.ld(1, self._resource(owner))
                + wire.ld(2, self._scope + wire.ld_many(2, metrics))
                for owner, metrics in by_owner.items()
            ),
        )
        return Snapshot(body, points, nfam)

    def _plan(self, fam: FamilyView) -> _Plan:
        k = (fam.name, fam.kind, fam.labelnames)
        plan = self._plans.get(k)
        if plan is None:
            header = PbMetric(
                name=otlp_name(fam.name, fam.kind), description=fam.help, unit=unit(fam.name)
            ).SerializeToString()
            movable = pod_labels(fam.labelnames)
            at = tuple(fam.labelnames.index(f) if f in movable else -1 for f in OWNER_FIELDS)
            plan = _Plan(
                header,
                wire.StringAttributes(_ATTR_FIELD[fam.kind], fam.labelnames),
                at if movable else (-1,) * len(OWNER_FIELDS),
                frozenset(i for i in at if i >= 0),
            )
            if fam.kind == HISTOGRAM:
                plan.bounds = wire.packed_double(7, fam.bounds)
            self._plans[k] = plan
        return plan

    def _resource(self, owner: Owner) -> bytes:
        got = self._resources.get(owner)
        if got is None:
            if len(self._resources) > 10000:  # pods come and go
                self._resources.clear()
            attrs = self.node + semconv.owner_attributes(owner)
            got = self._resources[owner] = resource(attrs)
        return got


def resource(attrs: Iterable[tuple[str, str]]) -> bytes:
    """A Resource message of string attributes, by opentelemetry-proto."""
    return Resource(
        attributes=[KeyValue(key=k, value=PbAnyValue(string_value=v)) for k, v in attrs]
    ).SerializeToString()


def _counter(s: _Series, value: float, now: int, begun: int, plan: _Plan) -> bytes:
    if value < s.last:  # reset: the series was made again
        s.start = begun
    s.last = value
    body = _NUMBER.pack(0x11, s.start, 0x19, now, 0x21, value) + s.attrs
    return body


def _gauge(s: _Series, value: float, now: int, begun: int, plan: _Plan) -> bytes:
    return _GAUGE.pack(0x19, now, 0x21, value) + s.attrs


def _histogram(s: _Series, value: Any, now: int, begun: int, plan: _Plan) -> bytes:
    counts, total = value
    count = sum(counts)
    if count < s.last:
        s.start = begun
    s.last = count
    out = [_HIST_HEAD.pack(0x11, s.start, 0x19, now)]
    if count:  # proto3 leaves a zero count out
        out.append(b"\x21" + _Q.pack(count))
    out.append(b"\x29" + _D.pack(total))
    out.append(wire.packed_fixed64(6, counts))
    out.append(plan.bounds)
    out.append(s.attrs)
    return b"".join(out)


def _summary(s: _Series, value: Any, now: int, begun: int, plan: _Plan) -> bytes:
    count, total, quantiles = value
    if count < s.last:
        s.start = begun
    s.last = count
    out = [_HIST_HEAD.pack(0x11, s.start, 0x19, now)]
    if count:
        out.append(b"\x21" + _Q.pack(int(count)))
    if total:
        out.append(b"\x29" + _D.pack(total))
    for q, v in quantiles:
        qv = (b"\x09" + _D.pack(q) if q else b"") + (b"\x11" + _D.pack(v) if v else b"")
        out.append(wire.ld(6, qv))
    out.append(s.attrs)
    return b"".join(out)


_WRITERS: dict[str, Callable[[_Series, Any, int, int, _Plan], bytes]] = {
    COUNTER: _counter,
    GAUGE: _gauge,
    HISTOGRAM: _histogram,
    SUMMARY: _summary,
}
_TRAILERS = {COUNTER: _SUM_TRAILER, GAUGE: b"", HISTOGRAM: _HIST_TRAILER, SUMMARY: b""}


# -- the agent's families as FamilyViews ----------------------------------------------
def from_cache(
    snapshot: Iterable[tuple[Any, list[tuple[tuple[str, ...], Any]]]],
) -> Iterator[FamilyView]:
    """The metric cache's families (MetricCache.snapshot()): a histogram's counts are kept
    per bucket there already, its last bucket +Inf."""
    for fam, series in snapshot:
        if series:
            bounds = tuple(fam.buckets[:-1]) if fam.kind == HISTOGRAM else ()
            yield FamilyView(fam.name, fam.kind, fam.help, fam.labelnames, series, bounds)


def from_prometheus(metrics: Iterable[Metric]) -> Iterator[FamilyView]:
    """prometheus_client families (a registry's collect()) as FamilyViews, but the metric
    cache's (RenderedFamily: read from the cache itself, from_cache). A counter's samples
    are its `_total` ones (or those of its own name: dcgm-exporter's have no `_total`), not
    `_created`; histograms and summaries are put together from their
    `_bucket`, `_count`, `_sum` and quantile samples; any other type is a gauge of each
    of its sample names (an info's `_info`, a stateset's)."""
    for m in metrics:
        if isinstance(m, RenderedFamily):
            continue
        if m.type == COUNTER:  # its samples: name_total, or the name (dcgm-exporter's)
            for name in dict.fromkeys(s.name for s in m.samples):
                if name in (m.name, m.name + "_total"):
                    yield from _grouped(
                        name, COUNTER, m.documentation, (s for s in m.samples if s.name == name)
                    )
        elif m.type == HISTOGRAM:
            yield from _histograms(m)
        elif m.type == SUMMARY:
            yield from _summaries(m)
        else:
            names = dict.fromkeys(s.name for s in m.samples)
            for name in names:
                yield from _grouped(
                    name, GAUGE, m.documentation, (s for s in m.samples if s.name == name)
                )


def _grouped(name: str, kind: str, help_text: str, samples: Iterable[Any]) -> Iterator[FamilyView]:
    """One view per set of label names among the samples (almost always one)."""
    views: dict[tuple[str, ...], FamilyView] = {}
    for s in samples:
        names = tuple(s.labels)
        v = views.get(names)
        if v is None:
            v = views[names] = FamilyView(name, kind, help_text, names, [])
        v.series.append((tuple(s.labels.values()), float(s.value)))
    yield from views.values()


def _histograms(m: Metric) -> Iterator[FamilyView]:
    buckets: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    sums: dict[tuple[tuple[str, str], ...], float] = {}
    for s in m.samples:
        if s.name == m.name + "_bucket":
            lbl = tuple((k, v) for k, v in s.labels.items() if k != "le")
            buckets.setdefault(lbl, []).append((float(s.labels["le"]), float(s.value)))
        elif s.name == m.name + "_sum":
            sums[tuple(s.labels.items())] = float(s.value)
    views: dict[tuple[tuple[str, ...], tuple[float, ...]], FamilyView] = {}
    for lbl, bs in buckets.items():
        bs.sort()
        bounds = tuple(b for b, _ in bs if b != float("inf"))
        counts, prev = [], 0.0
        for _, cum in bs:
            counts.append(int(cum - prev))
            prev = cum
        if not bs or bs[-1][0] != float("inf"):
            counts.append(0)
        names = tuple(k for k, _ in lbl)
        v = views.get((names, bounds))
        if v is None:
            v = views[(names, bounds)] = FamilyView(
                m.name, HISTOGRAM, m.documentation, names, [], bounds
            )
        v.series.append((tuple(x for _, x in lbl), (counts, sums.get(lbl, 0.0))))
    yield from views.values()


def _summaries(m: Metric) -> Iterator[FamilyView]:
    parts: dict[tuple[tuple[str, str], ...], list[Any]] = {}
    for s in m.samples:
        lbl = tuple((k, v) for k, v in s.labels.items() if k != "quantile")
        p = parts.setdefault(lbl, [0.0, 0.0, []])
        if s.name == m.name + "_count":
            p[0] = float(s.value)
        elif s.name == m.name + "_sum":
            p[1] = float(s.value)
        elif s.name == m.name and "quantile" in s.labels:
            p[2].append((float(s.labels["quantile"]), float(s.value)))
    views: dict[tuple[str, ...], FamilyView] = {}
    for lbl, (count, total, qs) in parts.items():
        names = tuple(k for k, _ in lbl)
        v = views.setdefault(names, FamilyView(m.name, SUMMARY, m.documentation, names, []))
        v.series.append((tuple(x for _, x in lbl), (count, total, tuple(sorted(qs)))))
    yield from views.values()
