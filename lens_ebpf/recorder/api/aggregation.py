"""gpu-aggregation/*: the clusters aggregated, their hourly GPU statistics per cluster,
namespace, label or annotation value and workload, and the allocation snapshots."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from lens_ebpf.core.routes import RouteTable
from lens_ebpf.recorder import accounting
from lens_ebpf.recorder.api.envelope import PAGE_MAX, Ask, bad, integer, param
from lens_ebpf.recorder.lifecycle import parse_time

routes = RouteTable()


@routes.get("gpu-aggregation/clusters")
def clusters(ask: Ask) -> Any:
    return ask.app.clusters.names()


@routes.get("gpu-aggregation/cluster/hourly-stats")
def hourly(ask: Ask) -> Any:
    """?start_time=&end_time=&page=&page_size=&order_by=&order_direction= (RFC 3339)."""
    start, end = _span_of(ask.query)
    num, size, order, desc = _order(ask.query, ("time", "utilization"))
    return accounting.cluster_stats(ask.conn, ask.c.tables, start, end, num, size, order, desc)


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
        raise bad(f"order_by={order!r}, order_direction={direction!r}: "
                  f"{' or '.join(allowed)}, asc or desc")  # fmt: skip
    return num, size, order, direction == "desc"


def _dimension(q: dict[str, str]) -> str:
    dim = param(q, "dimension_type") or ""
    if dim not in accounting.DIMENSIONS:
        raise bad(f"dimension_type={dim!r}: label or annotation")
    return dim


@routes.get("gpu-aggregation/namespaces")
def namespaces(ask: Ask) -> Any:
    """?start_time=&end_time=: the namespaces with statistics then."""
    return accounting.namespaces(ask.conn, ask.c.tables, *_span_of(ask.query))


@routes.get("gpu-aggregation/dimension-keys")
def dimension_keys(ask: Ask) -> Any:
    """?dimension_type=label|annotation&start_time=&end_time="""
    dim = _dimension(ask.query)
    return accounting.dimension_keys(ask.conn, ask.c.tables, dim, *_span_of(ask.query))


@routes.get("gpu-aggregation/dimension-values")
def dimension_values(ask: Ask) -> Any:
    """?dimension_type=&dimension_key=&start_time=&end_time="""
    q = ask.query
    dim, key = _dimension(q), param(q, "dimension_key")
    if not key:
        raise bad("dimension_key is required")
    return accounting.dimension_values(ask.conn, ask.c.tables, dim, key, *_span_of(q))


@routes.get("gpu-aggregation/namespaces/hourly-stats")
def namespace_hourly(ask: Ask) -> Any:
    """?namespace=&start_time=&end_time=&page=&order_by=time|utilization&order_direction="""
    q = ask.query
    start, end = _span_of(q)
    num, _, order, desc = _order(q, ("time", "utilization"))
    return accounting.namespace_stats(ask.conn, ask.c.tables, param(q, "namespace"), start,
                                      end, num, order, desc)  # fmt: skip


@routes.get("gpu-aggregation/labels/hourly-stats")
def label_hourly(ask: Ask) -> Any:
    """?dimension_type=&dimension_key=&dimension_value=&start_time=&end_time=&page=
    &order_by=time|utilization|allocated_gpu_count&order_direction="""
    q = ask.query
    dim, key = _dimension(q), param(q, "dimension_key")
    if not key:
        raise bad("dimension_key is required")
    start, end = _span_of(q)
    num, _, order, desc = _order(q, ("time", "utilization", "allocated_gpu_count"))
    return accounting.label_stats(ask.conn, ask.c.tables, dim, key,
                                  param(q, "dimension_value"), start, end, num, order,
                                  desc)  # fmt: skip


@routes.get("gpu-aggregation/workloads/hourly-stats")
def workload_hourly(ask: Ask) -> Any:
    """?namespace=&workload_name=&workload_type=&start_time=&end_time=&page=&order_by=
    &order_direction="""
    q = ask.query
    start, end = _span_of(q)
    num, _, order, desc = _order(q, ("time", "utilization", "allocated_gpu_count"))
    return accounting.workload_stats(ask.conn, ask.c.tables, param(q, "namespace"),
                                     param(q, "workload_name"), param(q, "workload_type"),
                                     start, end, num, order, desc)  # fmt: skip


@routes.get("gpu-aggregation/snapshots/latest")
def latest_snapshot(ask: Ask) -> Any:
    return accounting.latest_snapshot(ask.conn, ask.c.tables)


@routes.get("gpu-aggregation/snapshots")
def snapshots(ask: Ask) -> Any:
    """?start_time=&end_time= (both optional)."""
    return accounting.snapshots(ask.conn, ask.c.tables, *_span(ask.query, required=False))
