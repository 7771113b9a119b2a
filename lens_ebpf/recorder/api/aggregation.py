"""gpu-aggregation/*: the clusters aggregated, their hourly GPU statistics per cluster,
namespace, label or annotation value and workload, and the allocation snapshots."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder.accounting import hours, reads
from lens_ebpf.recorder.api.envelope import PAGE_MAX, Ask, bad, integer, param
from lens_ebpf.recorder.lifecycle import parse_time

routes = RouteTable()
SPAN = (
    Param("start_time", "date-time", "RFC 3339", required=True),
    Param("end_time", "date-time", "RFC 3339", required=True),
)
ORDERS = ("time", "utilization", "allocated_gpu_count")


def paging(*orders: str) -> tuple[Param, ...]:
    """_order()'s parameters, ordered by one of orders."""
    return (
        Param("page", "integer", "the page, from 1", default=1, minimum=1),
        Param("page_size", "integer", "rows a page", default=20, minimum=1, maximum=PAGE_MAX),
        Param("order_by", default="time", choices=orders),
        Param("order_direction", default="desc", choices=("asc", "desc")),
    )


DIMENSION = (
    Param("dimension_type", required=True, choices=hours.DIMENSIONS),
    Param("dimension_key", doc="the label or annotation key", required=True),
)


@routes.get("gpu-aggregation/clusters")
def clusters(ask: Ask) -> Any:
    """The names of the clusters this service follows."""
    return ask.app.clusters.names()


@routes.get("gpu-aggregation/cluster/hourly-stats", SPAN, paging(*ORDERS[:2]))
def hourly(ask: Ask) -> Any:
    """The cluster's hourly GPU statistics (allocation, utilization) from start_time to
    end_time, one page."""
    start, end = _span_of(ask.query)
    num, size, order, desc = _order(ask.query, ("time", "utilization"))
    return reads.cluster_stats(ask.conn, ask.c.tables, start, end, num, size, order, desc)


def _span(q: dict[str, str], required: bool = True) -> tuple[datetime | None, datetime | None]:
    """start_time and end_time (RFC 3339)."""
    out: list[datetime | None] = []
    for key in ("start_time", "end_time"):
        raw = param(q, key)
        got = parse_time(raw) if raw else None
        if (raw or required) and got is None:
            raise bad(f"{key}={raw!r}: an RFC 3339 time is required")
        out.append(got)
    return out[0], out[1]


def _span_of(q: dict[str, str]) -> tuple[datetime, datetime]:
    start, end = _span(q)
    assert start is not None and end is not None
    return start, end


def _order(q: dict[str, str], allowed: tuple[str, ...]) -> tuple[int, int, str, bool]:
    """page, page_size, order_by, descending (the dimension pages take page_size as the
    original takes them: checked, then ignored)."""
    num = integer(q, "page", 1)
    size = integer(q, "page_size", 20)
    if num < 1 or not 1 <= size <= PAGE_MAX:
        raise bad(f"page={num}, page_size={size}: page from 1, page_size from 1 to {PAGE_MAX}")
    order = param(q, "order_by") or "time"
    direction = (param(q, "order_direction") or "desc").lower()
    if order not in allowed or direction not in ("asc", "desc"):
        raise bad(
            f"order_by={order!r}, order_direction={direction!r}: "
            f"{' or '.join(allowed)}, asc or desc"
        )
    return num, size, order, direction == "desc"


def _dimension(q: dict[str, str]) -> str:
    dim = param(q, "dimension_type") or ""
    if dim not in hours.DIMENSIONS:
        raise bad(f"dimension_type={dim!r}: label or annotation")
    return dim


@routes.get("gpu-aggregation/namespaces", SPAN)
def namespaces(ask: Ask) -> Any:
    """The namespaces with hourly GPU statistics from start_time to end_time."""
    return reads.namespaces(ask.conn, ask.c.tables, *_span_of(ask.query))


@routes.get("gpu-aggregation/dimension-keys", DIMENSION[0], SPAN)
def dimension_keys(ask: Ask) -> Any:
    """The label (or annotation) keys with hourly GPU statistics from start_time to
    end_time."""
    dim = _dimension(ask.query)
    return reads.dimension_keys(ask.conn, ask.c.tables, dim, *_span_of(ask.query))


@routes.get("gpu-aggregation/dimension-values", DIMENSION, SPAN)
def dimension_values(ask: Ask) -> Any:
    """A label's (or annotation's) values with hourly GPU statistics from start_time to
    end_time."""
    q = ask.query
    dim, key = _dimension(q), param(q, "dimension_key")
    if not key:
        raise bad("dimension_key is required")
    return reads.dimension_values(ask.conn, ask.c.tables, dim, key, *_span_of(q))


@routes.get(
    "gpu-aggregation/namespaces/hourly-stats", Param("namespace"), SPAN, paging(*ORDERS[:2])
)
def namespace_hourly(ask: Ask) -> Any:
    """Hourly GPU statistics per namespace (or of one) from start_time to end_time, one
    page."""
    q = ask.query
    start, end = _span_of(q)
    num, _, order, desc = _order(q, ("time", "utilization"))
    return reads.namespace_stats(
        ask.conn, ask.c.tables, param(q, "namespace"), start, end, num, order, desc
    )


@routes.get(
    "gpu-aggregation/labels/hourly-stats",
    DIMENSION,
    Param("dimension_value"),
    SPAN,
    paging(*ORDERS),
)
def label_hourly(ask: Ask) -> Any:
    """Hourly GPU statistics per value of a label (or annotation) key, or of one value,
    from start_time to end_time, one page."""
    q = ask.query
    dim, key = _dimension(q), param(q, "dimension_key")
    if not key:
        raise bad("dimension_key is required")
    start, end = _span_of(q)
    num, _, order, desc = _order(q, ("time", "utilization", "allocated_gpu_count"))
    return reads.label_stats(
        ask.conn, ask.c.tables, dim, key, param(q, "dimension_value"), start, end, num, order, desc
    )


@routes.get(
    "gpu-aggregation/workloads/hourly-stats",
    Param("namespace"),
    Param("workload_name"),
    Param("workload_type", doc="its kind"),
    SPAN,
    paging(*ORDERS),
)
def workload_hourly(ask: Ask) -> Any:
    """Hourly GPU statistics per workload (or of those named) from start_time to end_time,
    one page."""
    q = ask.query
    start, end = _span_of(q)
    num, _, order, desc = _order(q, ("time", "utilization", "allocated_gpu_count"))
    return reads.workload_stats(
        ask.conn,
        ask.c.tables,
        param(q, "namespace"),
        param(q, "workload_name"),
        param(q, "workload_type"),
        start,
        end,
        num,
        order,
        desc,
    )


@routes.get("gpu-aggregation/snapshots/latest")
def latest_snapshot(ask: Ask) -> Any:
    """The cluster's newest GPU allocation snapshot."""
    return reads.latest_snapshot(ask.conn, ask.c.tables)


@routes.get(
    "gpu-aggregation/snapshots",
    Param("start_time", "date-time", "RFC 3339"),
    Param("end_time", "date-time", "RFC 3339"),
)
def snapshots(ask: Ask) -> Any:
    """The cluster's GPU allocation snapshots from start_time to end_time (either may be
    left out), newest first."""
    return reads.snapshots(ask.conn, ask.c.tables, *_span(ask.query, required=False))
