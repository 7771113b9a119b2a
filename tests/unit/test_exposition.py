"""core.exposition's families (the one way lens_ebpf builds one) write what
prometheus_client's own classes write, under both writers."""

from __future__ import annotations

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from lens_ebpf.core.exposition import Buckets, counter, family, gauge, histogram, render_metrics


class _Fixed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


def _latest(metrics: list[Metric]) -> bytes:
    registry = CollectorRegistry()
    registry.register(_Fixed(metrics))
    return generate_latest(registry)


def test_families_write_what_prometheus_clients_classes_write() -> None:
    b = Buckets((0.5, 2.0))
    for v in (0.1, 1.0, 9.0):
        b.observe(v)
    theirs: list[Metric] = [
        CounterMetricFamily("a_seconds", "one", value=3),
        GaugeMetricFamily("b", "two", value=1.5),
    ]
    c = CounterMetricFamily("c", "three", labels=["x", "y"])
    c.add_metric(["1", "2"], 4)
    g = GaugeMetricFamily("d", "four", labels=["x"])
    g.add_metric(['q"\\'], 5)
    h = HistogramMetricFamily("e_seconds", "five", labels=["r"])
    h.add_metric(["/x"], b.cumulative(), b.total)
    theirs += [c, g, h]
    ours: list[Metric] = [
        counter("a_seconds", "one", 3),
        gauge("b", "two", 1.5),
        counter("c", "three").add({"x": "1", "y": "2"}, 4),
        gauge("d", "four", {'q"\\': 5}, "x"),
        histogram("e_seconds", "five").add_buckets({"r": "/x"}, b.cumulative(), b.total),
    ]
    assert [m.samples for m in ours] == [m.samples for m in theirs]
    assert render_metrics(ours) == render_metrics(theirs)
    assert _latest(ours) == _latest(theirs)


def test_a_counter_without_total_keeps_its_samples_name() -> None:
    """dcgm-exporter's counters and the seed's: no _total on the samples nor the TYPE line."""
    m = family("DCGM_FI_DEV_XID_ERRORS", "xid", "counter", total=False).add({"gpu": "0"}, 2)
    assert counter("seed_egress", "bytes", 7, total=False).samples[0].name == "seed_egress"
    assert render_metrics([m]) == (
        "# HELP DCGM_FI_DEV_XID_ERRORS xid\n# TYPE DCGM_FI_DEV_XID_ERRORS counter\n"
        'DCGM_FI_DEV_XID_ERRORS{gpu="0"} 2.0\n'
    )
