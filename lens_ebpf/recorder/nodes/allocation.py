"""GPU allocation: what running pods requested of each node's GPUs, the cluster's figure
(one for the same moment on every route: the overview, the dashboard, the node list, the
snapshots and so the hourly statistics), and the snapshots the allocation job keeps."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select

from lens_ebpf.core.times import utc
from lens_ebpf.recorder.errors import BadRequest
from lens_ebpf.recorder.store.schema import Scoped

# a GPU resource -> the vendor the Primus-Lens API names it by (its GpuVendor values)
VENDORS = {"amd.com/gpu": "amd", "nvidia.com/gpu": "NVIDIA"}
POINTS_MAX = 10_000  # allocation snapshots one answer gives


def gpu_allocation(conn: Connection, t: Scoped, only: str | None = None) -> list[dict[str, Any]]:
    """Per node (or only that one) and GPU resource with a capacity (model.GpuAllocation),
    the GPUs running pods requested; allocationRate is a ratio (0 to 1), as the original
    computes it."""
    n, p = t.nodes, t.gpu_pods
    allocated: dict[tuple[str, str], int] = {}
    for row in conn.execute(
        select(p.c.node, p.c.gpu_resources).where(
            p.c.running.is_(True), p.c.deleted.is_(False), *([p.c.node == only] if only else [])
        )
    ):
        node, res = row.node, row.gpu_resources or {}
        for resource, count in res.items():
            key = (str(node), str(resource))
            allocated[key] = allocated.get(key, 0) + int(count)
    out = []
    for row in conn.execute(
        select(n)
        .where(n.c.deleted.is_(False), *([n.c.name == only] if only else []))
        .order_by(n.c.name)
    ):
        for resource, capacity in sorted((row.gpu_capacity or {}).items()):
            if not capacity:
                continue
            used = allocated.get((row.name, resource), 0)
            out.append(
                {
                    "node": row.name,
                    "vendor": VENDORS.get(resource, resource),
                    "capacity": int(capacity),
                    "allocated": used,
                    "allocationRate": used / int(capacity),
                }
            )
    return out


def cluster_allocation(
    conn: Connection, t: Scoped, per_node: list[dict[str, Any]] | None = None
) -> tuple[int, int]:
    """(GPUs running pods requested, GPU capacity) of the cluster's GPU nodes, every one
    of them: what the node list adds up to and the snapshots keep (per_node:
    gpu_allocation's rows, when the caller has them). The original leaves tainted nodes
    out of the overview's rate but not out of its statistics; a node tainted for GPU work
    alone holds GPUs all the same."""
    rows = gpu_allocation(conn, t) if per_node is None else per_node
    return sum(a["allocated"] for a in rows), sum(a["capacity"] for a in rows)


def allocation_percent(
    conn: Connection, t: Scoped, per_node: list[dict[str, Any]] | None = None
) -> float:
    """cluster_allocation's GPUs requested, percent of its capacity."""
    allocated, capacity = cluster_allocation(conn, t, per_node)
    return 100 * allocated / capacity if capacity else 0.0


def allocation_points(
    conn: Connection, t: Scoped, start: datetime | None, end: datetime | None
) -> dict[str, Any]:
    """The cluster's allocation snapshots between start and end (either may be None),
    `{"points": [{"timestamp", "allocatable", "requested", "rate"}]}` (rate in percent);
    more than POINTS_MAX is refused."""
    s = t.allocation_snapshots
    cond = [s.c.node == ""]
    if start is not None:
        cond.append(s.c.at >= start)
    if end is not None:
        cond.append(s.c.at <= end)
    if start is not None and end is not None and end < start:
        raise BadRequest("end is before start")
    n = int(conn.execute(select(func.count()).select_from(s).where(*cond)).scalar_one())
    if n > POINTS_MAX:
        raise BadRequest(f"start, end: {n} snapshots; at most {POINTS_MAX}: narrow the range")
    rows = conn.execute(select(s).where(*cond).order_by(s.c.at))
    return {
        "points": [
            {
                "timestamp": _ts(r.at),
                "allocatable": r.allocatable,
                "requested": r.requested,
                "rate": r.rate,
            }
            for r in rows
        ]
    }


def _ts(value: Any) -> int:
    return int(utc(value).timestamp()) if value is not None else 0
