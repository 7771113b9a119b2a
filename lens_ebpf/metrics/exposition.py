"""Prometheus text format (0.0.4) that keeps counter names exactly as METRICS.md lists them.

prometheus_client's writer always names a counter's TYPE line `<name>_total`; the seed
counters (`primus_lens_network_tcp_flow_egress`, ...) have no such suffix, and their
TYPE line must name the samples dashboards query.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TYPES = {"unknown": "untyped", "info": "gauge", "stateset": "gauge"}


def _escape_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _type_name(metric: Metric) -> str:
    if metric.type == "counter":
        names = {s.name for s in metric.samples}
        if metric.name + "_total" in names or not names:
            return metric.name + "_total"
    return metric.name


def render_metrics(metrics: Iterable[Metric]) -> str:
    out: list[str] = []
    for metric in metrics:
        name = _type_name(metric)
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {_TYPES.get(metric.type, metric.type)}\n")
        for s in metric.samples:
            if s.labels:
                labels = ",".join(f'{k}="{_escape_value(v)}"' for k, v in s.labels.items())
                out.append(f"{s.name}{{{labels}}} {floatToGoString(s.value)}\n")
            else:
                out.append(f"{s.name} {floatToGoString(s.value)}\n")
    return "".join(out)


def render(collectors: Iterable[Collector]) -> bytes:
    """Text exposition of every metric the collectors yield."""
    return render_metrics(m for c in collectors for m in c.collect()).encode()
