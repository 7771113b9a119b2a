"""The GPU nodes: the list, one node's detail, its GPUs now and over time, and the
cluster's GPU utilization (the agents' series in Prometheus)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from lens_ebpf.recorder import prom
from lens_ebpf.recorder.errors import NotFound
from lens_ebpf.recorder.nodes.allocation import allocation_percent, gpu_allocation
from lens_ebpf.recorder.scope import Scope
from lens_ebpf.recorder.store.schema import Scoped

STATUS_COLORS = {"Ready": "green", "NotReady": "red", "Unknown": "yellow"}  # the original's
# the node label that names its GPUs, as the original reads it (AMD's labeller, NVIDIA's),
# then GPU feature discovery's product label
GPU_NAME_LABELS = (
    "amd.com/gpu.product-name",
    "nvidia.com/gpu.device-name",
    "nvidia.com/gpu.product",
)
ORDER = {"name", "ip", "gpu_name", "gpu_count", "gpu_allocation", "gpu_utilization", "status"}


def gpu_nodes(conn: Connection, t: Scoped, only: str | None = None) -> list[dict[str, Any]]:
    """Every node with GPU capacity (or only that one), as model.GPUNode but the
    utilization; its allocation as the cluster's figure counts it (gpu_allocation)."""
    n, nd = t.nodes, t.node_devices
    allocated: dict[str, int] = {}
    for a in gpu_allocation(conn, t, only):
        allocated[a["node"]] = allocated.get(a["node"], 0) + a["allocated"]
    nodes = list(
        conn.execute(
            select(n)
            .where(n.c.deleted.is_(False), *([n.c.name == only] if only else []))
            .order_by(n.c.name)
        )
    )
    unnamed = [r.name for r in nodes if not any((r.labels or {}).get(k) for k in GPU_NAME_LABELS)]
    models = (
        {
            str(r.node): str(r.model)
            for r in conn.execute(
                select(nd.c.node, nd.c.model).where(
                    nd.c.kind == "gpu",
                    nd.c.present.is_(True),
                    nd.c.model != "",
                    nd.c.node.in_(unnamed),
                )
            )
        }
        if unnamed
        else {}
    )
    out = []
    for row in nodes:
        count = sum(int(v) for v in (row.gpu_capacity or {}).values())
        if not count:
            continue
        labels = row.labels or {}
        name = next((labels[k] for k in GPU_NAME_LABELS if labels.get(k)), "") or models.get(
            row.name, ""
        )
        out.append(
            {
                "name": row.name,
                "ip": row.address,
                "gpu_name": name,
                "gpu_count": count,
                "gpu_allocation": allocated.get(row.name, 0),
                "gpu_utilization": 0.0,
                "status": row.status,
                "status_color": STATUS_COLORS.get(row.status, ""),
            }
        )
    return out


def gpu_names(conn: Connection, t: Scoped) -> dict[str, str]:
    """node -> the name of its GPUs (as the node list gives it)."""
    return {n["name"]: n["gpu_name"] for n in gpu_nodes(conn, t)}


def known(conn: Connection, t: Scoped, name: str) -> None:
    """NotFound unless the node is in the cluster's table."""
    if conn.execute(select(t.nodes.c.name).where(t.nodes.c.name == name)).first() is None:
        raise NotFound(f"node not found: {name!r}")


def node_list(
    conn: Connection,
    c: Scope,
    now: datetime,
    num: int,
    size: int,
    order_by: str,
    desc: bool,
    sub: str,
    gpu: str,
    wanted: set[str],
) -> dict[str, Any]:
    """One page of the GPU nodes whose name holds sub, with that GPU name (any: "") and
    status (any: empty), ordered by a field of ORDER; each with its GPUs' mean utilization
    now (0 where Prometheus cannot answer, said in meta.message: ordered by it, they are
    then in name order)."""
    nodes = gpu_nodes(conn, c.tables)
    nodes = [
        n
        for n in nodes
        if sub in n["name"]
        and (not gpu or n["gpu_name"] == gpu)
        and (not wanted or n["status"] in wanted)
    ]

    def utilization(of: list[dict[str, Any]], every: bool) -> None:
        if not of:
            return
        expr = prom.utilization_by_node(None if every else [n["name"] for n in of])
        got = c.prom.maybe_instant(expr, now) or []
        util = {lbl.get("node", ""): v for lbl, v in got}
        for n in of:
            n["gpu_utilization"] = util.get(n["name"], 0.0)

    by_use = order_by == "gpu_utilization"
    if by_use:  # every node's, to order them; else only the page's
        utilization(nodes, True)
    # one query: every utilization known, or none (all 0: the name order)
    nodes.sort(key=lambda n: (n[order_by], n["name"]), reverse=desc)
    shown = nodes[(num - 1) * size : num * size]
    if not by_use:
        utilization(shown, False)
    return {"data": shown, "total": len(nodes), "cluster_name": c.name}


def node_detail(conn: Connection, c: Scope, name: str, now: datetime) -> dict[str, Any]:
    """model.GpuNodeDetail and cluster_name."""
    n = c.tables.nodes
    row = conn.execute(select(n).where(n.c.name == name)).first()
    if row is None:
        raise NotFound(f"node not found: {name!r}")
    listed = next(iter(gpu_nodes(conn, c.tables, name)), None)
    nd = c.tables.node_devices
    drivers = sorted(
        {
            str(d)
            for (d,) in conn.execute(
                select(nd.c.driver_version).where(
                    nd.c.node == name,
                    nd.c.kind == "gpu",
                    nd.c.present.is_(True),
                    nd.c.driver_version != "",
                )
            )
        }
    )
    # the CPU model is the agent's hw_node_info; without Prometheus: the count alone
    info = c.prom.maybe_instant(f'hw_node_info{{node="{prom.escape(name)}"}}', now) or []
    model = next((lbl.get("cpu_model", "") for lbl, _ in info), "")
    runtime = str(row.container_runtime)
    return {
        "name": row.name,
        "health": row.status,
        "cpu": f"{row.cpu_count} X {model}" if model else str(row.cpu_count),
        "memory": row.memory,
        "os": row.os_image,
        "gpu_driver_version": ",".join(drivers),
        "static_gpu_details": f"{listed['gpu_count']} X {listed['gpu_name']}" if listed else "",
        "kubelet_version": row.kubelet_version,
        "containerd_version": runtime.removeprefix("containerd://"),
        "cluster_name": c.name,
    }


def node_gpu_devices(conn: Connection, c: Scope, name: str, now: datetime) -> dict[str, Any]:
    """NodeGPUDevicesResponse of model.GpuDeviceInfo: the node's GPUs as its agent reported
    them, with their utilization, temperature, power and memory now (0 and "" where
    Prometheus cannot answer, said in meta.message)."""
    nd = c.tables.node_devices
    known(conn, c.tables, name)
    mine = (nd.c.node == name, nd.c.kind == "gpu", nd.c.present.is_(True))
    gpus = list(conn.execute(select(nd).where(*mine).order_by(nd.c.idx)))
    values: dict[str, dict[tuple[str, str], float] | None] = {}
    for key, expr in prom.node_gpus(name).items():
        got = c.prom.maybe_instant(expr, now) if gpus else []
        values[key] = (
            None
            if got is None
            else {(lbl.get("vendor", ""), lbl.get("gpu_index", "")): v for lbl, v in got}
        )

    def figure(key: str, k: tuple[str, str]) -> float | None:
        return (values[key] or {}).get(k)

    devices = []
    for g in gpus:
        k = (g.vendor, str(g.idx))
        total = figure("memory", k)
        devices.append(
            {
                "deviceId": int(g.idx),
                "model": g.model,
                "memory": f"{int(total // 2**30)}GB" if total is not None else "",
                "utilization": figure("utilization", k) or 0.0,
                "temperature": figure("temperature", k) or 0.0,
                "power": figure("power", k) or 0.0,
            }
        )
    return {"node_name": name, "cluster_name": c.name, "devices": devices}


def node_gpu_metrics(
    conn: Connection, c: Scope, name: str, start: int, end: int, step: int
) -> dict[str, Any]:
    """NodeGPUMetricsResponse: the node's GPUs' utilization (one series per GPU) and its
    allocation rate, percent (prom.TooManyPointsError beyond max_points)."""
    known(conn, c.tables, name)
    return {
        key: {
            "serial": 0,
            "series": c.prom.graph(expr, start, end, step),
            "config": {"y_axis_unit": "%"},
        }
        for key, expr in prom.node_history(name).items()
    }


def utilization(conn: Connection, c: Scope, now: datetime) -> dict[str, Any]:
    """model.GPUUtilization: the cluster's allocation rate (percent, from the pods and nodes
    it keeps) and GPU utilization now (percent; 0 where Prometheus cannot answer)."""
    return {
        "allocationRate": allocation_percent(conn, c.tables),
        "utilization": c.prom.maybe_scalar(prom.UTILIZATION, now),
    }


def utilization_history(c: Scope, start: int, end: int, step: int) -> dict[str, Any]:
    """model.GpuUtilizationHistory: allocation rate, utilization, VRAM use over time."""
    return {
        key: c.prom.series(q, start, end, step)
        for key, q in (
            ("allocationRate", prom.ALLOCATION_RATE),
            ("utilization", prom.UTILIZATION),
            ("vramUtilization", prom.VRAM_RATIO),
        )
    }
