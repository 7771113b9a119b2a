"""The clusters: which the service follows, and one cluster at a glance."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import RouteTable
from lens_ebpf.recorder import allocation, overview, workloads
from lens_ebpf.recorder.api.envelope import Ask, page, when

routes = RouteTable()


@routes.get("clusters")
def listing(ask: Ask) -> Any:
    """Each cluster, whether it is watched and up, and why not."""
    return ask.app.clusters.listing()


@routes.get("clusters/overview")
def cluster_overview(ask: Ask) -> Any:
    return overview.overview(ask.conn, ask.c, ask.now())


@routes.get("clusters/gpuHeatmap")
def heatmap(ask: Ask) -> Any:
    return overview.heatmap(ask.c, ask.now())


@routes.get("clusters/consumers")
def consumers(ask: Ask) -> Any:
    """?page_num=&page_size="""
    num, size = page(ask.query)
    return workloads.consumers(ask.conn, ask.c, ask.now(), num, size)


@routes.get("clusters/allocation")
def cluster_allocation(ask: Ask) -> Any:
    """?start=&end= (unix seconds or RFC 3339; either may be left out)."""
    end, start = when(ask.query, "end"), when(ask.query, "start")
    return allocation.allocation_points(ask.conn, ask.c.tables, start, end)
