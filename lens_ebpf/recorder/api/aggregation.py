"""gpu-aggregation/*: the clusters aggregated, and their hourly GPU statistics."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import RouteTable
from lens_ebpf.recorder.api.envelope import PAGE_MAX, Ask, bad, integer, param
from lens_ebpf.recorder.hourly_stats import hourly_stats
from lens_ebpf.recorder.lifecycle import parse_time

routes = RouteTable()


@routes.get("gpu-aggregation/clusters")
def clusters(ask: Ask) -> Any:
    return ask.app.clusters.names()


@routes.get("gpu-aggregation/cluster/hourly-stats")
def hourly(ask: Ask) -> Any:
    """?start_time=&end_time=&page=&page_size=&order_by=&order_direction= (RFC 3339)."""
    q, bounds = ask.query, []
    for key in ("start_time", "end_time"):
        raw = param(q, key)
        got = parse_time(raw) if raw else None
        if got is None:
            raise bad(f"{key}={raw!r}: an RFC 3339 time is required")
        bounds.append(got)
    num = integer(q, "page", 1)
    size = integer(q, "page_size", 20)
    if num < 1 or not 1 <= size <= PAGE_MAX:
        raise bad(f"page={num}, page_size={size}: page from 1, page_size from 1 to {PAGE_MAX}")
    order = param(q, "order_by") or "time"
    direction = (param(q, "order_direction") or "desc").lower()
    if order not in ("time", "utilization") or direction not in ("asc", "desc"):
        raise bad(f"order_by={order!r}, order_direction={direction!r}: time or utilization, "
                  "asc or desc")  # fmt: skip
    return hourly_stats(ask.conn, ask.c.tables, bounds[0], bounds[1], num, size,
                        order == "utilization", direction == "desc")  # fmt: skip
