"""Prometheus text format (0.0.4) that keeps counter names exactly as they are listed in
docs/reference/metric-conventions.md.

prometheus_client's writer always names a counter's TYPE line `<name>_total`; the seed
counters (`primus_lens_network_tcp_flow_egress`, ...) have no such suffix, and their
TYPE line must name the samples dashboards query.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TYPES = {"unknown": "untyped", "info": "gauge", "stateset": "gauge"}


class Buckets:
    """A histogram's counts kept by hand (its owner holds its own lock): one count per
    bound and one above them all, and the sum of what was observed."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def copy(self) -> Buckets:
        out = Buckets(self.bounds)
        out.counts, out.total = list(self.counts), self.total
        return out

    def cumulative(self) -> list[tuple[str, float]]:
        """The counts as a histogram family's cumulative (le, count) pairs."""
        out, acc = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += n
            out.append(("+Inf" if bound == float("inf") else str(bound), float(acc)))
        return out


class Family(Metric):
    """A metric family, the one way lens_ebpf builds one (tests/unit/test_architecture.py
    holds that): a counter's samples are named `name_total` (`total=False`: dcgm-exporter's
    are not), any other's `name`; add() puts one sample per call."""

    def __init__(self, name: str, help_text: str, kind: str, total: bool = True) -> None:
        super().__init__(name, help_text, kind)
        self.sample_name = name + "_total" if kind == "counter" and total else name

    def add(self, labels: dict[str, str], value: float) -> Family:
        self.add_sample(self.sample_name, labels, value)
        return self

    def add_buckets(
        self, labels: Mapping[str, str], buckets: Iterable[tuple[str, float]], total: float
    ) -> Family:
        """A histogram's series: its cumulative (le, count) pairs, +Inf last, and its sum
        (as prometheus_client's HistogramMetricFamily.add_metric writes them)."""
        acc = 0.0
        for le, acc in buckets:
            self.add_sample(self.name + "_bucket", {**labels, "le": le}, acc)
        self.add_sample(self.name + "_count", dict(labels), acc)
        self.add_sample(self.name + "_sum", dict(labels), total)
        return self


def family(name: str, help_text: str, kind: str, total: bool = True) -> Family:
    """An empty family of a kind known at run time (a table's)."""
    return Family(name, help_text, kind, total)


def counter(
    name: str,
    help_text: str,
    values: Mapping[Any, float] | float | None = None,
    label: str = "",
    *,
    total: bool = True,
) -> Family:
    """A counter family (`name`, its samples `name_total`, or `name` where total is False):
    none yet, one sample (a number), or one per key of values under label."""
    m = Family(name, help_text, "counter", total)
    if isinstance(values, Mapping):
        for key, n in values.items():
            m.add({label: str(key)} if label else {}, n)
    elif values is not None:
        m.add({}, values)
    return m


def gauge(
    name: str,
    help_text: str,
    values: Mapping[Any, float] | float | None = None,
    label: str = "",
) -> Family:
    """A gauge family: none yet, one sample (a number), or one per key of values under
    label."""
    m = Family(name, help_text, "gauge")
    if isinstance(values, Mapping):
        for key, n in values.items():
            m.add({label: str(key)} if label else {}, n)
    elif values is not None:
        m.add({}, values)
    return m


def histogram(name: str, help_text: str) -> Family:
    """An empty histogram family: add_buckets() puts each series."""
    return Family(name, help_text, "histogram")


def escape_value(v: str) -> str:
    """A label value as the text format writes it."""
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _type_name(metric: Metric) -> str:
    if metric.type == "counter":
        names = {s.name for s in metric.samples}
        if metric.name + "_total" in names or not names:
            return metric.name + "_total"
    return metric.name


class RenderedFamily(Metric):
    """A family whose sample lines are already text (the metric cache's); its samples
    are built only when something other than this writer asks for them."""

    def __init__(
        self,
        name: str,
        sample_name: str,
        documentation: str,
        typ: str,
        text: str,
        samples: Callable[[], list[Any]],
    ) -> None:
        self._make_samples = samples
        super().__init__(name, documentation, typ)
        self.sample_name = sample_name  # what the TYPE line names: the samples' own name
        self.text = text

    @property
    def samples(self) -> list[Any]:
        return self._make_samples()

    @samples.setter
    def samples(self, _value: list[Any]) -> None:
        pass  # Metric.__init__ sets an empty list


def _sample_lines(metric: Metric) -> str:
    out = []
    for s in metric.samples:
        if s.labels:
            labels = ",".join(f'{k}="{escape_value(v)}"' for k, v in s.labels.items())
            out.append(f"{s.name}{{{labels}}} {floatToGoString(s.value)}\n")
        else:
            out.append(f"{s.name} {floatToGoString(s.value)}\n")
    return "".join(out)


def render_metrics(metrics: Iterable[Metric]) -> str:
    out: list[str] = []
    for metric in metrics:
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        if isinstance(metric, RenderedFamily):  # the cache's, already text
            name, body = metric.sample_name, metric.text
        else:
            name, body = _type_name(metric), _sample_lines(metric)
        typ = _TYPES.get(metric.type, metric.type)
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {typ}\n{body}")
    return "".join(out)


def render(collectors: Iterable[Collector]) -> bytes:
    """Text exposition of every metric the collectors yield."""
    return render_metrics(m for c in collectors for m in c.collect()).encode()
