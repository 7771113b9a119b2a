"""GPU accounting's reads: the hourly statistics, allocation snapshots and workload
figures the Statistics pages ask for, as the original's routes answer them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import JSON, Connection, Text, cast, func, select

from lens_ebpf.core.times import utc
from lens_ebpf.recorder import prom
from lens_ebpf.recorder.errors import BadRequest, NotFound
from lens_ebpf.recorder.scope import Scope
from lens_ebpf.recorder.store.schema import Scoped
from lens_ebpf.recorder.workloads import statuses

LOW_UTILIZATION = 30.0  # percent: a workload below it counts as low (the original's bound)
PAGE_ALL = 10_000  # the original answers every hourly-stats page at this size


def rfc3339(value: Any) -> str:
    """A time as Go's encoding/json writes a UTC time.Time."""
    return utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


TIMES = frozenset(("stat_hour", "created_at", "updated_at", "snapshot_time"))


def _time_text(value: Any) -> str:
    """A stored time, read as text (SQLite's "2026-11-16 10:00:00.000000", PostgreSQL's
    "2026-11-16 11:00:00+01" in its session's TimeZone), as rfc3339() writes it."""
    return rfc3339(datetime.fromisoformat(value) if isinstance(value, str) else value)


def _wide(table: Any, names: Sequence[str]) -> list[Any]:
    """The columns to select for _rows: times and JSON values as text, not through
    SQLAlchemy's and the driver's per-value processing (a regular expression or a datetime
    per time, the json module per value: most of a 10,000-row page's time)."""
    out = []
    for name in names:
        col = table.c[name]
        raw = isinstance(col.type, JSON) or name in TIMES
        out.append(cast(col, Text).label(name) if raw else col)
    return out


def _rows(rows: Iterable[Any], columns: Sequence[str], table: Any = None) -> list[dict[str, Any]]:
    """Rows (their values in the order of columns, selected by _wide(table, columns) when
    table is given) as dicts, keys in that order, times in RFC 3339 (each distinct time
    formatted once: a page of 10,000 rows holds a few dozen), JSON text wrapped as it is,
    a figure stored unknown (utilization of an hour without samples) 0, the original's
    float64, and how many rows had one said in meta.message (prom.missed).
    About 1.4 us a row of 27 columns: a 10,000-row page's Python time is mostly here."""
    names = [str(n) for n in columns]
    times = [i for i, n in enumerate(names) if n in TIMES]
    js = (
        []
        if table is None
        else [i for i, n in enumerate(names) if isinstance(table.c[n].type, JSON)]
    )
    figures = (
        []
        if table is None
        else [
            i for i, n in enumerate(names) if table.c[n].nullable and i not in js and n not in TIMES
        ]
    )
    unknown = 0
    fmt = _time_text if table is not None else rfc3339
    memo: dict[Any, str] = {}
    text, fragment = str, orjson.Fragment
    out = []
    for r in rows:
        v = list(r)
        if figures and None in v:
            unknown += 1
            for i in figures:
                if v[i] is None:
                    v[i] = 0.0
        for i in times:
            t = v[i]
            got = memo.get(t)
            if got is None:
                got = memo[t] = fmt(t)
            v[i] = got
        for i in js:  # read as text (_wide): answered as it is
            if type(v[i]) is text:
                v[i] = fragment(v[i])
        out.append(dict(zip(names, v)))  # noqa: B905 (as long by construction)
    if unknown:
        prom.missed(
            f"{unknown} of these hours' rows have no GPU samples (Prometheus had "
            "none, or could not answer when the hour was written): their "
            "utilization and memory are 0"
        )
    return out


def _page(
    conn: Connection,
    table: Any,
    cond: list[Any],
    order: Any,
    descending: bool,
    num: int,
    size: int = PAGE_ALL,
) -> dict[str, Any]:
    """PaginatedResponse of the table's rows (every column), ordered by order then id
    (both the same way: a descending page reads the time index backwards, no sort)."""
    counting = _counter().submit(_count, conn.engine, table, cond)
    names = sorted(c.name for c in table.c)  # each row's keys in name order
    rows = conn.execute(
        select(*_wide(table, names))
        .where(*cond)
        .order_by(*(c.desc() if descending else c.asc() for c in (order, table.c.id)))
        .offset((num - 1) * size)
        .limit(size)
    ).all()
    data = _rows(rows, names, table)
    total = counting.result()
    return {
        "data": data,
        "total": total,
        "page": num,
        "page_size": size,
        "total_pages": -(-total // size),
    }


_COUNTER: list[ThreadPoolExecutor] = []


def _counter() -> ThreadPoolExecutor:
    """The threads that count a page's rows while the page is read and built (the count of
    a week's 231,612 workload rows is 15-25 ms of the database's time)."""
    if not _COUNTER:
        _COUNTER.append(ThreadPoolExecutor(4, thread_name_prefix="page-count"))
    return _COUNTER[0]


def _count(engine: Any, table: Any, cond: list[Any]) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table).where(*cond)).scalar_one())


ORDERS = {
    "time": "stat_hour",
    "utilization": "avg_utilization",
    "allocated_gpu_count": "allocated_gpu_count",
}


def cluster_stats(
    conn: Connection,
    t: Scoped,
    start: datetime,
    end: datetime,
    num: int,
    size: int,
    order: str,
    descending: bool,
) -> dict[str, Any]:
    """PaginatedResponse of dbmodel.ClusterGpuHourlyStats: the hours from start to end, by
    hour or mean utilization, page_size a page (this one route honours it, as the
    original does)."""
    hs = t.cluster_gpu_hourly_stats
    cond = [hs.c.stat_hour >= start, hs.c.stat_hour <= end]
    return _page(conn, hs, cond, hs.c[ORDERS[order]], descending, num, size)


def namespace_stats(
    conn: Connection,
    t: Scoped,
    namespace: str | None,
    start: datetime,
    end: datetime,
    num: int,
    order: str,
    descending: bool,
) -> dict[str, Any]:
    """PaginatedResponse of dbmodel.NamespaceGpuHourlyStats."""
    hs = t.namespace_gpu_hourly_stats
    cond = [hs.c.stat_hour >= start, hs.c.stat_hour <= end]
    if namespace:
        cond.append(hs.c.namespace == namespace)
    return _page(conn, hs, cond, hs.c[ORDERS[order]], descending, num)


def label_stats(
    conn: Connection,
    t: Scoped,
    dimension: str,
    key: str,
    value: str | None,
    start: datetime,
    end: datetime,
    num: int,
    order: str,
    descending: bool,
) -> dict[str, Any]:
    """PaginatedResponse of dbmodel.LabelGpuHourlyStats."""
    hs = t.label_gpu_hourly_stats
    cond = [
        hs.c.dimension_type == dimension,
        hs.c.dimension_key == key,
        hs.c.stat_hour >= start,
        hs.c.stat_hour <= end,
    ]
    if value:
        cond.append(hs.c.dimension_value == value)
    return _page(conn, hs, cond, hs.c[ORDERS[order]], descending, num)


def workload_stats(
    conn: Connection,
    t: Scoped,
    namespace: str | None,
    name: str | None,
    kind: str | None,
    start: datetime,
    end: datetime,
    num: int,
    order: str,
    descending: bool,
) -> dict[str, Any]:
    """PaginatedResponse of dbmodel.WorkloadGpuHourlyStats."""
    hs = t.workload_gpu_hourly_stats
    cond = [hs.c.stat_hour >= start, hs.c.stat_hour <= end]
    for col, want in (("namespace", namespace), ("workload_name", name), ("workload_type", kind)):
        if want:
            cond.append(hs.c[col] == want)
    return _page(conn, hs, cond, hs.c[ORDERS[order]], descending, num)


def namespaces(conn: Connection, t: Scoped, start: datetime, end: datetime) -> list[str]:
    """The namespaces with hourly statistics between start and end."""
    hs = t.namespace_gpu_hourly_stats
    return [
        str(r[0])
        for r in conn.execute(
            select(hs.c.namespace)
            .distinct()
            .where(hs.c.stat_hour >= start, hs.c.stat_hour <= end)
            .order_by(hs.c.namespace)
        )
    ]


def dimension_keys(
    conn: Connection, t: Scoped, dimension: str, start: datetime, end: datetime
) -> list[str]:
    """The label (or annotation) keys with hourly statistics between start and end."""
    hs = t.label_gpu_hourly_stats
    return [
        str(r[0])
        for r in conn.execute(
            select(hs.c.dimension_key)
            .distinct()
            .where(hs.c.dimension_type == dimension, hs.c.stat_hour >= start, hs.c.stat_hour <= end)
            .order_by(hs.c.dimension_key)
        )
    ]


def dimension_values(
    conn: Connection, t: Scoped, dimension: str, key: str, start: datetime, end: datetime
) -> list[str]:
    """A key's values with hourly statistics between start and end."""
    hs = t.label_gpu_hourly_stats
    return [
        str(r[0])
        for r in conn.execute(
            select(hs.c.dimension_value)
            .distinct()
            .where(
                hs.c.dimension_type == dimension,
                hs.c.dimension_key == key,
                hs.c.stat_hour >= start,
                hs.c.stat_hour <= end,
            )
            .order_by(hs.c.dimension_value)
        )
    ]


SNAPSHOT_COLUMNS = (
    "id",
    "cluster_name",
    "snapshot_time",
    "dimension_type",
    "dimension_key",
    "dimension_value",
    "total_gpu_capacity",
    "allocated_gpu_count",
    "allocation_details",
    "created_at",
)
SNAPSHOTS_MAX = 10_000


def latest_snapshot(conn: Connection, t: Scoped) -> dict[str, Any]:
    """dbmodel.GpuAllocationSnapshots: the cluster's newest (NotFound before the first)."""
    s = t.gpu_allocation_snapshots
    cols = [s.c[n] for n in SNAPSHOT_COLUMNS]
    newest = (
        select(*cols)
        .where(s.c.dimension_type == "cluster")
        .order_by(s.c.snapshot_time.desc(), s.c.id.desc())
        .limit(1)
    )
    r = conn.execute(newest).first()
    if r is None:
        raise NotFound("no allocation snapshot yet")
    return _rows([r], SNAPSHOT_COLUMNS)[0]


def snapshots(
    conn: Connection, t: Scoped, start: datetime | None, end: datetime | None
) -> list[dict[str, Any]]:
    """[]dbmodel.GpuAllocationSnapshots: the cluster's between start and end, newest first
    (more than SNAPSHOTS_MAX refused)."""
    s = t.gpu_allocation_snapshots
    cond = [s.c.dimension_type == "cluster"]
    if start is not None:
        cond.append(s.c.snapshot_time >= start)
    if end is not None:
        cond.append(s.c.snapshot_time <= end)
    n = int(conn.execute(select(func.count()).select_from(s).where(*cond)).scalar_one())
    if n > SNAPSHOTS_MAX:
        raise BadRequest(f"start_time, end_time: {n} snapshots; at most {SNAPSHOTS_MAX}")
    rows = conn.execute(
        select(*(s.c[n] for n in SNAPSHOT_COLUMNS))
        .where(*cond)
        .order_by(s.c.snapshot_time.desc(), s.c.id)
    )
    return _rows(rows, SNAPSHOT_COLUMNS)


def workload_statistic(conn: Connection, c: Scope, now: datetime) -> dict[str, Any]:
    """model.WorkloadStatisticResp: running top workloads, their mean GPUs requested, their
    mean GPU utilization over the last hour and how many of them stay under
    LOW_UTILIZATION (both from Prometheus: 0 where it cannot answer)."""
    t = c.tables
    w, p = t.gpu_workloads, t.gpu_pods
    tops = list(
        conn.execute(
            select(w).where(w.c.parent_uid.is_(None), w.c.running.is_(True), w.c.deleted.is_(False))
        )
    )
    state = statuses(conn, t, tops)  # running as every route says it
    running = [r for r in tops if state[str(r.uid)] == "Running"]
    out: dict[str, Any] = {
        "running_workloads_count": len(running),
        "avg_gpu_allocated": 0.0,
        "avg_gpu_utilization": 0.0,
        "low_utilization_workloads_count": 0,
    }
    if not running:
        return out
    out["avg_gpu_allocated"] = sum(int(r.gpu_request) for r in running) / len(running)
    got = c.prom.maybe_instant(prom.POD_UTILIZATION_HOUR, now)
    if got is None:  # the counts still draw; its figures 0, said in meta.message
        return out
    by_pod = {(m.get("namespace", ""), m.get("pod", "")): v for m, v in got}
    pods: dict[str, list[float]] = {}
    for r in conn.execute(
        select(p.c.workload_uid, p.c.namespace, p.c.name).where(
            p.c.running.is_(True), p.c.deleted.is_(False)
        )
    ):
        v = by_pod.get((str(r.namespace), str(r.name)))
        if v is not None and r.workload_uid:
            pods.setdefault(str(r.workload_uid), []).append(v)
    held = {str(r.uid) for r in running}
    means = [sum(v) / len(v) for uid, v in pods.items() if uid in held]
    if means:
        out["avg_gpu_utilization"] = sum(means) / len(means)
        out["low_utilization_workloads_count"] = sum(1 for m in means if m < LOW_UTILIZATION)
    return out


def utilization_history(
    conn: Connection,
    c: Scope,
    kind: str,
    name: str,
    namespace: str | None,
    start: int,
    end: int,
    step: int,
) -> dict[str, Any]:
    """model.MetricsGraph of a workload (by kind and name): its pods' mean GPU utilization."""
    w, p = c.tables.gpu_workloads, c.tables.gpu_pods
    cond = [w.c.kind == kind, w.c.name == name]
    if namespace:
        cond.append(w.c.namespace == namespace)
    row = conn.execute(select(w).where(*cond).order_by(w.c.created_at.desc())).first()
    if row is None:
        raise NotFound(f"workload {kind}/{name} not found")
    names = sorted(
        {str(r.name) for r in conn.execute(select(p.c.name).where(p.c.workload_uid == row.uid))}
    )
    series = (
        c.prom.graph(prom.workload_utilization(str(row.namespace), names), start, end, step)
        if names
        else []
    )
    return {"serial": 1, "series": series, "config": {"y_axis_unit": "%"}}
