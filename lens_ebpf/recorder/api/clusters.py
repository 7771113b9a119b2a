"""The clusters: which the service follows, and one cluster at a glance."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder import workloads
from lens_ebpf.recorder.api.envelope import PAGE, Ask, page, when
from lens_ebpf.recorder.nodes import allocation, overview

routes = RouteTable()


@routes.get("clusters")
def listing(ask: Ask) -> Any:
    """Each cluster, whether it is watched and up, and why not."""
    return ask.app.clusters.listing()


@routes.get("clusters/overview")
def cluster_overview(ask: Ask) -> Any:
    """The cluster at a glance: its nodes, GPUs allocated and busy, storage, network."""
    return overview.overview(ask.conn, ask.c, ask.now())


@routes.get("clusters/gpuHeatmap")
def heatmap(ask: Ask) -> Any:
    """Each GPU's utilization, power and temperature now, by node (the heatmap)."""
    return overview.heatmap(ask.c, ask.now())


@routes.get("clusters/consumers", PAGE)
def consumers(ask: Ask) -> Any:
    """The running workloads that hold GPUs, most GPUs first, with their utilization."""
    num, size = page(ask.query)
    return workloads.consumers(ask.conn, ask.c, ask.now(), num, size)


@routes.get(
    "clusters/allocation",
    Param("start", "time", "unix seconds or RFC 3339"),
    Param("end", "time", "unix seconds or RFC 3339"),
)
def cluster_allocation(ask: Ask) -> Any:
    """The cluster's GPU allocation over time, from its snapshots (the span: every one)."""
    end, start = when(ask.query, "end"), when(ask.query, "start")
    return allocation.allocation_points(ask.conn, ask.c.tables, start, end)
