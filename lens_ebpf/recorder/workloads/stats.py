"""A workload's GPU utilization figures over its life or a span (the workload page's
stats and the workload list's batch of them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from lens_ebpf.core.times import aware
from lens_ebpf.recorder import prom
from lens_ebpf.recorder.errors import BadRequest, NotFound
from lens_ebpf.recorder.scope import Scope
from lens_ebpf.recorder.workloads import workload, workload_pods

MAX_BATCH = 200  # uids one batchStats request may ask about
FIGURES = (
    "instant_gpu_utilization",
    "avg_gpu_utilization",
    "p50_gpu_utilization",
    "p90_gpu_utilization",
    "p95_gpu_utilization",
    "max_gpu_utilization",
)


def stats(
    conn: Connection,
    c: Scope,
    uid: str,
    now: datetime,
    start: datetime | None = None,
    end: datetime | None = None,
    metrics: list[str] | None = None,
) -> dict[str, Any]:
    """The workload's pods' mean GPU utilization from start (default: its creation) to end
    (default: its end or now): instant (while it runs), average, p50, p90, p95 and max; 0
    where Prometheus cannot answer (said in meta.message); metrics: only these figures."""
    unknown = sorted(set(metrics or ()) - set(FIGURES))
    if unknown:
        raise BadRequest(f"metrics={unknown}: not one of {', '.join(FIGURES)}")
    row = workload(conn, c.tables, uid)
    pods = workload_pods(conn, c.tables, uid)
    begin = start or aware(row.created_at) or now
    finish = min(end or aware(row.ended_at) or now, now)
    if finish < begin:
        raise BadRequest("end is before start")
    out: dict[str, Any] = {
        "uid": row.uid,
        "name": row.name,
        "namespace": row.namespace,
        "kind": row.kind,
        "start": int(begin.timestamp()),
        "end": int(finish.timestamp()),
    }
    figures = dict.fromkeys(FIGURES, 0.0)
    if pods:
        seconds = max(60, int((finish - begin).total_seconds()))
        sel = prom.pods_selector(row.namespace, [p.name for p in pods])
        series = f"avg(gpu_utilization{{{sel}}})[{seconds}s:60s]"
        want = set(metrics or FIGURES)
        asks = {
            "avg_gpu_utilization": f"avg_over_time({series})",
            "max_gpu_utilization": f"max_over_time({series})",
            **{
                f"p{int(q * 100)}_gpu_utilization": f"quantile_over_time({q}, {series})"
                for q in (0.5, 0.9, 0.95)
            },
        }
        for name, expr in asks.items():
            if name in want:
                figures[name] = c.prom.maybe_scalar(expr, finish)
        if "instant_gpu_utilization" in want and row.ended_at is None and end is None:
            figures["instant_gpu_utilization"] = c.prom.maybe_scalar(
                f"avg(gpu_utilization{{{sel}}})", now
            )
    out.update({k: v for k, v in figures.items() if not metrics or k in metrics})
    return out


def batch(
    conn: Connection, c: Scope, uids: list[str], now: datetime, metrics: list[str] | None = None
) -> dict[str, Any]:
    """stats() of each uid over its life, by uid; a uid not known is left out and named in
    missing."""
    if len(uids) > MAX_BATCH:
        raise BadRequest(f"uids: at most {MAX_BATCH} a request, {len(uids)} asked")
    got: dict[str, Any] = {}
    missing: list[str] = []
    for uid in dict.fromkeys(uids):
        try:
            got[uid] = stats(conn, c, uid, now, metrics=metrics)
        except NotFound:
            missing.append(uid)
    return {"stats": got, "missing": missing}
