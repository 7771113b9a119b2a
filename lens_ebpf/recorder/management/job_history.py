"""Every run of every recorder job (the Management pages' Job Execution History): the
leader records its own runs as the runner tells of them (Runner.observe), each with its
start, end, outcome, error and the rows it touched (what it returns, else the writes it
queued); runs older than recorder.job_history.retention_days are pruned. The queries
answer the page's list, one run, a job's statistics and the recent failures in the
original's shapes (dbmodel.JobExecutionHistory, database.JobStatistics)."""

from __future__ import annotations

import socket
import statistics
import threading
from collections import Counter, deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, select

from lens_ebpf.core.runner import Run
from lens_ebpf.recorder.alerts.model import when
from lens_ebpf.recorder.errors import BadRequest, NotFound
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import Op, Writer

STATUSES = ("running", "success", "failed", "cancelled", "timeout")
ORDER = {
    "started_at": t.job_execution_history.c.started_at,
    "ended_at": t.job_execution_history.c.ended_at,
    "duration_seconds": t.job_execution_history.c.duration_seconds,
    "job_name": t.job_execution_history.c.job_name,
    "status": t.job_execution_history.c.status,
    "id": t.job_execution_history.c.id,
}
STATS_RUNS = 10_000  # a job's statistics are of its last this many runs


def job_type(name: str) -> str:
    """A job's kind: its name without the cluster it runs for (storage_scan/b: storage_scan)."""
    return name.split("/", 1)[0]


def cluster_of(name: str, home: str) -> str:
    """The cluster a job runs for: the one its name carries (storage_scan/<cluster>), else the
    home cluster (the service's own jobs)."""
    _, sep, cluster = name.partition("/")
    return cluster if sep and cluster else home


def rows_of(result: object, queued: int) -> int:
    """The rows a run touched: what its function says (a count it returns, or a mapping of
    counts), else the writes it queued for the database."""
    if isinstance(result, bool) or result is None:
        return queued
    if isinstance(result, int):
        return max(result, 0)
    if (
        isinstance(result, dict)
        and result
        and all(isinstance(v, int) and not isinstance(v, bool) for v in result.values())
    ):
        return sum(max(int(v), 0) for v in result.values())
    return queued


class JobHistory:
    """The runner's observer: on the leader, each run a row. Rows are held here and written
    by flush() (a job of every replica, every few seconds) in one statement, straight to
    the database and not through the writer's queue: the queue holds what the service
    ingests, bounded, and a run's record must neither take a place there nor count in its
    depth (what a database outage holds is the ingest's). Held rows beyond HELD_MAX are
    dropped and counted."""

    HELD_MAX = 10_000

    def __init__(
        self,
        engine: Engine,
        writer: Writer,
        home: str,
        leads: Callable[[], bool],
        enabled: Callable[[], bool],
        hostname: str = "",
    ) -> None:
        self.engine, self.writer, self.home = engine, writer, home
        self.leads, self.enabled = leads, enabled
        self.hostname = hostname or socket.gethostname()
        self.recorded = 0  # runs written
        self.dropped = 0  # runs not kept: more were held than HELD_MAX
        self._held: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self._seen = threading.local()  # per job thread: the writer's count after its last run

    def observe(self, run: Run) -> None:
        """One run, as the runner tells of it: held for the next flush (only where this
        replica leads: every job the leader runs is recorded, a follower's are not)."""
        queued_now = self.writer.submitted_here()
        queued = max(queued_now - int(getattr(self._seen, "n", 0)), 0)
        self._seen.n = queued_now
        if not self.enabled() or not self.leads():
            return
        row = self.row(run, queued)
        with self._lock:
            if len(self._held) >= self.HELD_MAX:
                self._held.popleft()
                self.dropped += 1
            self._held.append(row)

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def flush(self) -> int:
        """The held runs written in one statement; how many. On a database error they stay
        held (and the error is raised: the runner counts it)."""
        with self._lock:
            rows, self._held = list(self._held), deque()
        if not rows:
            return 0
        try:
            with self.engine.begin() as conn:
                conn.execute(t.job_execution_history.insert(), rows)
        except Exception:
            with self._lock:
                self._held.extendleft(reversed(rows))
                while len(self._held) > self.HELD_MAX:
                    self._held.popleft()
                    self.dropped += 1
            raise
        self.recorded += len(rows)
        return len(rows)

    def prune(self, now: datetime, days: float) -> None:
        """Runs that began more than days ago removed (a leader's write)."""

        def write(conn: Connection) -> None:
            prune(conn, now, days)

        self.writer.submit(Op("job_execution_history", write))

    def row(self, run: Run, queued: int) -> dict[str, Any]:
        job = run.job
        started = datetime.fromtimestamp(run.started, UTC)
        ended = datetime.fromtimestamp(max(run.ended, run.started), UTC)
        rows = rows_of(run.result, queued)
        return {
            "job_name": job.name,
            "job_type": job_type(job.name),
            "schedule": f"@every {job.interval:g}s",
            "status": "failed" if run.error else "success",
            "started_at": started,
            "ended_at": ended,
            "duration_seconds": round(max(run.duration, 0.0), 6),
            "error_message": run.error,
            "error_stack": run.stack,
            "cluster_name": cluster_of(job.name, self.home),
            "hostname": self.hostname,
            "rows_touched": rows,
            "metadata": {
                "leader_only": job.leader_only,
                "lane": job.lane or job.name,
                "interval_seconds": job.interval,
            },
            "execution_stats": {"rows_touched": rows, "writes_queued": queued},
            "created_at": ended,
        }


def prune(conn: Connection, now: datetime, days: float) -> int:
    """Runs that began more than days ago removed; how many."""
    h = t.job_execution_history
    got = conn.execute(delete(h).where(h.c.started_at < now - timedelta(days=days)))
    return int(got.rowcount or 0)


# -- reading ----------------------------------------------------------------------------------
def run_json(r: Any) -> dict[str, Any]:
    """dbmodel.JobExecutionHistory's fields, and the page's names beside them (duration,
    finished_at, exit_code: what JobExecutionHistory.vue reads)."""
    ended = when(r.ended_at)
    return {
        "id": int(r.id),
        "job_name": r.job_name,
        "job_type": r.job_type,
        "schedule": r.schedule,
        "status": r.status,
        "started_at": when(r.started_at),
        "ended_at": ended,
        "duration_seconds": float(r.duration_seconds),
        "error_message": r.error_message,
        "error_stack": r.error_stack,
        "cluster_name": r.cluster_name,
        "hostname": r.hostname,
        "metadata": r.metadata or {},
        "execution_stats": r.execution_stats or {},
        "created_at": when(r.created_at),
        "rows_touched": int(r.rows_touched),
        "duration": float(r.duration_seconds),
        "finished_at": ended,
        "exit_code": 0 if r.status == "success" else 1,
    }


def listing(
    conn: Connection, filters: dict[str, Any], order_by: str, num: int, size: int
) -> dict[str, Any]:
    """The page's list: {data, total, pageNum, pageSize}; filters: job_name and job_type
    (a part of it), status, cluster_name, hostname (exactly), start_time_from/to,
    min/max_duration."""
    h = t.job_execution_history
    where = []
    for name in ("job_name", "job_type"):
        if filters.get(name):
            where.append(h.c[name].contains(filters[name], autoescape=True))
    for name in ("status", "cluster_name", "hostname"):
        if filters.get(name):
            where.append(h.c[name] == filters[name])
    if filters.get("start_time_from"):
        where.append(h.c.started_at >= filters["start_time_from"])
    if filters.get("start_time_to"):
        where.append(h.c.started_at <= filters["start_time_to"])
    if filters.get("min_duration") is not None:
        where.append(h.c.duration_seconds >= filters["min_duration"])
    if filters.get("max_duration") is not None:
        where.append(h.c.duration_seconds <= filters["max_duration"])
    total = conn.execute(select(func.count()).select_from(h).where(*where)).scalar_one()
    field, _, direction = order_by.strip().partition(" ")
    col = ORDER.get(field or "started_at")
    if col is None or direction.strip().upper() not in ("", "ASC", "DESC"):
        raise BadRequest(
            f"order_by={order_by!r}: a field of {', '.join(ORDER)}, then ASC or " "DESC"
        )
    ordered = col.asc() if direction.strip().upper() == "ASC" else col.desc()
    q = select(h).where(*where).order_by(ordered, h.c.id.desc()).offset((num - 1) * size)
    data = [run_json(r) for r in conn.execute(q.limit(size))]
    return {"data": data, "total": int(total), "pageNum": num, "pageSize": size}


def one(conn: Connection, run_id: int) -> dict[str, Any]:
    h = t.job_execution_history
    r = conn.execute(select(h).where(h.c.id == run_id)).first()
    if r is None:
        raise NotFound(f"history record {run_id} not found")
    return run_json(r)


def recent_failures(conn: Connection, limit: int) -> list[dict[str, Any]]:
    h = t.job_execution_history
    q = (
        select(h)
        .where(h.c.status.in_(("failed", "timeout")))
        .order_by(h.c.started_at.desc(), h.c.id.desc())
        .limit(limit)
    )
    return [run_json(r) for r in conn.execute(q)]


def job_statistics(conn: Connection, name: str) -> dict[str, Any]:
    """database.JobStatistics of the job's runs (its last STATS_RUNS), and the page's
    JobStatistics names beside them (success rate, median, common errors)."""
    h = t.job_execution_history
    q = (
        select(h.c.status, h.c.duration_seconds, h.c.started_at, h.c.error_message)
        .where(h.c.job_name == name)
        .order_by(h.c.started_at.desc())
        .limit(STATS_RUNS)
    )
    runs = list(conn.execute(q))
    counts = Counter(r.status for r in runs)
    durations = [float(r.duration_seconds) for r in runs]
    last = runs[0] if runs else None

    def last_of(*statuses: str) -> str | None:
        return next((when(r.started_at) for r in runs if r.status in statuses), None)

    errors = Counter(r.error_message for r in runs if r.error_message)
    total = len(runs)
    mean = statistics.fmean(durations) if durations else 0.0
    return {
        "job_name": name,
        "total_runs": total,
        "success_count": counts["success"],
        "failure_count": counts["failed"],
        "cancelled_count": counts["cancelled"],
        "timeout_count": counts["timeout"],
        "avg_duration": mean,
        "min_duration": min(durations, default=0.0),
        "max_duration": max(durations, default=0.0),
        "last_run_time": when(last.started_at) if last else None,
        "last_status": last.status if last else "",
        # the page's JobStatistics (services/job-execution-history)
        "total_executions": total,
        "successful_executions": counts["success"],
        "failed_executions": counts["failed"],
        "cancelled_executions": counts["cancelled"],
        "timeout_executions": counts["timeout"],
        "success_rate": round(100.0 * counts["success"] / total, 2) if total else 0.0,
        "average_duration": mean,
        "median_duration": statistics.median(durations) if durations else 0.0,
        "std_duration": statistics.pstdev(durations) if len(durations) > 1 else 0.0,
        "last_execution_at": when(last.started_at) if last else None,
        "last_success_at": last_of("success"),
        "last_failure_at": last_of("failed", "timeout"),
        "common_errors": [{"error_message": e, "count": n} for e, n in errors.most_common(5)],
    }
