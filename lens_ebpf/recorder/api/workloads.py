"""The workloads: the list, its filters, a hierarchy, one workload and its graphs."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder import workloads
from lens_ebpf.recorder.accounting import reads
from lens_ebpf.recorder.api.envelope import PAGE, SPAN, Ask, bad, page, param, span

routes = RouteTable()
KIND = Param("kind", doc="the workload's kind (Job, PyTorchJob, Deployment, ...)", required=True)
NAME = Param("name", doc="the workload's name", required=True)
NAMESPACE = Param("namespace", doc="its namespace (any: the newest of that kind and name)")


@routes.get(
    "workloads",
    PAGE,
    Param("name", doc="a part of the workload's name"),
    Param("namespace"),
    Param("kind"),
    Param("status", doc="Running, Done, ..."),
    Param("order_by", doc="newest first by this (none: start_at)", choices=("start_at", "end_at")),
)
def workload_list(ask: Ask) -> Any:
    """One page of the top-level workloads, newest first, each with its GPUs and its pods'
    GPU utilization over its life (average, p50, p90, p95)."""
    q = ask.query
    num, size = page(q)
    order = param(q, "order_by") or ""
    if order not in ("", "start_at", "end_at"):
        raise bad(f"order_by={order!r}: start_at or end_at")
    return workloads.listing(
        ask.conn,
        ask.c,
        ask.now(),
        num,
        size,
        order,
        param(q, "name"),
        param(q, "namespace"),
        param(q, "kind"),
        param(q, "status"),
    )


@routes.get("workloadMetadata")
def metadata(ask: Ask) -> Any:
    """The namespaces and kinds of the top-level workloads (the list's filters)."""
    return workloads.metadata(ask.conn, ask.c.tables)


@routes.get("workloads/hierarchy", KIND, NAME, NAMESPACE)
def hierarchy_query(ask: Ask) -> Any:
    """The hierarchy (the workload and every one below it) of the newest workload of a
    kind and name."""
    q = ask.query
    kind, name, ns = param(q, "kind"), param(q, "name"), param(q, "namespace")
    if not kind or not name:
        raise bad("kind and name are required")
    return workloads.hierarchy_of(ask.conn, ask.c.tables, kind, name, ns)


@routes.get("workloads/statistic")
def statistic(ask: Ask) -> Any:
    """The running top-level workloads: how many, their mean GPUs requested and GPU
    utilization over the last hour, how many stay under 30% (WorkloadStatisticResp)."""
    return reads.workload_statistic(ask.conn, ask.c, ask.now())


@routes.get("workloads/statistics")
def statistics(ask: Ask) -> Any:
    """As workloads/statistic (the path the web UI calls): the running workloads' count,
    GPUs and utilization over the last hour."""
    return reads.workload_statistic(ask.conn, ask.c, ask.now())


@routes.get("workloads/gpuUtilizationHistory", KIND, NAME, NAMESPACE, SPAN)
def utilization_history(ask: Ask) -> Any:
    """A workload's pods' mean GPU utilization over a span, by its kind and name."""
    q = ask.query
    kind, name = param(q, "kind"), param(q, "name")
    if not kind or not name:
        raise bad("kind and name are required")
    return reads.utilization_history(ask.conn, ask.c, kind, name, param(q, "namespace"), *span(q))


@routes.get("workloads/{uid}")
def detail(ask: Ask) -> Any:
    """One workload by uid: its kind, namespace, GPUs, pods, times and status."""
    return workloads.detail(ask.conn, ask.c.tables, ask.arg("uid"))


@routes.get("workloads/{uid}/hierarchy")
def hierarchy(ask: Ask) -> Any:
    """A workload (by uid) and every workload below it."""
    return workloads.hierarchy(ask.conn, ask.c.tables, ask.arg("uid"))


@routes.get("workloads/{uid}/metrics", SPAN)
def graphs(ask: Ask) -> Any:
    """A workload's graphs over a span: its GPUs' utilization, memory and power per node
    and pod, TCP bytes/s and median RTT to its pods."""
    return workloads.graphs(ask.conn, ask.c, ask.arg("uid"), *span(ask.query))
