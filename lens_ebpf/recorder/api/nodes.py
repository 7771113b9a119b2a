"""The GPU nodes: the list, the cluster's allocation and utilization, one node's detail,
GPUs, graphs and workloads."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import RouteTable
from lens_ebpf.recorder import allocation, gpu_nodes, node_analysis, workloads
from lens_ebpf.recorder.api.envelope import Ask, bad, page, param, span

routes = RouteTable()


@routes.get("nodes")
def node_list(ask: Ask) -> Any:
    """?page_num=&page_size=&name=&gpu_name=&status=&order_by=&desc= (NodeListResponse)."""
    q = ask.query
    num, size = page(q)
    order_by = param(q, "order_by") or "name"
    if order_by not in gpu_nodes.ORDER:
        raise bad(f"order_by={order_by!r}: one of {', '.join(sorted(gpu_nodes.ORDER))}")
    desc = (param(q, "desc") or "false").lower()
    if desc not in ("true", "false", "1", "0"):
        raise bad(f"desc={desc!r}: true or false")
    wanted = {s for s in (param(q, "status") or "").split(",") if s}
    return gpu_nodes.node_list(ask.conn, ask.c, ask.now(), num, size, order_by,
                               desc in ("true", "1"), param(q, "name") or "",
                               param(q, "gpu_name") or "", wanted)  # fmt: skip


@routes.get("nodes/fragmentation-analysis")
def fragmentation(ask: Ask) -> Any:
    """FragmentationAnalysisResponse."""
    return node_analysis.fragmentation(ask.conn, ask.c, ask.now())


@routes.get("nodes/load-balance-analysis")
def load_balance(ask: Ask) -> Any:
    """LoadBalanceAnalysisResponse."""
    return node_analysis.load_balance(ask.conn, ask.c, ask.now())


@routes.get("nodes/{name}/fragmentation")
def node_fragmentation(ask: Ask) -> Any:
    """NodeFragmentationDetail."""
    return node_analysis.node_detail(ask.conn, ask.c, ask.arg("name"), ask.now())


@routes.get("nodes/gpuAllocation")
def gpu_allocation(ask: Ask) -> Any:
    return allocation.gpu_allocation(ask.conn, ask.c.tables)


@routes.get("nodes/gpuUtilization")
def utilization(ask: Ask) -> Any:
    return gpu_nodes.utilization(ask.conn, ask.c, ask.now())


@routes.get("nodes/gpuUtilizationHistory")
def utilization_history(ask: Ask) -> Any:
    """?start=&end=&step="""
    return gpu_nodes.utilization_history(ask.c, *span(ask.query))


@routes.get("nodes/{name}")
def node_detail(ask: Ask) -> Any:
    return gpu_nodes.node_detail(ask.conn, ask.c, ask.arg("name"), ask.now())


@routes.get("nodes/{name}/gpuDevices")
def node_gpu_devices(ask: Ask) -> Any:
    return gpu_nodes.node_gpu_devices(ask.conn, ask.c, ask.arg("name"), ask.now())


@routes.get("nodes/{name}/gpuMetrics")
def node_gpu_metrics(ask: Ask) -> Any:
    """?start=&end=&step="""
    return gpu_nodes.node_gpu_metrics(ask.conn, ask.c, ask.arg("name"), *span(ask.query))


@routes.get("nodes/{name}/workloads")
def node_workloads(ask: Ask) -> Any:
    """?page_num=&page_size="""
    num, size = page(ask.query)
    return workloads.on_node(ask.conn, ask.c.tables, ask.arg("name"), num, size)


@routes.get("nodes/{name}/workloadsHistory")
def node_workloads_history(ask: Ask) -> Any:
    """?page_num=&page_size="""
    num, size = page(ask.query)
    return workloads.node_history(ask.conn, ask.c.tables, ask.arg("name"), num, size)
