"""The recorder's HTTP front (core/http.py) as metrics: connections open, refused and cut,
heads and bodies refused, writes in hand and their bytes, under lens_recorder_http_*
(the agent exports the same counters as lens_agent_http_*)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.core.exposition import counter, gauge
from lens_ebpf.core.http_connections import Counters


class FrontMetrics(Collector):
    def __init__(self, counters: Counters) -> None:
        self._c = counters

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        c = self._c
        yield gauge("lens_recorder_http_connections", "HTTP connections open", c.open)
        yield counter(
            "lens_recorder_http_connections_refused",
            "HTTP connections refused (server.max_connections open)",
            c.refused,
        )
        yield counter(
            "lens_recorder_http_connections_timed_out",
            "HTTP connections closed: no whole request head in time",
            c.cut,
        )
        yield counter(
            "lens_recorder_http_request_heads_too_large",
            "HTTP request heads refused (431): over server.max_header_bytes",
            c.oversized,
        )
        yield counter(
            "lens_recorder_http_request_bodies_too_large",
            "Request bodies refused (413): over their route's bound",
            c.bodies_too_large,
        )
        yield counter(
            "lens_recorder_http_request_bodies_timed_out",
            "Request bodies not whole within server.body_timeout_seconds " "(408)",
            c.bodies_timed_out,
        )
        yield counter(
            "lens_recorder_http_request_bodies_abandoned",
            "Requests whose client hung up before its body was whole",
            c.bodies_abandoned,
        )
        yield counter(
            "lens_recorder_http_writes_busy",
            "Writes refused (503): server.max_writes_in_hand in hand, or "
            "server.max_body_bytes_in_hand held",
            c.busy,
        )
        yield gauge(
            "lens_recorder_http_writes_in_hand",
            "Writes whose body is being read or handled now",
            c.writes,
        )
        yield gauge(
            "lens_recorder_http_request_body_bytes_in_hand",
            "Request body bytes held now (being read or handled)",
            c.body_bytes,
        )
        yield counter("lens_recorder_metrics_scrapes", "/metrics requests", c.scrapes)
        yield counter(
            "lens_recorder_metrics_renders",
            "/metrics renderings (concurrent scrapes share one)",
            c.renders,
        )
