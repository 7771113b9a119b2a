"""The hourly GPU statistics the allocation job keeps per cluster, read a page at a time."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select

from lens_ebpf.core.times import aware
from lens_ebpf.recorder.store.schema import Scoped


def _rfc3339(value: Any) -> str:
    """A time as Go's encoding/json writes a UTC time.Time."""
    return aware(value).strftime("%Y-%m-%dT%H:%M:%SZ")  # type: ignore[union-attr]


def hourly_stats(conn: Connection, t: Scoped, start: datetime, end: datetime, num: int,
                 size: int, by_utilization: bool, descending: bool) -> dict[str, Any]:  # fmt: skip
    """PaginatedResponse of dbmodel.ClusterGpuHourlyStats: the hours from start to end,
    ordered by hour or by mean utilization."""
    hs = t.cluster_gpu_hourly_stats
    col = hs.c.avg_utilization if by_utilization else hs.c.stat_hour
    cond = [hs.c.stat_hour >= start, hs.c.stat_hour <= end]
    total = int(conn.execute(select(func.count()).select_from(hs).where(*cond)).scalar_one())
    rows = conn.execute(select(hs).where(*cond)
                        .order_by(col.desc() if descending else col.asc(), hs.c.id)
                        .offset((num - 1) * size).limit(size))  # fmt: skip
    data = [{**{c: getattr(r, c) for c in (
        "id", "cluster_name", "total_gpu_capacity", "allocated_gpu_count", "allocation_rate",
        "avg_utilization", "max_utilization", "min_utilization", "p50_utilization",
        "p95_utilization", "sample_count")},
        "stat_hour": _rfc3339(r.stat_hour), "created_at": _rfc3339(r.created_at),
        "updated_at": _rfc3339(r.updated_at)} for r in rows]  # fmt: skip
    return {"data": data, "total": total, "page": num, "page_size": size,
            "total_pages": -(-total // size)}  # fmt: skip
