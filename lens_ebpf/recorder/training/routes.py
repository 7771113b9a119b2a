"""The training routes: POST /logs (log shippers), and under the cluster API's prefixes
workloads/{uid}/trainingPerformance and workloads/{uid}/timeline."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, func, select

from lens_ebpf.core.http import Post, Response
from lens_ebpf.core.times import aware
from lens_ebpf.recorder.api import ApiError, Scope, bad, when, workload_pods
from lens_ebpf.recorder.config import RecorderConfig
from lens_ebpf.recorder.ingest.admission import answer
from lens_ebpf.recorder.store.writer import Writer
from lens_ebpf.recorder.training.logs import BodyError, gunzip, parse_body
from lens_ebpf.recorder.training.progress import Training
from lens_ebpf.recorder.training.timeline import Timeline

POINTS_MAX = 10_000
FIELDS = ("iteration", "target_iterations", "iteration_seconds", "tokens_per_second",
          "tflops_per_gpu", "loss", "skipped_iterations", "nan_iterations",
          "samples_per_second")  # fmt: skip


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


def training_performance(conn: Connection, name: str, query: dict[str, str], c: Scope
                         ) -> dict[str, Any]:  # fmt: skip
    """workloads/{uid}/trainingPerformance?start=&end=: the points its pods' logs gave
    (oldest first) and their summary; uid is any level of the workload hierarchy."""
    uid, t = name, c.tables
    if conn.execute(select(t.gpu_workloads.c.uid).where(t.gpu_workloads.c.uid == uid)
                    ).first() is None:  # fmt: skip
        raise ApiError(404, 4004, f"workload not found: {uid!r}")
    start, end = when(query, "start"), when(query, "end")
    if start is not None and end is not None and end < start:
        raise bad("end is before start")
    tp = t.training_points
    cond: list[ColumnElement[bool]] = [
        tp.c.pod_uid.in_([p.uid for p in workload_pods(conn, t, uid)])
    ]
    cond += [tp.c.at >= start] if start is not None else []
    cond += [tp.c.at <= end] if end is not None else []
    n = int(conn.execute(select(func.count()).select_from(tp).where(*cond)).scalar_one())
    if n > POINTS_MAX:
        raise bad(f"start, end: {n} points; at most {POINTS_MAX}: narrow the range")
    rows = list(conn.execute(select(tp).where(*cond).order_by(tp.c.at, tp.c.id)))
    points = [{"time": round(aware(r.at).timestamp(), 3),  # type: ignore[union-attr]
               "pod": r.pod, "node": r.node, "format": r.format,
               **{f: getattr(r, f) for f in FIELDS}} for r in rows]  # fmt: skip
    return {"points": points, "summary": summary(rows)}


def api_routes(cfg: RecorderConfig, clock: Callable[[], datetime]
               ) -> list[tuple[re.Pattern[str], Callable[..., Any]]]:  # fmt: skip
    """The cluster API table's entries for training (api.routes(extra=...))."""

    def timeline_route(conn: Connection, name: str, query: dict[str, str], c: Scope
                       ) -> dict[str, Any]:  # fmt: skip
        """workloads/{uid}/timeline?start=&end= (unix seconds or RFC 3339; default the
        workload's life up to now)."""
        return Timeline(c.prom, cfg.timeline, c.tables)(conn, name, query, clock())

    return [
        (re.compile(r"^workloads/([^/]+)/trainingPerformance$"), training_performance),
        (re.compile(r"^workloads/([^/]+)/timeline$"), timeline_route),
    ]


def post_logs(training: Training, writer: Writer, max_body: int,
              clock: Callable[[], datetime]) -> Callable[[Post], Response]:  # fmt: skip
    """POST /logs: the lines of a shipper's body (logs.py), counted by result."""

    def handler(req: Post) -> Response:
        if writer.depth() >= writer.queue_max:
            return answer(503, "the write queue is full (the database is slow or down): retry")
        try:
            body = gunzip(req.body, req.headers.get("content-encoding", ""), max_body)
            got = parse_body(body, req.query)
        except BodyError as exc:
            return answer(exc.status, str(exc))
        training.count_malformed(got.malformed)
        counts = training.ingest(got.lines, clock())
        data = {"shipper": got.shipper, "lines": len(got.lines), "malformed": got.malformed,
                **counts}  # fmt: skip
        if got.malformed and not got.lines:
            return answer(400, f"no record taken: {got.why}", data)
        return answer(200, f"skipped {got.malformed}: {got.why}" if got.malformed else "OK",
                      data)  # fmt: skip

    return handler
