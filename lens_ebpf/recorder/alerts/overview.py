"""The Alert overview page's figures: the firing alerts by severity (and how many of them
began within the last hour), the trend by hour or day, the alerts that fire most, and
the firing ones by cluster; and the events list."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, case, func, or_, select

from lens_ebpf.core.times import aware
from lens_ebpf.recorder.alerts.model import SEVERITIES, alert_json
from lens_ebpf.recorder.errors import NotFound
from lens_ebpf.recorder.store import schema as t


def _cluster(cond: list[Any], cluster: str) -> list[Any]:
    return cond + ([t.alert_events.c.cluster_name == cluster] if cluster else [])


def summary(conn: Connection, cluster: str, now: datetime) -> dict[str, Any]:
    """{severity: {count: firing now, change: of them, begun within the last hour}}."""
    ae = t.alert_events
    out = {s: {"count": 0, "change": 0} for s in SEVERITIES}
    recent = func.sum(case((ae.c.starts_at >= now - timedelta(hours=1), 1), else_=0))
    rows: Any = conn.execute(
        select(ae.c.severity, func.count(), recent)
        .where(*_cluster([ae.c.status == "firing"], cluster))
        .group_by(ae.c.severity)
    )
    for sev, n, new in rows:
        if sev in out:
            out[sev] = {"count": int(n), "change": int(new or 0)}
    return out


def trend(
    conn: Connection, cluster: str, now: datetime, hours: int, by_day: bool
) -> list[dict[str, Any]]:
    """Alerts begun in the last `hours`, counted by severity per hour (or day), UTC-aligned,
    oldest first, empty buckets included."""
    ae = t.alert_events
    step = timedelta(days=1) if by_day else timedelta(hours=1)
    start = now - timedelta(hours=hours)
    first = start.replace(minute=0, second=0, microsecond=0)
    if by_day:
        first = first.replace(hour=0)
    buckets: dict[datetime, dict[str, int]] = {}
    at = first
    while at < now:
        buckets[at] = dict.fromkeys(SEVERITIES, 0)
        at += step
    rows: Any = conn.execute(
        select(ae.c.severity, ae.c.starts_at).where(*_cluster([ae.c.starts_at >= start], cluster))
    )
    for sev, starts in rows:
        s = aware(starts)
        assert s is not None
        key = s.replace(minute=0, second=0, microsecond=0)
        if by_day:
            key = key.replace(hour=0)
        if key in buckets and sev in buckets[key]:
            buckets[key][sev] += 1
    return [
        {"timestamp": k.strftime("%Y-%m-%dT%H:%M:%SZ"), **v} for k, v in sorted(buckets.items())
    ]


def top_sources(
    conn: Connection, cluster: str, now: datetime, hours: int, limit: int
) -> list[dict[str, Any]]:
    ae = t.alert_events
    n = func.count().label("n")
    rows: Any = conn.execute(
        select(ae.c.alert_name, n)
        .where(*_cluster([ae.c.starts_at >= now - timedelta(hours=hours)], cluster))
        .group_by(ae.c.alert_name)
        .order_by(n.desc(), ae.c.alert_name)
        .limit(limit)
    )
    return [{"alert_name": name, "count": int(c)} for name, c in rows]


def by_cluster(
    conn: Connection, now: datetime, hours: int, clusters: list[str]
) -> list[dict[str, Any]]:
    """Firing alerts begun in the last `hours` per cluster (every cluster followed, 0 too)."""
    ae = t.alert_events
    got = dict.fromkeys(clusters, 0)
    rows: Any = conn.execute(
        select(ae.c.cluster_name, func.count())
        .where(ae.c.status == "firing", ae.c.starts_at >= now - timedelta(hours=hours))
        .group_by(ae.c.cluster_name)
    )
    for name, c in rows:
        got[name or "unknown"] = got.get(name or "unknown", 0) + int(c)
    return [
        {"cluster_name": k, "count": v}
        for k, v in sorted(got.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


def events(conn: Connection, filters: dict[str, Any], offset: int, limit: int) -> dict[str, Any]:
    """GET alerts: the alerts that match, newest first, a page; `alerts` as the pages read
    it and `data` as the original names it."""
    ae = t.alert_events
    cond: list[Any] = []
    for key in (
        "source",
        "severity",
        "status",
        "workload_id",
        "pod_name",
        "node_name",
        "cluster_name",
    ):
        if filters.get(key):
            cond.append(ae.c[key] == filters[key])
    if filters.get("alert_name"):  # the search box: the name, workload, pod or node
        like = f"%{filters['alert_name'].lower()}%"
        cond.append(
            or_(
                *(
                    func.lower(ae.c[k]).like(like)
                    for k in ("alert_name", "workload_name", "pod_name", "node_name")
                )
            )
        )
    if filters.get("starts_after") is not None:
        cond.append(ae.c.starts_at >= filters["starts_after"])
    if filters.get("starts_before") is not None:
        cond.append(ae.c.starts_at < filters["starts_before"])
    total = int(conn.execute(select(func.count()).select_from(ae).where(*cond)).scalar_one())
    rows = conn.execute(
        select(ae).where(*cond).order_by(ae.c.starts_at.desc(), ae.c.id).offset(offset).limit(limit)
    )
    items = [alert_json(r, ae) for r in rows]
    return {"alerts": items, "data": items, "total": total, "offset": offset, "limit": limit}


def one(conn: Connection, alert_id: str) -> dict[str, Any]:
    ae = t.alert_events
    row = conn.execute(select(ae).where(ae.c.id == alert_id)).first()
    if row is None:
        raise NotFound(f"alert not found: {alert_id!r}")
    return alert_json(row, ae)
