"""What a weekly report says, computed from the recorder's own tables and Prometheus: the
same data gives the same report.

GPU-hours allocated: each GPU pod's GPUs times the hours it ran within the period (from
`started_at` to `ended_at`/`deleted_at`, or the period's end). Utilization: the pod's GPUs'
mean `gpu_utilization` per day from Prometheus; GPU-hours used are the allocated hours
times it, idle ones the rest. A pod Prometheus has no samples for counts as allocated and
not in the utilization figures (its utilization is unknown, not 0).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from typing import Any

from sqlalchemy import Connection, func, or_, select

from lens_ebpf.core.times import aware
from lens_ebpf.recorder import prom
from lens_ebpf.recorder.reports.week import zone
from lens_ebpf.recorder.scope import Scope

DAY = timedelta(days=1)
HOUR = 3600.0
TRAINING_KINDS = ("training_slowdown", "training_stalled")
LISTED = 50  # faults, device changes and training events listed (all are counted)


@dataclass(frozen=True)
class Options:
    label_keys: tuple[str, ...] = ()  # workload labels the GPU-hours are split by
    top_n: int = 10  # workloads listed by idle GPU-hours
    low_utilization: float = 30.0  # a workload below this percent counts as low
    timezone: str = "UTC"  # the days of the daily figures


@dataclass
class Hours:
    """GPU-hours allocated, and of those with a known utilization, allocated and used."""

    allocated: float = 0.0
    measured: float = 0.0
    used: float = 0.0

    def add(self, alloc: float, util: float | None) -> None:
        self.allocated += alloc
        if util is not None:
            self.measured += alloc
            self.used += alloc * util / 100

    def view(self) -> dict[str, Any]:
        util = 100 * self.used / self.measured if self.measured else None
        return {
            "gpu_hours": r(self.allocated),
            "used_gpu_hours": r(self.used),
            "idle_gpu_hours": r(self.measured - self.used),
            "utilization": r(util),
        }


def r(v: float | None, digits: int = 2) -> float | None:
    return None if v is None else round(v, digits)


@dataclass
class Pod:
    uid: str
    namespace: str
    name: str
    node: str
    gpus: int
    start: datetime
    end: datetime
    workload: tuple[str, str, str, str]  # uid, kind, namespace, name
    labels: dict[str, str] = field(default_factory=dict)


def pods_in(conn: Connection, c: Scope, start: datetime, end: datetime) -> list[Pod]:
    """The GPU pods that ran within [start, end), each clipped to it."""
    p, w = c.tables.gpu_pods, c.tables.gpu_workloads
    stop = func.coalesce(p.c.ended_at, p.c.deleted_at)
    rows = conn.execute(
        select(
            p.c.uid,
            p.c.namespace,
            p.c.name,
            p.c.node,
            p.c.gpus,
            p.c.started_at,
            p.c.ended_at,
            p.c.deleted_at,
            w.c.uid.label("w_uid"),
            w.c.kind,
            w.c.name.label("w_name"),
            w.c.labels,
        )
        .outerjoin(w, w.c.uid == p.c.workload_uid)
        .where(
            p.c.started_at.is_not(None),
            p.c.started_at < end,
            p.c.gpus > 0,
            or_(stop.is_(None), stop > start),
        )
        .order_by(p.c.namespace, p.c.name, p.c.uid)
    )
    out = []
    for row in rows:
        began = max(_utc(row.started_at), start)
        stopped = min([_utc(x) for x in (row.ended_at, row.deleted_at) if x is not None] + [end])
        if stopped <= began:
            continue
        wl = (
            (row.w_uid, row.kind, row.namespace, row.w_name)
            if row.w_uid
            else (row.uid, "Pod", row.namespace, row.name)
        )
        labels = {str(k): str(v) for k, v in (row.labels or {}).items()}
        out.append(
            Pod(
                row.uid,
                row.namespace,
                row.name,
                row.node,
                int(row.gpus),
                began,
                stopped,
                wl,
                labels,
            )
        )
    return out


def _utc(value: Any) -> datetime:
    got = aware(value)
    assert got is not None
    return got


def days_of(start: datetime, end: datetime, tz: str) -> list[tuple[datetime, datetime]]:
    """The calendar days (in tz) from start to end, each clipped to them, as UTC times."""
    z = zone(tz)
    local = start.astimezone(z)
    day = datetime(local.year, local.month, local.day, tzinfo=z)
    out = []
    while day < end:
        nxt = datetime.combine(day.date() + DAY, time(), z)  # a wall-clock day (DST: 23, 25 h)
        a, b = max(day, start), min(nxt, end)
        if b > a:
            out.append((a.astimezone(UTC), b.astimezone(UTC)))
        day = nxt
    return out


def utilization(
    c: Scope, days: list[tuple[datetime, datetime]], notes: list[str]
) -> list[dict[tuple[str, str], float]]:
    """Per day, each pod's (namespace, pod) mean GPU utilization over its samples of the
    day; empty where Prometheus is not set or cannot answer (said in notes)."""
    out: list[dict[tuple[str, str], float]] = [{} for _ in days]
    if not c.prom.url:
        notes.append("recorder.prometheus.url is not set: utilization is unknown")
        return out
    for i, (a, b) in enumerate(days):
        # the window ends just before the day's end: a sample at the next midnight is its
        window = int((b - a).total_seconds())
        q = f'avg by (namespace, pod) (avg_over_time(gpu_utilization{{pod!=""}}[{window}s]))'
        try:
            got = c.prom.instant(q, b - timedelta(milliseconds=1))
        except prom.PromError as exc:
            notes.append(f"utilization unknown for {a.date()}: {exc}")
            continue
        out[i] = {(m.get("namespace", ""), m.get("pod", "")): v for m, v in got}
    return out


def capacity(conn: Connection, c: Scope, a: datetime, b: datetime) -> float | None:
    """The cluster's GPUs in [a, b): the allocation snapshots' mean allocatable."""
    s = c.tables.allocation_snapshots
    got = conn.execute(
        select(func.avg(s.c.allocatable)).where(s.c.node == "", s.c.at >= a, s.c.at < b)
    ).scalar()
    return None if got is None else float(got)


def nodes_capacity(conn: Connection, c: Scope) -> int:
    n = c.tables.nodes
    return sum(
        int(v)
        for row in conn.execute(select(n.c.gpu_capacity).where(n.c.deleted.is_(False)))
        for v in (row.gpu_capacity or {}).values()
    )


def figures(
    conn: Connection, c: Scope, start: datetime, end: datetime, opts: Options, notes: list[str]
) -> dict[str, Any]:
    """The period's GPU-hours: by day, namespace, label and workload, and the summary."""
    pods = pods_in(conn, c, start, end)
    days = days_of(start, end, opts.timezone)
    util = utilization(c, days, notes)
    total, by_day = Hours(), [Hours() for _ in days]
    by_ns: dict[str, Hours] = defaultdict(Hours)
    by_label: dict[tuple[str, str], Hours] = defaultdict(Hours)
    by_wl: dict[tuple[str, str, str, str], Hours] = defaultdict(Hours)
    wl_gpus: dict[tuple[str, str, str, str], int] = defaultdict(int)
    for pod in pods:
        wl_gpus[pod.workload] = max(wl_gpus[pod.workload], pod.gpus)
        for i, (a, b) in enumerate(days):
            lo, hi = max(a, pod.start), min(b, pod.end)
            if hi <= lo:
                continue
            alloc = pod.gpus * (hi - lo).total_seconds() / HOUR
            u = util[i].get((pod.namespace, pod.name))
            for h in (total, by_day[i], by_ns[pod.namespace], by_wl[pod.workload]):
                h.add(alloc, u)
            for key in opts.label_keys:
                if key in pod.labels:
                    by_label[(key, pod.labels[key])].add(alloc, u)
    fallback = nodes_capacity(conn, c)
    daily, cap_hours, most = [], 0.0, 0.0
    for (a, b), h in zip(days, by_day, strict=True):
        gpus = capacity(conn, c, a, b)
        gpus = float(fallback) if gpus is None else gpus
        hours = gpus * (b - a).total_seconds() / HOUR
        cap_hours, most = cap_hours + hours, max(most, gpus)
        daily.append(
            {
                "date": a.astimezone(zone(opts.timezone)).date().isoformat(),
                "gpus": r(gpus),
                "capacity_gpu_hours": r(hours),
                **h.view(),
                "allocation": r(100 * h.allocated / hours if hours else None),
            }
        )
    workloads = []
    for wk, h in by_wl.items():
        uid, kind, ns, name = wk
        workloads.append(
            {
                "uid": uid,
                "kind": kind,
                "namespace": ns,
                "name": name,
                "gpus": wl_gpus[wk],
                **h.view(),
            }
        )
    known = [w for w in workloads if w["utilization"] is not None]
    idle = sorted(known, key=lambda w: (-w["idle_gpu_hours"], w["namespace"], w["name"]))
    summary = {
        "total_gpus": int(round(most)),
        "capacity_gpu_hours": r(cap_hours),
        "total_gpu_hours": r(total.allocated),
        "used_gpu_hours": r(total.used),
        "idle_gpu_hours": r(total.measured - total.used),
        "avg_allocation": r(100 * total.allocated / cap_hours if cap_hours else None),
        "avg_utilization": total.view()["utilization"],
        "workloads": len(workloads),
        "pods": len(pods),
        "low_util_count": sum(1 for w in known if w["utilization"] < opts.low_utilization),
        "wasted_gpu_days": r((total.measured - total.used) / 24),
    }
    return {
        "summary": summary,
        "daily": daily,
        "namespaces": [
            {"namespace": ns, **h.view()}
            for ns, h in sorted(by_ns.items(), key=lambda kv: (-kv[1].allocated, kv[0]))
        ],
        "labels": [
            {"key": k, "value": v, **h.view()}
            for (k, v), h in sorted(
                by_label.items(), key=lambda kv: (kv[0][0], -kv[1].allocated, kv[0][1])
            )
        ],
        "top_idle_workloads": idle[: opts.top_n],
        "pod_list": pods,
    }


def _running_on(pods: list[Pod], node: str, at: datetime) -> list[Pod]:
    return [p for p in pods if p.node == node and p.start <= at < p.end]


def _names(pods: list[Pod]) -> list[str]:
    return sorted({f"{p.workload[2]}/{p.workload[3]}" for p in pods})


def faults(
    conn: Connection, c: Scope, start: datetime, end: datetime, pods: list[Pod]
) -> dict[str, Any]:
    """The period's GPU faults (node_events gpu_fault), each with the workloads it hit:
    the pod it names, else the GPU pods on its node at the time."""
    e = c.tables.node_events
    cond = [e.c.kind == "gpu_fault", e.c.at >= start, e.c.at < end]
    n = int(conn.execute(select(func.count()).select_from(e).where(*cond)).scalar_one())
    by_uid = {p.uid: p for p in pods}
    items = []
    for row in conn.execute(select(e).where(*cond).order_by(e.c.at, e.c.id).limit(LISTED)):
        at, pay = _utc(row.at), row.payload or {}
        hit = [by_uid[row.pod_uid]] if row.pod_uid in by_uid else _running_on(pods, row.node, at)
        items.append(
            {
                "at": _iso(at),
                "node": row.node,
                "gpu_index": pay.get("gpu_index"),
                "fault": str(pay.get("fault", "")),
                "code": str(pay.get("code", "")),
                "message": str(pay.get("message", ""))[:200],
                "workloads": _names(hit),
            }
        )
    return {"count": n, "items": items}


def device_changes(
    conn: Connection, c: Scope, start: datetime, end: datetime, pods: list[Pod]
) -> dict[str, Any]:
    """The period's device changes (device_changelog), each with the workloads on its node
    at the time."""
    d = c.tables.device_changelog
    cond = [d.c.at >= start, d.c.at < end]
    n = int(conn.execute(select(func.count()).select_from(d).where(*cond)).scalar_one())
    items = []
    for row in conn.execute(select(d).where(*cond).order_by(d.c.at, d.c.id).limit(LISTED)):
        at = _utc(row.at)
        items.append(
            {
                "at": _iso(at),
                "node": row.node,
                "kind": row.kind,
                "slot": row.slot,
                "field": row.field,
                "old_value": row.old_value,
                "new_value": row.new_value,
                "workloads": _names(_running_on(pods, row.node, at)),
            }
        )
    return {"count": n, "items": items}


def training(conn: Connection, c: Scope, start: datetime, end: datetime) -> dict[str, Any]:
    """The period's training slowdowns and stalls (training_events), by kind."""
    t = c.tables.training_events
    cond = [t.c.kind.in_(TRAINING_KINDS), t.c.at >= start, t.c.at < end]
    counts = dict.fromkeys(TRAINING_KINDS, 0)
    for row in conn.execute(
        select(t.c.kind, func.count().label("n")).where(*cond).group_by(t.c.kind)
    ):
        counts[str(row.kind)] = int(row.n)
    items = []
    for row in conn.execute(select(t).where(*cond).order_by(t.c.at, t.c.id).limit(LISTED)):
        items.append(
            {
                "at": _iso(aware(row.at)),
                "kind": row.kind,
                "namespace": row.namespace,
                "workload": row.workload,
                "pod": row.pod,
                "node": row.node,
                "iteration": row.iteration,
                "value": r(row.value),
                "baseline": r(row.baseline),
                "ended_at": _iso(aware(row.ended_at)),
            }
        )
    return {"counts": counts, "items": items}


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.strftime("%Y-%m-%dT%H:%M:%SZ")


COMPARED = (
    "total_gpus",
    "total_gpu_hours",
    "used_gpu_hours",
    "idle_gpu_hours",
    "avg_allocation",
    "avg_utilization",
    "workloads",
    "low_util_count",
)


def weekly(
    conn: Connection,
    c: Scope,
    start: datetime,
    end: datetime,
    before: datetime,
    opts: Options,
    name: str = "",
) -> dict[str, Any]:
    """The report's content for [start, end), compared with [before, start)."""
    notes: list[str] = []
    got = figures(conn, c, start, end, opts, notes)
    pods = got.pop("pod_list")
    prev = figures(conn, c, before, start, opts, [])
    prev.pop("pod_list")
    s, p = got["summary"], prev["summary"]
    change = {
        k: (r(s[k] - p[k]) if s[k] is not None and p[k] is not None else None) for k in COMPARED
    }
    content = {
        "cluster_name": c.name,
        "week": name,
        "period": {"start": _iso(start), "end": _iso(end), "timezone": opts.timezone},
        **got,
        "gpu_faults": faults(conn, c, start, end, pods),
        "device_changes": device_changes(conn, c, start, end, pods),
        "training": training(conn, c, start, end),
        "previous_week": {
            "period": {"start": _iso(before), "end": _iso(start)},
            "summary": p,
        },
        "change": change,
        "notes": notes,
    }
    content["chart_data"] = {
        "cluster_usage_trend": {
            "title": "GPU allocation and utilization by day",
            "x_axis": [d["date"] for d in got["daily"]],
            "series": [
                {
                    "name": "Allocation (%)",
                    "type": "line",
                    "data": [d["allocation"] for d in got["daily"]],
                },
                {
                    "name": "Utilization (%)",
                    "type": "line",
                    "data": [d["utilization"] for d in got["daily"]],
                },
            ],
        }
    }
    content["markdown_report"] = markdown(content)
    return content


def _pct(v: float | None) -> str:
    return "unknown" if v is None else f"{v:.1f}%"


def markdown(c: dict[str, Any]) -> str:
    """A short summary in Markdown (the UI's Report Content tab shows it)."""
    s, ch = c["summary"], c["change"]
    lines = [
        f"# GPU utilization report: {c['cluster_name']}, {c['week']}",
        "",
        f"- GPUs: {s['total_gpus']}",
        f"- GPU-hours allocated: {s['total_gpu_hours']:.1f} "
        f"(change {ch['total_gpu_hours'] or 0:+.1f})",
        f"- GPU-hours used: {s['used_gpu_hours']:.1f}",
        f"- Allocation: {_pct(s['avg_allocation'])}; utilization: " f"{_pct(s['avg_utilization'])}",
        f"- GPU faults: {c['gpu_faults']['count']}; device changes: "
        f"{c['device_changes']['count']}",
        "",
    ]
    if c["top_idle_workloads"]:
        lines += [
            "## Most idle GPU-hours",
            "",
            "| workload | GPU-hours | idle | utilization |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {w['namespace']}/{w['name']} | {w['gpu_hours']:.1f} | "
            f"{w['idle_gpu_hours']:.1f} | {_pct(w['utilization'])} |"
            for w in c["top_idle_workloads"]
        ]
    return "\n".join(lines) + "\n"


def metadata(content: dict[str, Any]) -> dict[str, Any]:
    """The list's summary figures (the original's metadata keys)."""
    s = content["summary"]
    keys = (
        "avg_utilization",
        "avg_allocation",
        "total_gpus",
        "low_util_count",
        "wasted_gpu_days",
        "total_gpu_hours",
    )
    return {
        "cluster_name": content["cluster_name"],
        "week": content["week"],
        **{k: s[k] for k in keys},
    }
