"""The workloads: the list, its filters, a hierarchy, one workload and its graphs."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import RouteTable
from lens_ebpf.recorder import accounting, workloads
from lens_ebpf.recorder.api.envelope import Ask, bad, page, param, span

routes = RouteTable()


@routes.get("workloads")
def workload_list(ask: Ask) -> Any:
    """?page_num=&page_size=&name=&namespace=&kind=&status=&order_by="""
    q = ask.query
    num, size = page(q)
    order = param(q, "order_by") or ""
    if order not in ("", "start_at", "end_at"):
        raise bad(f"order_by={order!r}: start_at or end_at")
    return workloads.listing(ask.conn, ask.c, ask.now(), num, size, order, param(q, "name"),
                             param(q, "namespace"), param(q, "kind"),
                             param(q, "status"))  # fmt: skip


@routes.get("workloadMetadata")
def metadata(ask: Ask) -> Any:
    return workloads.metadata(ask.conn, ask.c.tables)


@routes.get("workloads/hierarchy")
def hierarchy_query(ask: Ask) -> Any:
    """?kind=&name=[&namespace=]"""
    q = ask.query
    kind, name, ns = param(q, "kind"), param(q, "name"), param(q, "namespace")
    if not kind or not name:
        raise bad("kind and name are required")
    return workloads.hierarchy_of(ask.conn, ask.c.tables, kind, name, ns)


@routes.get("workloads/statistic")
def statistic(ask: Ask) -> Any:
    """model.WorkloadStatisticResp (the original's path)."""
    return accounting.workload_statistic(ask.conn, ask.c, ask.now())


@routes.get("workloads/statistics")
def statistics(ask: Ask) -> Any:
    """As workloads/statistic: the path the web UI calls."""
    return accounting.workload_statistic(ask.conn, ask.c, ask.now())


@routes.get("workloads/gpuUtilizationHistory")
def utilization_history(ask: Ask) -> Any:
    """?kind=&name=[&namespace=]&start=&end=[&step=] (unix seconds)."""
    q = ask.query
    kind, name = param(q, "kind"), param(q, "name")
    if not kind or not name:
        raise bad("kind and name are required")
    return accounting.utilization_history(ask.conn, ask.c, kind, name, param(q, "namespace"),
                                          *span(q))  # fmt: skip


@routes.get("workloads/{uid}")
def detail(ask: Ask) -> Any:
    return workloads.detail(ask.conn, ask.c.tables, ask.arg("uid"))


@routes.get("workloads/{uid}/hierarchy")
def hierarchy(ask: Ask) -> Any:
    return workloads.hierarchy(ask.conn, ask.c.tables, ask.arg("uid"))


@routes.get("workloads/{uid}/metrics")
def graphs(ask: Ask) -> Any:
    """?start=&end=&step="""
    return workloads.graphs(ask.conn, ask.c, ask.arg("uid"), *span(ask.query))
