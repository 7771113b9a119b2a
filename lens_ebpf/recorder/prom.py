"""The recorder's PromQL, in one place, against a Prometheus-compatible HTTP API
(`recorder.prometheus.url`: Prometheus, Thanos, Mimir, VictoriaMetrics speak it). Every
query is time-bounded (`timeout_seconds`) and a range query that would return more than
`max_points` points per series is refused before it runs."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from datetime import datetime
from typing import Any, TypeVar

T = TypeVar("T")

# the queries, by what they answer (the series carry `node` from the agents' scrape config)
UTILIZATION = "avg(gpu_utilization)"
ALLOCATION_RATE = "avg(node_k8s_gpu_allocation_rate)"
VRAM_RATIO = "avg(gpu_memory_used_bytes / gpu_memory_total_bytes)"
# the heatmap's three: each GPU's series with gpu_id (the agents' own names; temperature and
# power carry gpu_index, renamed)
HEATMAP = {
    "utilization": "gpu_utilization",
    "temperature": 'label_replace(gpu_temperature_celsius, "gpu_id", "$1", "gpu_index", "(.*)")',
    "power": 'label_replace(gpu_power_draw_watts, "gpu_id", "$1", "gpu_index", "(.*)")',
}
# the agents' RDMA port counters, bytes/s over the cluster
RDMA_TX = "sum(rate(lens_rdma_port_transmit_bytes_total[1m]))"
RDMA_RX = "sum(rate(lens_rdma_port_receive_bytes_total[1m]))"


def escape(value: str) -> str:
    """A label value inside a PromQL double-quoted string."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def any_of(values: list[str]) -> str:
    """A regular expression matching exactly these values, as a PromQL string's body."""
    return escape("|".join(re.escape(v) for v in sorted(set(values))))


def pods_selector(namespace: str, pods: list[str]) -> str:
    """Label matchers for these pods of a namespace."""
    return f'namespace="{escape(namespace)}",pod=~"{any_of(pods)}"'


def node_gpus(node: str) -> dict[str, str]:
    """A node's GPUs, by what a device page shows: utilization (%), temperature (C),
    power (W), memory (bytes); each series carries gpu_index (and gpu_id renamed)."""
    sel = f'node="{escape(node)}"'
    return {
        "utilization": f'label_replace(gpu_utilization{{{sel}}}, "gpu_index", "$1", '
        '"gpu_id", "(.*)")',
        "temperature": f"gpu_temperature_celsius{{{sel}}}",
        "power": f"gpu_power_draw_watts{{{sel}}}",
        "memory": f"gpu_memory_total_bytes{{{sel}}}",
    }


def workload_graphs(
    namespace: str, name: str, pods: list[str], nodes: list[str], step: int
) -> dict[str, tuple[int, str, str]]:
    """A workload's metric graphs: title -> (serial, unit, PromQL). GPU series by the pods
    the agents label them with; TCP from its pods' nodes to its own pods (the agents'
    remote_* labels)."""
    sel = pods_selector(namespace, pods)
    to_own = (
        f'remote_namespace="{escape(namespace)}",remote_workload="{escape(name)}",'
        f'node=~"{any_of(nodes)}"'
    )
    window = f"{max(step, 60)}s"
    return {
        "GPU Utilization": (1, "%", f"avg by (node) (gpu_utilization{{{sel}}})"),
        "GPU Memory Utilization": (
            2,
            "%",
            f"avg by (node) (gpu_memory_used_bytes{{{sel}}} "
            f"/ gpu_memory_total_bytes{{{sel}}}) * 100",
        ),
        "GPU Power": (3, "W", f"avg by (node) (gpu_power_draw_watts{{{sel}}})"),
        "GPU Memory Used per Pod": (5, "B", f"sum by (pod) (gpu_memory_used_bytes{{{sel}}})"),
        "GPU Memory Used": (6, "B", f"sum(gpu_memory_used_bytes{{{sel}}})"),
        "GPU Power per Pod": (7, "W", f"sum by (pod) (gpu_power_draw_watts{{{sel}}})"),
        "TCP Bytes to Own Pods": (
            8,
            "B/s",
            f"sum by (node) (rate(lens_tcp_sent_bytes_total"
            f"{{{to_own}}}[{window}]) + rate("
            f"lens_tcp_received_bytes_total{{{to_own}}}"
            f"[{window}]))",
        ),
        "TCP RTT to Own Pods": (
            9,
            "s",
            f"histogram_quantile(0.5, sum by (node, le) (rate("
            f"lens_tcp_rtt_seconds_bucket{{{to_own}}}[{window}])))",
        ),
    }


# the agents' RDMA port error counters (lens_rdma_port_<family>_total)
RDMA_ERRORS = (
    "receive_errors",
    "transmit_discards",
    "receive_discards",
    "transmit_constraint_errors",
    "receive_constraint_errors",
    "symbol_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "receive_remote_physical_errors",
    "receive_switch_relay_errors",
)
# NVIDIA's clock events that hold no clock down for a fault (idle, a setting, a boost)
NOT_THROTTLING = ("gpu_idle", "applications_clocks_setting", "sync_boost", "display_clock_setting")


# the agents' measure of each pod's claims (kubelet summary): a claim mounted by several
# pods counts once (the most any of their kubelets measured)
VOLUME_USED = "max by (namespace, persistentvolumeclaim) (lens_pod_volume_used_bytes)"
VOLUME_AVAILABLE = "max by (namespace, persistentvolumeclaim) (lens_pod_volume_available_bytes)"
VOLUME_MOUNTS = (
    "group by (namespace, persistentvolumeclaim, pod, node) (lens_pod_volume_used_bytes)"
)


def to_own_pods(namespace: str, workload: str, nodes: list[str]) -> str:
    """Matchers for the agents' TCP series from these nodes to the workload's own pods (the
    remote's identity labels name its top workload)."""
    return (
        f'remote_namespace="{escape(namespace)}",remote_workload="{escape(workload)}",'
        f'node=~"{any_of(nodes)}"'
    )


def rtt_p50_by_node(namespace: str, workload: str, nodes: list[str], window: int) -> str:
    """Each node's median TCP RTT (seconds) to the workload's own pods."""
    sel = to_own_pods(namespace, workload, nodes)
    return (
        f"histogram_quantile(0.5, sum by (node, le) (rate(lens_tcp_rtt_seconds_bucket"
        f"{{{sel}}}[{window}s])))"
    )


def retransmits_by_node(namespace: str, workload: str, nodes: list[str], window: int) -> str:
    """Each node's retransmitted segments per second to the workload's own pods."""
    sel = to_own_pods(namespace, workload, nodes)
    return f"sum by (node) (rate(lens_tcp_retransmits_total{{{sel}}}[{window}s]))"


def _ports(nodes: list[str], devices: list[str]) -> str:
    sel = f'node=~"{any_of(nodes)}"'
    return sel + (f',device=~"{any_of(devices)}"' if devices else "")


def rdma_errors(nodes: list[str], devices: list[str], window: int, by: str) -> str:
    """RDMA port errors per second on these nodes (these devices: the ones the pods'
    queue pairs use, when known), summed by `by`."""
    names = any_of([f"lens_rdma_port_{f}_total" for f in RDMA_ERRORS])
    return f'sum by ({by}) (rate({{__name__=~"{names}",{_ports(nodes, devices)}}}' f"[{window}s]))"


def rdma_bytes_by_node(nodes: list[str], devices: list[str], window: int) -> str:
    """RDMA bytes per second, both ways, by node."""
    sel = _ports(nodes, devices)
    return " + ".join(
        f"sum by (node) (rate(lens_rdma_port_{way}_bytes_total{{{sel}}}" f"[{window}s]))"
        for way in ("transmit", "receive")
    )


# GPU accounting's samples of an hour, per pod: utilization summed and counted (a group's mean
# is its sums over its counts), memory used and total
ACCOUNTING = (
    "sum by (namespace, pod) (gpu_utilization)",
    "count by (namespace, pod) (gpu_utilization)",
    "sum by (namespace, pod) (gpu_memory_used_bytes)",
    "sum by (namespace, pod) (gpu_memory_total_bytes)",
)
POD_UTILIZATION_HOUR = "avg by (namespace, pod) (avg_over_time(gpu_utilization[1h]))"


def workload_utilization(namespace: str, pods: list[str]) -> str:
    return f"avg(gpu_utilization{{{pods_selector(namespace, pods)}}})"


def gpu_utilization_by_pod(namespace: str, pods: list[str], window: int) -> str:
    sel = pods_selector(namespace, pods)
    return f"avg by (pod) (avg_over_time(gpu_utilization{{{sel}}}[{window}s]))"


def throttling(namespace: str, pods: list[str]) -> str:
    """1 while a clock event that is a slowdown holds a GPU of these pods (by node, GPU
    index, pod and reason)."""
    sel = pods_selector(namespace, pods)
    return (
        f"max by (node, gpu_index, pod, reason) (lens_gpu_clock_event_active{{{sel},"
        f'reason!~"{any_of(list(NOT_THROTTLING))}"}})'
    )


def node_history(node: str) -> dict[str, str]:
    """A node's GPU utilization per GPU and its allocation rate (the agents' own)."""
    sel = f'node="{escape(node)}"'
    return {
        "gpu_utilization": f"max by (gpu_id) (gpu_utilization{{{sel}}})",
        "gpu_allocation_rate": f"max(node_k8s_gpu_allocation_rate{{{sel}}})",
    }


def utilization_by_node(nodes: list[str] | None = None) -> str:
    """Each node's GPUs' mean utilization (these nodes', or every node's)."""
    if nodes is None:
        return "avg by (node) (gpu_utilization)"
    return f'avg by (node) (gpu_utilization{{node=~"{any_of(nodes)}"}})'


class PromError(Exception):
    """Prometheus cannot answer: not configured, down, or it refused the query (503)."""


class PromDownError(PromError):
    """Prometheus did not answer at all: refused, reset, or silent past timeout_seconds."""


# what the current request could not get from Prometheus (see missing_figures)
_MISSING: ContextVar[list[str] | None] = ContextVar("prometheus_missing", default=None)
# the Prometheus URLs that did not answer at all in the current request: its later
# maybe_* reads of them give None at once, not after timeout_seconds each
_DOWN: ContextVar[set[str] | None] = ContextVar("prometheus_down", default=None)


@contextlib.contextmanager
def missing_figures() -> Iterator[list[str]]:
    """Within it (one request, one thread), the Prom.maybe_* reads that Prometheus could
    not answer add why to the list: the figures they gave are unknown (a route answers
    0 for them, the original's type: never null where the original has a number), the
    stored facts beside them are answered, and the surface says what is unknown and why
    in meta.message."""
    got: list[str] = []
    token, down = _MISSING.set(got), _DOWN.set(set())
    try:
        yield got
    finally:
        _DOWN.reset(down)
        _MISSING.reset(token)


def _missed(exc: PromError) -> None:
    got = _MISSING.get()
    if got is not None and str(exc) not in got:
        got.append(str(exc))


def missed(why: str) -> None:
    """Say to missing_figures (where one is open) why some figures are unknown, for reads
    that are not one Prom.maybe_* call: a group of queries given up together, a storage
    scan's usage, hours stored without samples."""
    _missed(PromError(why))


class TooManyPointsError(ValueError):
    """A range query beyond max_points (400, naming the parameters)."""


class Prom:
    def __init__(self, url: str, timeout: float, max_points: int) -> None:
        self.url, self.timeout, self.max_points = url.rstrip("/"), timeout, max_points
        self.queries = 0
        self.errors = 0

    def _get(self, path: str, params: dict[str, str]) -> Any:
        if not self.url:
            raise PromError("recorder.prometheus.url is not set: this route needs Prometheus")
        self.queries += 1
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:  # 400/422: the query; 5xx: the server
            self.errors += 1
            detail = exc.read()[:300].decode(errors="replace")
            raise PromError(f"prometheus at {self.url} answered {exc.code}: {detail}") from None
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out
            self.errors += 1
            raise PromDownError(f"prometheus at {self.url} is unavailable: {exc}") from None
        except ValueError as exc:
            self.errors += 1
            raise PromError(f"prometheus at {self.url} is unavailable: {exc}") from None
        if body.get("status") != "success":
            self.errors += 1
            raise PromError(f"prometheus at {self.url}: {body.get('error', body)}")
        return body["data"]

    def instant(self, query: str, at: datetime) -> list[tuple[dict[str, str], float]]:
        data = self._get(
            "query",
            {
                "query": query,
                "time": f"{at.timestamp():.3f}",
                "timeout": f"{int(self.timeout * 1000)}ms",
            },
        )
        return [(r["metric"], float(r["value"][1])) for r in data.get("result", [])]

    def _maybe(self, read: Callable[[], T]) -> T | None:
        """read(), or None where Prometheus cannot answer (said to missing_figures). Within
        one missing_figures, once this Prometheus did not answer at all (PromDownError: down,
        or silent past timeout_seconds) the later reads give None at once; one it refused
        (4xx, 5xx) is no reason to skip the next."""
        if not self.url:
            _missed(PromError("recorder.prometheus.url is not set"))
            return None
        down = _DOWN.get()
        if down is not None and self.url in down:
            return None  # its reason is said already
        try:
            return read()
        except PromDownError as exc:
            if down is not None:
                down.add(self.url)
            _missed(exc)
        except PromError as exc:
            _missed(exc)
        return None

    def maybe_instant(self, query: str, at: datetime) -> list[tuple[dict[str, str], float]] | None:
        """instant(), or None where Prometheus cannot answer (said to missing_figures)."""
        return self._maybe(lambda: self.instant(query, at))

    def maybe_scalar(self, query: str, at: datetime) -> float:
        """scalar(), or 0 where Prometheus cannot answer (said to missing_figures): a
        figure where the original has a float64."""
        got = self.maybe_instant(query, at)
        return got[0][1] if got else 0.0

    def scalar(self, query: str, at: datetime) -> float:
        """The value of a query that answers one series; 0 when it answers none."""
        got = self.instant(query, at)
        return got[0][1] if got else 0.0

    def maybe_graph(
        self, query: str, start: int, end: int, step: int
    ) -> list[dict[str, Any]] | None:
        """graph(), or None where Prometheus cannot answer (said to missing_figures)."""
        return self._maybe(lambda: self.graph(query, start, end, step))

    def graph(self, query: str, start: int, end: int, step: int) -> list[dict[str, Any]]:
        """[{"labels", "values": [{"timestamp", "value"}]}] (model.MetricsSeries), one per
        series the query answers."""
        data = self._range(query, start, end, step)
        return [
            {
                "labels": {k: v for k, v in r["metric"].items() if k != "__name__"},
                "values": [
                    {"timestamp": int(float(ts)), "value": float(v)} for ts, v in r["values"]
                ],
            }
            for r in data.get("result", [])
        ]

    def _range(self, query: str, start: int, end: int, step: int) -> Any:
        if end < start:
            raise TooManyPointsError(f"end={end} is before start={start}")
        points = (end - start) // step + 1
        if points > self.max_points:
            raise TooManyPointsError(
                f"start={start}, end={end}, step={step}: {points} points, more "
                f"than recorder.prometheus.max_points ({self.max_points})"
            )
        params = {
            "query": query,
            "start": str(start),
            "end": str(end),
            "step": str(step),
            "timeout": f"{int(self.timeout * 1000)}ms",
        }
        return self._get("query_range", params)

    def series(self, query: str, start: int, end: int, step: int) -> list[dict[str, Any]]:
        """[{"timestamp", "value"}] of a query answering one series (model.TimePoint)."""
        data = self._range(query, start, end, step)
        out: list[dict[str, Any]] = []
        for r in data.get("result", []):
            out += [{"timestamp": int(float(ts)), "value": float(v)} for ts, v in r["values"]]
        return out
