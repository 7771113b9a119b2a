"""The Job Execution History page's routes (job-execution-histories): every run of every
recorder job the leader ran, in dbmodel.JobExecutionHistory's shape."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder import inputs
from lens_ebpf.recorder.api.envelope import Ask, bad, integer, param, when
from lens_ebpf.recorder.management import job_history

routes = RouteTable()
PAGE_MAX = 100  # the original's largest page
ID = Param("id", "integer", "the run's id")


def _number(ask: Ask, name: str) -> float | None:
    raw = param(ask.query, name)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise bad(f"{name}={raw!r}: a number of seconds") from None


@routes.get(
    "job-execution-histories",
    Param("job_name", doc="a part of the job's name"),
    Param("job_type", doc="a part of the job's kind (its name without its cluster)"),
    Param("status", choices=job_history.STATUSES),
    Param("cluster_name", doc="the cluster the job ran for"),
    Param("hostname", doc="the replica that ran it"),
    Param("start_time_from", "date-time", "runs that began at or after"),
    Param("start_time_to", "date-time", "runs that began at or before"),
    Param("min_duration", "number", "seconds, at least"),
    Param("max_duration", "number", "seconds, at most"),
    Param(
        "page_num",
        "integer",
        "the page, from 1",
        default=1,
        minimum=1,
        maximum=inputs.INT_MAX // PAGE_MAX,
    ),
    Param("page_size", "integer", "runs a page", default=20, minimum=1, maximum=PAGE_MAX),
    Param("order_by", doc="a field and ASC or DESC", default="started_at DESC"),
)
def histories(ask: Ask) -> Any:
    """?job_name, job_type (a part of them), status, cluster_name, hostname,
    start_time_from, start_time_to (RFC 3339), min_duration, max_duration (seconds),
    page_num, page_size (at most 100), order_by (started_at DESC): {data, total, pageNum,
    pageSize}."""
    q = ask.query
    num, size = integer(q, "page_num", 1), integer(q, "page_size", 20)
    if not 1 <= num <= inputs.INT_MAX // PAGE_MAX or not 1 <= size <= PAGE_MAX:
        raise bad(
            f"page_num={num}, page_size={size}: page_num 1 or more, page_size from 1 "
            f"to {PAGE_MAX}"
        )
    status = param(q, "status") or ""
    if status and status not in job_history.STATUSES:
        raise bad(f"status={status!r}: one of {', '.join(job_history.STATUSES)}")
    names = ("job_name", "job_type", "cluster_name", "hostname")
    filters: dict[str, Any] = {name: param(q, name) or "" for name in names}
    filters |= {
        "status": status,
        "start_time_from": when(q, "start_time_from"),
        "start_time_to": when(q, "start_time_to"),
        "min_duration": _number(ask, "min_duration"),
        "max_duration": _number(ask, "max_duration"),
    }
    order = param(q, "order_by") or "started_at DESC"
    return job_history.listing(ask.conn, filters, order, num, size)


@routes.get(
    "job-execution-histories/recent-failures",
    Param("limit", "integer", "runs", default=10, minimum=1, maximum=PAGE_MAX),
)
def recent_failures(ask: Ask) -> Any:
    """?limit (10, at most 100): the latest failed runs, newest first."""
    limit = integer(ask.query, "limit", 10)
    if not 1 <= limit <= PAGE_MAX:
        raise bad(f"limit={limit}: from 1 to {PAGE_MAX}")
    return job_history.recent_failures(ask.conn, limit)


@routes.get("job-execution-histories/statistics/{job_name}")
def statistics(ask: Ask) -> Any:
    """One job's runs counted by outcome, their durations, its last run and common errors."""
    return job_history.job_statistics(ask.conn, ask.arg("job_name"))


@routes.get("job-execution-histories/statistics/{job_type}/{cluster}")
def cluster_statistics(ask: Ask) -> Any:
    """The same of a job run for one cluster (storage_scan/<cluster>: its name holds a /,
    the page's encodeURIComponent sends it as %2F)."""
    return job_history.job_statistics(ask.conn, f"{ask.arg('job_type')}/{ask.arg('cluster')}")


@routes.get("job-execution-histories/{id}", ID)
def history(ask: Ask) -> Any:
    """One run of a recorder job: when, how it ended, its error, the rows it touched."""
    raw = ask.arg("id")
    if not raw.isdigit():
        raise bad("invalid history ID")
    return job_history.one(ask.conn, inputs.whole(raw, "id"))
