"""The GPU nodes: the list, the cluster's allocation and utilization, one node's detail,
GPUs, graphs and workloads."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder import workloads
from lens_ebpf.recorder.api.envelope import PAGE, SPAN, Ask, bad, page, param, span
from lens_ebpf.recorder.nodes import allocation
from lens_ebpf.recorder.nodes import analysis as node_analysis
from lens_ebpf.recorder.nodes import gpus as gpu_nodes

routes = RouteTable()


@routes.get(
    "nodes",
    PAGE,
    Param("name", doc="a part of the node's name"),
    Param("gpu_name", doc="the GPU model"),
    Param("status", "list", "node statuses (any of them)"),
    Param(
        "order_by",
        doc="the field ordered by",
        default="name",
        choices=tuple(sorted(gpu_nodes.ORDER)),
    ),
    Param("desc", "boolean", "descending", default=False),
)
def node_list(ask: Ask) -> Any:
    """One page of the GPU nodes, filtered and ordered, each with its GPUs' mean
    utilization now (NodeListResponse)."""
    q = ask.query
    num, size = page(q)
    order_by = param(q, "order_by") or "name"
    if order_by not in gpu_nodes.ORDER:
        raise bad(f"order_by={order_by!r}: one of {', '.join(sorted(gpu_nodes.ORDER))}")
    desc = (param(q, "desc") or "false").lower()
    if desc not in ("true", "false", "1", "0"):
        raise bad(f"desc={desc!r}: true or false")
    wanted = {s for s in (param(q, "status") or "").split(",") if s}
    return gpu_nodes.node_list(
        ask.conn,
        ask.c,
        ask.now(),
        num,
        size,
        order_by,
        desc in ("true", "1"),
        param(q, "name") or "",
        param(q, "gpu_name") or "",
        wanted,
    )


@routes.get("nodes/fragmentation-analysis")
def fragmentation(ask: Ask) -> Any:
    """How fragmented the cluster's free GPUs are: each node's score, and the cluster's
    (FragmentationAnalysisResponse)."""
    return node_analysis.fragmentation(ask.conn, ask.c, ask.now())


@routes.get("nodes/load-balance-analysis")
def load_balance(ask: Ask) -> Any:
    """Each node's load (allocation and utilization), how evenly it is spread, the nodes
    well above or below the mean (LoadBalanceAnalysisResponse)."""
    return node_analysis.load_balance(ask.conn, ask.c, ask.now())


@routes.get("nodes/{name}/fragmentation")
def node_fragmentation(ask: Ask) -> Any:
    """One node's fragmentation score, its allocation pattern and pods
    (NodeFragmentationDetail)."""
    return node_analysis.node_detail(ask.conn, ask.c, ask.arg("name"), ask.now())


@routes.get("nodes/gpuAllocation")
def gpu_allocation(ask: Ask) -> Any:
    """Per node and GPU resource: capacity, the GPUs running pods requested, the rate."""
    return allocation.gpu_allocation(ask.conn, ask.c.tables)


@routes.get("nodes/gpuUtilization")
def utilization(ask: Ask) -> Any:
    """The cluster's GPU allocation rate and utilization now (percent)."""
    return gpu_nodes.utilization(ask.conn, ask.c, ask.now())


@routes.get("nodes/gpuUtilizationHistory", SPAN)
def utilization_history(ask: Ask) -> Any:
    """The cluster's GPU allocation rate, utilization and VRAM use over a span."""
    return gpu_nodes.utilization_history(ask.c, *span(ask.query))


@routes.get("nodes/{name}")
def node_detail(ask: Ask) -> Any:
    """One GPU node in detail: its GPUs and their allocation, drivers, CPU, status."""
    return gpu_nodes.node_detail(ask.conn, ask.c, ask.arg("name"), ask.now())


@routes.get("nodes/{name}/gpuDevices")
def node_gpu_devices(ask: Ask) -> Any:
    """A node's GPUs as its agent reported them, with utilization, temperature, power and
    memory now."""
    return gpu_nodes.node_gpu_devices(ask.conn, ask.c, ask.arg("name"), ask.now())


@routes.get("nodes/{name}/gpuMetrics", SPAN)
def node_gpu_metrics(ask: Ask) -> Any:
    """A node's GPUs' utilization (a series per GPU) and its allocation rate over a span."""
    return gpu_nodes.node_gpu_metrics(ask.conn, ask.c, ask.arg("name"), *span(ask.query))


@routes.get("nodes/{name}/workloads", PAGE)
def node_workloads(ask: Ask) -> Any:
    """One page of the running top-level workloads with a pod on the node, their GPUs in
    all and on it."""
    num, size = page(ask.query)
    return workloads.on_node(ask.conn, ask.c.tables, ask.arg("name"), num, size)


@routes.get("nodes/{name}/workloadsHistory", PAGE)
def node_workloads_history(ask: Ask) -> Any:
    """One page of the node's GPU pods that ran and are over, newest first, each with its
    top-level workload."""
    num, size = page(ask.query)
    return workloads.node_history(ask.conn, ask.c.tables, ask.arg("name"), num, size)
