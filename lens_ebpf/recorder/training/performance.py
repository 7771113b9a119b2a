"""Training performance: the points a workload's pods' logs gave and their summary."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, func, select

from lens_ebpf.core.times import utc
from lens_ebpf.recorder.errors import BadRequest, NotFound
from lens_ebpf.recorder.store.schema import Scoped
from lens_ebpf.recorder.workloads import workload_pods

POINTS_MAX = 10_000
FIELDS = (
    "iteration",
    "target_iterations",
    "iteration_seconds",
    "tokens_per_second",
    "tflops_per_gpu",
    "loss",
    "skipped_iterations",
    "nan_iterations",
    "samples_per_second",
)


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between the nearest ranks (numpy's default)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _r(v: float | None) -> float | None:
    return round(v, 6) if v is not None else None


def summary(rows: list[Any]) -> dict[str, Any]:
    """iterations (distinct), the time per iteration (each iteration's slowest pod: the
    job waits for it) as mean, p50, p95; tokens/s per GPU and TFLOP/s per GPU (means of
    the lines'); the last loss."""
    slowest: dict[int, float] = {}
    for r in rows:
        if r.iteration is not None and r.iteration_seconds is not None:
            slowest[r.iteration] = max(slowest.get(r.iteration, 0.0), r.iteration_seconds)
    secs = list(slowest.values())

    def mean(col: str) -> float | None:
        vals = [getattr(r, col) for r in rows if getattr(r, col) is not None]
        return sum(vals) / len(vals) if vals else None

    losses = [r.loss for r in rows if r.loss is not None]
    return {
        "iterations": len({r.iteration for r in rows if r.iteration is not None}),
        "mean_iteration_seconds": _r(sum(secs) / len(secs)) if secs else None,
        "p50_iteration_seconds": _r(quantile(secs, 0.5)) if secs else None,
        "p95_iteration_seconds": _r(quantile(secs, 0.95)) if secs else None,
        "tokens_per_second": _r(mean("tokens_per_second")),
        "tflops_per_gpu": _r(mean("tflops_per_gpu")),
        "last_loss": losses[-1] if losses else None,
    }


def training_performance(
    conn: Connection, t: Scoped, uid: str, start: datetime | None, end: datetime | None
) -> dict[str, Any]:
    """The points its pods' logs gave between start and end (either may be None; oldest
    first) and their summary; uid is any level of the workload hierarchy."""
    if (
        conn.execute(select(t.gpu_workloads.c.uid).where(t.gpu_workloads.c.uid == uid)).first()
        is None
    ):
        raise NotFound(f"workload not found: {uid!r}")
    if start is not None and end is not None and end < start:
        raise BadRequest("end is before start")
    tp = t.training_points
    cond: list[ColumnElement[bool]] = [
        tp.c.pod_uid.in_([p.uid for p in workload_pods(conn, t, uid)])
    ]
    cond += [tp.c.at >= start] if start is not None else []
    cond += [tp.c.at <= end] if end is not None else []
    n = int(conn.execute(select(func.count()).select_from(tp).where(*cond)).scalar_one())
    if n > POINTS_MAX:
        raise BadRequest(f"start, end: {n} points; at most {POINTS_MAX}: narrow the range")
    rows = list(conn.execute(select(tp).where(*cond).order_by(tp.c.at, tp.c.id)))
    points = [
        {
            "time": round(utc(r.at).timestamp(), 3),
            "pod": r.pod,
            "node": r.node,
            "format": r.format,
            **{f: getattr(r, f) for f in FIELDS},
        }
        for r in rows
    ]
    return {"points": points, "summary": summary(rows)}
