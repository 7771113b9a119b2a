"""The cluster at a glance: its GPU nodes by health and idleness with its rates (the
overview), and the heatmap of its busiest nodes' GPUs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from lens_ebpf.recorder import prom
from lens_ebpf.recorder.nodes.allocation import allocation_percent, gpu_allocation
from lens_ebpf.recorder.scope import Scope


def overview(conn: Connection, c: Scope, now: datetime) -> dict[str, Any]:
    """model.GpuClusterOverview: GPU nodes by health (faulty: not Ready, or tainted) and by
    idleness (of their GPUs requested), allocation rate and utilization (percent), RDMA
    bytes/s, and the storage scan's space (the volumes' capacity and what their claims
    use; inodes and bandwidth are not measured: 0). Utilization and RDMA are 0 where
    Prometheus cannot answer (said in meta.message), the space used where the scan could
    not measure it."""
    n = c.tables.nodes
    rows = [
        r
        for r in conn.execute(select(n).where(n.c.deleted.is_(False)))
        if sum(int(v) for v in (r.gpu_capacity or {}).values())
    ]
    faulty = sum(1 for r in rows if r.status != "Ready" or r.taints)
    per_node: dict[str, list[int]] = {}
    allocation = gpu_allocation(conn, c.tables)
    for a in allocation:
        pair = per_node.setdefault(a["node"], [0, 0])
        pair[0] += a["allocated"]
        pair[1] += a["capacity"]
    idle = sum(1 for a, c in per_node.values() if a == 0)
    busy = sum(1 for a, c in per_node.values() if a >= c)
    space: dict[str, float | None] = {
        "total_space": 0.0,
        "used_space": 0.0,
        "usage_percentage": 0.0,
    }
    if c.storage is not None:
        space.update(c.storage())
    return {
        **space,
        "total_inodes": 0.0,
        "used_inodes": 0.0,
        "inodes_usage_percentage": 0.0,
        "read_bandwidth": 0.0,
        "write_bandwidth": 0.0,
        "total_tx": c.prom.maybe_scalar(prom.RDMA_TX, now),
        "total_rx": c.prom.maybe_scalar(prom.RDMA_RX, now),
        "totalNodes": len(rows),
        "healthyNodes": len(rows) - faulty,
        "faultyNodes": faulty,
        "fullyIdleNodes": idle,
        "partiallyIdleNodes": len(per_node) - idle - busy,
        "busyNodes": busy,
        "allocationRate": allocation_percent(conn, c.tables, allocation),
        "utilization": c.prom.maybe_scalar(prom.UTILIZATION, now),
    }


def heatmap(c: Scope, now: datetime) -> dict[str, Any]:
    """Every GPU of the 5 nodes with the highest mean, for utilization, temperature and
    power, with the original's axes and units (its items under a capital `Data`, as its
    struct has no json tag there)."""
    out = {}
    axes = {
        "utilization": (1, "%", 100, 0),
        "power": (2, "W", 850, 0),
        "temperature": (3, "℃", 110, 20),
    }
    for key, expr in prom.HEATMAP.items():
        gpus = [
            (lbl.get("node", ""), lbl.get("gpu_id", ""), v) for lbl, v in c.prom.instant(expr, now)
        ]
        by_node: dict[str, list[float]] = {}
        for node, _, v in gpus:
            by_node.setdefault(node, []).append(v)
        means = sorted(by_node, key=lambda n: (-sum(by_node[n]) / len(by_node[n]), n))
        top = set(means[:5])  # topk(5, avg by (node) (...)), then those nodes' GPUs
        items = sorted(
            (
                {"node_name": node, "gpu_id": int(gpu) if gpu.isdigit() else 0, "value": v}
                for node, gpu, v in gpus
                if node in top
            ),
            key=lambda i: (i["node_name"], i["gpu_id"]),
        )
        serial, unit, ymax, ymin = axes[key]
        out[key] = {
            "serial": serial,
            "unit": unit,
            "yaxis_max": ymax,
            "yaxis_min": ymin,
            "Data": items,
        }
    return out
