"""Reading the recorder's database: the REST API's pages and the --report table."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, and_, or_, select

from lens_ebpf.core.times import aware, utc
from lens_ebpf.recorder.errors import BadRequest
from lens_ebpf.recorder.inputs import unix_time
from lens_ebpf.recorder.lifecycle import parse_time
from lens_ebpf.recorder.store.schema import scoped


class QueryError(BadRequest):
    """A request the API cannot answer as asked (400, worded for the client)."""


def json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return utc(value).isoformat().replace("+00:00", "Z")
    return value


def row_dict(row: Any) -> dict[str, Any]:
    return {k: json_value(v) for k, v in dict(row).items()}


def parse_since(text: str, now: datetime) -> datetime:
    """An RFC 3339 time, Unix seconds, or an age: 90s, 30m, 12h, 7d."""
    text = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    age = text[:-1]
    if age.isascii() and age.isdigit() and text[-1:] in units:
        try:
            if len(age) > 12:  # (int() of thousands of digits is slow)
                raise OverflowError
            return now - timedelta(seconds=int(age) * units[text[-1]])
        except OverflowError:
            raise QueryError(f"since={text[:40]!r}: further back than a time goes") from None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return unix_time(seconds, "since", text)  # (nan, inf, 1e308: numbers, but no time)
    out = parse_time(text)
    if out is None:
        raise QueryError(f"since={text!r}: expected RFC 3339, Unix seconds, or 30m/12h/7d")
    return out


@dataclass(frozen=True)
class Page:
    limit: int
    after: tuple[datetime, str] | None = None  # the last (created_at, uid) already served


def page_of(query: dict[str, str], page_max: int) -> Page:
    """limit (1..page_max, default 100 or page_max if less) and the continue token of the
    previous page."""
    try:
        limit = int(query.get("limit") or min(100, page_max))
    except ValueError:
        raise QueryError(f"limit={query.get('limit')!r}: not a number") from None
    if not 1 <= limit <= page_max:
        raise QueryError(f"limit={limit}: must be from 1 to {page_max}")
    token = query.get("continue") or ""
    if not token:
        return Page(limit)
    try:
        created, uid = json.loads(base64.urlsafe_b64decode(token.encode()))["after"]
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise QueryError("continue: not a token this API gave") from None
    when = parse_time(created)
    if when is None:
        raise QueryError("continue: not a token this API gave")
    return Page(limit, (when, str(uid)))


def _paged(conn: Connection, stmt: Select[Any], table: Any, page: Page) -> dict[str, Any]:
    """One page in (created_at, uid) order, after the previous page's last row: rows added
    meanwhile neither shift a page nor come twice."""
    created, uid = table.c.created_at, table.c.uid
    if page.after is not None:
        when, last = page.after
        stmt = stmt.where(or_(created > when, and_(created == when, uid > last)))
    stmt = stmt.order_by(created, uid).limit(page.limit + 1)
    rows = conn.execute(stmt).mappings().all()
    out: dict[str, Any] = {"items": [row_dict(r) for r in rows[: page.limit]]}
    if len(rows) > page.limit:
        tail = rows[page.limit - 1]
        after = [utc(tail["created_at"]).isoformat(), tail["uid"]]
        out["continue"] = base64.urlsafe_b64encode(json.dumps({"after": after}).encode()).decode()
    return out


def workloads(
    conn: Connection, query: dict[str, str], page: Page, cluster: str = "local"
) -> dict[str, Any]:
    """A cluster's workloads, oldest first; filters: namespace, kind, running (true/false),
    top (true: only workloads without a parent)."""
    wl = scoped(cluster).gpu_workloads
    stmt = select(wl)
    if query.get("namespace"):
        stmt = stmt.where(wl.c.namespace == query["namespace"])
    if query.get("kind"):
        stmt = stmt.where(wl.c.kind == query["kind"])
    for key, col in (("running", wl.c.running), ("deleted", wl.c.deleted)):
        if key in query:
            if query[key] not in ("true", "false"):
                raise QueryError(f"{key}={query[key]!r}: expected true or false")
            stmt = stmt.where(col.is_(query[key] == "true"))
    if query.get("top") == "true":
        stmt = stmt.where(wl.c.parent_uid.is_(None))
    return _paged(conn, stmt, wl, page)


def workload(conn: Connection, uid: str, cluster: str = "local") -> dict[str, Any] | None:
    """One workload with its children, its pods (with their GPUs) and their events."""
    t = scoped(cluster)
    wl, refs, pods = t.gpu_workloads, t.workload_pod_references, t.gpu_pods
    row = conn.execute(select(wl).where(wl.c.uid == uid)).mappings().first()
    if row is None:
        return None
    out = row_dict(row)
    out["children"] = [
        row_dict(r)
        for r in conn.execute(
            select(wl).where(wl.c.parent_uid == uid).order_by(wl.c.created_at, wl.c.uid)
        ).mappings()
    ]
    pod_rows = conn.execute(
        select(pods)
        .join(refs, refs.c.pod_uid == pods.c.uid)
        .where(refs.c.workload_uid == uid)
        .order_by(pods.c.created_at, pods.c.uid)
    ).mappings()
    out["pods"] = [{**row_dict(p), "resources": [], "events": []} for p in pod_rows]
    by_uid = {p["uid"]: p for p in out["pods"]}
    # each pod's GPUs and events: one query for all of them, not two per pod
    res, ev = t.pod_resources, t.gpu_pods_events
    for r in conn.execute(
        select(
            res.c.pod_uid,
            res.c.container,
            res.c.source,
            res.c.resource,
            res.c.count,
            res.c.model,
            res.c.devices,
        )
        .where(res.c.pod_uid.in_(by_uid))
        .order_by(res.c.container, res.c.source)
    ).mappings():
        by_uid[r["pod_uid"]]["resources"].append(_without_pod(r))
    for r in conn.execute(
        select(ev.c.pod_uid, ev.c.at, ev.c.type, ev.c.subject, ev.c.old_value, ev.c.new_value)
        .where(ev.c.pod_uid.in_(by_uid))
        .order_by(ev.c.id)
    ).mappings():
        by_uid[r["pod_uid"]]["events"].append(_without_pod(r))
    return out


def _without_pod(row: Any) -> dict[str, Any]:
    """A pod's resource or event row, without the pod uid it is listed under."""
    return {k: v for k, v in row_dict(row).items() if k != "pod_uid"}


def pods(
    conn: Connection, query: dict[str, str], page: Page, now: datetime, cluster: str = "local"
) -> dict[str, Any]:
    """A cluster's GPU pods, oldest first: on node= (optional), alive at any time since
    since=."""
    p = scoped(cluster).gpu_pods
    stmt = select(p)
    if query.get("node"):
        stmt = stmt.where(p.c.node == query["node"])
    if query.get("since"):
        since = parse_since(query["since"], now)
        stmt = stmt.where(or_(p.c.ended_at.is_(None), p.c.ended_at >= since))
    if query.get("namespace"):
        stmt = stmt.where(p.c.namespace == query["namespace"])
    return _paged(conn, stmt, p, page)


@dataclass
class ReportLine:
    kind: str
    namespace: str
    name: str
    status: str
    gpus: int
    pods: int
    created: datetime | None
    ended: datetime | None
    gpu_seconds: float


def report(
    conn: Connection, since: datetime, now: datetime, node: str = "", cluster: str = "local"
) -> list[ReportLine]:
    """A cluster's top-level workloads whose GPU pods ran since `since` (on node, when
    given), with the GPU time their pods held: GPUs x (end or now - start), counted from
    since."""
    t = scoped(cluster)
    wl, refs, p = t.gpu_workloads, t.workload_pod_references, t.gpu_pods
    cond = and_(p.c.started_at.is_not(None), or_(p.c.ended_at.is_(None), p.c.ended_at >= since))
    if node:
        cond = and_(cond, p.c.node == node)
    rows = (
        conn.execute(
            select(
                wl, p.c.gpus, p.c.started_at.label("pod_started"), p.c.ended_at.label("pod_ended")
            )
            .join(refs, refs.c.workload_uid == wl.c.uid)
            .join(p, p.c.uid == refs.c.pod_uid)
            .where(and_(cond, wl.c.parent_uid.is_(None)))
            .order_by(wl.c.created_at, wl.c.uid)
        )
        .mappings()
        .all()
    )
    lines: dict[str, ReportLine] = {}
    for r in rows:
        line = lines.get(r["uid"])
        if line is None:
            line = lines[r["uid"]] = ReportLine(
                r["kind"],
                r["namespace"],
                r["name"],
                r["status"] + ("/deleted" if r["deleted"] else ""),
                r["gpu_request"],
                0,
                aware(r["created_at"]),
                aware(r["ended_at"]),
                0.0,
            )
        start = max(aware(r["pod_started"]) or since, since)
        end = aware(r["pod_ended"]) or now
        line.pods += 1
        line.gpu_seconds += max(0.0, (end - start).total_seconds()) * r["gpus"]
    return list(lines.values())


def format_report(lines: list[ReportLine]) -> str:
    """The report for people: one workload a line, 80 columns."""

    def when(d: datetime | None) -> str:
        return d.strftime("%m-%d %H:%M") if d else "-"

    out = [
        f"{'WORKLOAD':<29} {'STATUS':<9} {'GPUS':>4} {'PODS':>4} {'CREATED':<11} "
        f"{'ENDED':<11} {'GPU-H':>6}"
    ]
    for x in lines:
        name = f"{x.kind}/{x.namespace}/{x.name}"
        name = name if len(name) <= 29 else name[:28] + "…"
        hours = x.gpu_seconds / 3600
        out.append(
            f"{name:<29} {x.status[:9]:<9} {x.gpus:>4} {x.pods:>4} "
            f"{when(x.created):<11} {when(x.ended):<11} {hours:>6.2f}"
        )
    return "\n".join(out)
