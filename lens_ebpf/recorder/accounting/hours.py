"""GPU accounting's hours: what running pods hold per namespace, label or annotation value
and workload (allocation snapshots), and each completed hour's statistics from those
snapshots or, for hours without any, from the pods' recorded lifetimes, their utilization
from Prometheus (None while it cannot answer)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, select

from lens_ebpf.core.times import aware, utc
from lens_ebpf.recorder import prom
from lens_ebpf.recorder.nodes.allocation import cluster_allocation
from lens_ebpf.recorder.scope import Scope
from lens_ebpf.recorder.store.schema import Scoped
from lens_ebpf.recorder.workloads import statuses

HOUR = timedelta(hours=1)
STEP = 60  # seconds between the utilization samples of an hour
OTHER = "__other__"  # the values of a key beyond max_values, counted as one
DIMENSIONS = ("label", "annotation")
GIB = float(1 << 30)


@dataclass(frozen=True)
class Keys:
    """The label and annotation keys grouped by, and the values kept per key."""

    labels: tuple[str, ...] = ()
    annotations: tuple[str, ...] = ()
    max_values: int = 50

    def of(self, dimension: str) -> tuple[str, ...]:
        return self.labels if dimension == "label" else self.annotations


@dataclass
class WorkloadHour:
    """One top workload over one hour (or at one snapshot: an hour of one sample)."""

    uid: str
    namespace: str
    name: str
    kind: str
    status: str = ""
    labels: dict[str, str] = field(default_factory=dict)  # the configured keys only
    annotations: dict[str, str] = field(default_factory=dict)
    pods: set[str] = field(default_factory=set)  # pod names (Prometheus's pod label)
    allocated: float = 0.0  # GPUs, averaged over the hour
    replicas: float = 0.0
    max_replicas: int = 0
    min_replicas: int = 0


def floor_hour(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


# --- what runs now -------------------------------------------------------------------------


def _pod_meta(conn: Connection, t: Scoped, uids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Each pod's metadata as its newest snapshot holds it (labels, annotations)."""
    s = t.pod_snapshots
    wanted = list(uids)
    out: dict[str, dict[str, Any]] = {}
    for chunk in range(0, len(wanted), 500):
        part = wanted[chunk : chunk + 500]
        newest = select(func.max(s.c.id)).where(s.c.pod_uid.in_(part)).group_by(s.c.pod_uid)
        for r in conn.execute(select(s.c.pod_uid, s.c.pod_metadata).where(s.c.id.in_(newest))):
            out[str(r.pod_uid)] = dict(r.pod_metadata or {})
    return out


def _picked(values: dict[str, Any] | None, keys: tuple[str, ...]) -> dict[str, str]:
    got = values or {}
    return {k: str(got[k]) for k in keys if k in got}


def _workloads(conn: Connection, t: Scoped, pods: list[Any], keys: Keys) -> dict[str, WorkloadHour]:
    """The top workloads of these gpu_pods rows (a pod with none is its own workload),
    without figures; labels and annotations from their pods' newest snapshots."""
    w = t.gpu_workloads
    tops = {str(p.workload_uid) for p in pods if p.workload_uid}
    rows = {str(r.uid): r for r in conn.execute(select(w).where(w.c.uid.in_(tops)))} if tops else {}
    state = statuses(conn, t, list(rows.values()))  # as every route gives it
    meta = _pod_meta(conn, t, [str(p.uid) for p in pods])
    out: dict[str, WorkloadHour] = {}
    for p in pods:
        uid = str(p.workload_uid or p.uid)
        if uid not in out:
            row = rows.get(uid)
            out[uid] = WorkloadHour(
                uid,
                str(p.namespace),
                str(row.name if row else p.name),
                str(row.kind if row else "Pod"),
                str(state[uid] if row else p.phase) or "",
            )
        m = meta.get(str(p.uid), {})
        one = out[uid]
        for k, v in _picked(m.get("labels"), keys.labels).items():
            one.labels.setdefault(k, v)
        for k, v in _picked(m.get("annotations"), keys.annotations).items():
            one.annotations.setdefault(k, v)
        one.pods.add(str(p.name))
    return out


def capacity(conn: Connection, t: Scoped) -> int:
    """The GPUs of the cluster's nodes (every configured resource)."""
    n = t.nodes
    return sum(
        int(v or 0)
        for r in conn.execute(select(n.c.gpu_capacity).where(n.c.deleted.is_(False)))
        for v in (r.gpu_capacity or {}).values()
    )


def snapshot(
    conn: Connection, t: Scoped, cluster: str, keys: Keys, now: datetime
) -> list[dict[str, Any]]:
    """gpu_allocation_snapshots rows for now: the cluster, each namespace, each label and
    annotation value (the configured keys, beyond max_values folded into OTHER), and each
    top workload (its key its UID, its details what the hour's statistics need)."""
    p = t.gpu_pods
    pods = list(conn.execute(select(p).where(p.c.running.is_(True), p.c.deleted.is_(False))))
    works = _workloads(conn, t, pods, keys)
    gpus: dict[str, int] = {}
    replicas: dict[str, int] = {}
    for pod in pods:
        uid = str(pod.workload_uid or pod.uid)
        gpus[uid] = gpus.get(uid, 0) + int(pod.gpus)
        replicas[uid] = replicas.get(uid, 0) + 1
    for uid, one in works.items():
        one.allocated, one.replicas = float(gpus[uid]), float(replicas[uid])
        one.max_replicas = one.min_replicas = replicas[uid]
    base = {"cluster_name": cluster, "snapshot_time": now, "created_at": now}
    groups = groups_of(works.values(), keys)
    held, cap = cluster_allocation(conn, t)  # the cluster's figure, as every route's
    out = [
        {
            **base,
            "dimension_type": "cluster",
            "dimension_key": "",
            "dimension_value": "",
            "total_gpu_capacity": cap,
            "allocated_gpu_count": held,
            "allocation_details": {"workloads": len(works)},
        }
    ]
    for (dim, key, value), members in sorted(groups.items()):
        out.append(
            {
                **base,
                "dimension_type": dim,
                "dimension_key": key,
                "dimension_value": value,
                "total_gpu_capacity": 0,
                "allocated_gpu_count": int(sum(m.allocated for m in members)),
                "allocation_details": {"workloads": len(members)},
            }
        )
    for uid, one in sorted(works.items()):
        out.append(
            {
                **base,
                "dimension_type": "workload",
                "dimension_key": uid,
                "dimension_value": one.name,
                "total_gpu_capacity": 0,
                "allocated_gpu_count": gpus[uid],
                "allocation_details": {
                    "namespace": one.namespace,
                    "kind": one.kind,
                    "status": one.status,
                    "replicas": replicas[uid],
                    "pods": sorted(one.pods),
                    "labels": one.labels,
                    "annotations": one.annotations,
                },
            }
        )
    return out


def groups_of(
    works: Iterable[WorkloadHour], keys: Keys
) -> dict[tuple[str, str, str], list[WorkloadHour]]:
    """(namespace|label|annotation, key, value) -> its workloads with GPUs allocated; a key
    with more than max_values values keeps the ones with most GPUs and folds the rest
    into OTHER."""
    out: dict[tuple[str, str, str], list[WorkloadHour]] = {}
    held = [w for w in works if w.allocated > 0]
    for one in held:
        out.setdefault(("namespace", "", one.namespace), []).append(one)
    for dim in DIMENSIONS:
        for key in keys.of(dim):
            by: dict[str, list[WorkloadHour]] = {}
            for one in held:
                value = (one.labels if dim == "label" else one.annotations).get(key)
                if value is not None:
                    by.setdefault(value, []).append(one)
            ranked = sorted(by, key=lambda v: (-sum(m.allocated for m in by[v]), v))
            for value in ranked[: keys.max_values]:
                out[(dim, key, value)] = by[value]
            for value in ranked[keys.max_values :]:
                out.setdefault((dim, key, OTHER), []).extend(by[value])
    return out


def folded(works: Iterable[WorkloadHour], keys: Keys) -> int:
    """How many values beyond max_values were folded into OTHER, every key."""
    held = [w for w in works if w.allocated > 0]
    n = 0
    for dim in DIMENSIONS:
        for key in keys.of(dim):
            values = {(w.labels if dim == "label" else w.annotations).get(key) for w in held}
            n += max(0, len(values - {None}) - keys.max_values)
    return n


# --- one completed hour --------------------------------------------------------------------


def hour_from_snapshots(
    conn: Connection, t: Scoped, hour: datetime
) -> tuple[int, float, dict[str, WorkloadHour]] | None:
    """(capacity, GPUs allocated, workloads) averaged over the hour's snapshots; None when
    it has none (the service was not running)."""
    s = t.gpu_allocation_snapshots
    within = [s.c.snapshot_time >= hour, s.c.snapshot_time < hour + HOUR]
    clusters = list(
        conn.execute(
            select(s.c.total_gpu_capacity, s.c.allocated_gpu_count).where(
                s.c.dimension_type == "cluster", *within
            )
        )
    )
    if not clusters:
        return None
    n = len(clusters)
    works: dict[str, WorkloadHour] = {}
    seen: dict[str, int] = {}
    for r in conn.execute(
        select(s).where(s.c.dimension_type == "workload", *within).order_by(s.c.snapshot_time)
    ):
        d = r.allocation_details or {}
        uid = str(r.dimension_key)
        one = works.get(uid)
        if one is None:
            one = works[uid] = WorkloadHour(
                uid,
                str(d.get("namespace", "")),
                str(r.dimension_value),
                str(d.get("kind", "")),
                max_replicas=0,
                min_replicas=1 << 30,
            )
        one.status = str(d.get("status", one.status))  # the hour's last
        one.labels.update(d.get("labels") or {})
        one.annotations.update(d.get("annotations") or {})
        one.pods.update(d.get("pods") or [])
        count = int(d.get("replicas", 0))
        one.allocated += r.allocated_gpu_count / n
        one.replicas += count / n
        one.max_replicas = max(one.max_replicas, count)
        one.min_replicas = min(one.min_replicas, count)
        seen[uid] = seen.get(uid, 0) + 1
    for uid, one in works.items():
        if seen[uid] < n:  # absent from some snapshot: none ran then
            one.min_replicas = 0
    cap = max(int(r.total_gpu_capacity) for r in clusters)
    return cap, sum(int(r.allocated_gpu_count) for r in clusters) / n, works


def first_start(conn: Connection, t: Scoped) -> datetime | None:
    """When the first recorded GPU pod started."""
    p = t.gpu_pods
    got: datetime | None = conn.execute(select(func.min(p.c.started_at))).scalar_one()
    return aware(got)


def hour_from_lifetimes(
    conn: Connection, t: Scoped, hour: datetime, keys: Keys, now: datetime
) -> tuple[int, float, dict[str, WorkloadHour]]:
    """(capacity, GPUs allocated, workloads) of an hour without snapshots, from the pods'
    lifetimes: each pod holds its GPUs from started_at to ended_at (or deleted_at, or
    now), weighted by the part of the hour that covers; capacity is the nodes' now."""
    p = t.gpu_pods
    end = hour + HOUR
    pods = list(conn.execute(select(p).where(p.c.started_at.is_not(None), p.c.started_at < end)))
    spans: dict[str, tuple[float, float]] = {}
    kept = []
    for pod in pods:
        start: datetime = utc(pod.started_at)
        stop: datetime = aware(pod.ended_at or pod.deleted_at) or now
        lo, hi = max(start, hour), min(stop, end)
        if hi > lo:
            spans[str(pod.uid)] = ((lo - hour).total_seconds(), (hi - hour).total_seconds())
            kept.append(pod)
    works = _workloads(conn, t, kept, keys)
    per: dict[str, list[tuple[float, float]]] = {}
    total = 0.0
    for pod in kept:
        a, b = spans[str(pod.uid)]
        uid = str(pod.workload_uid or pod.uid)
        share = int(pod.gpus) * (b - a) / 3600
        works[uid].allocated += share
        works[uid].replicas += (b - a) / 3600
        total += share
        per.setdefault(uid, []).append((a, b))
    for uid, one in works.items():
        one.max_replicas, one.min_replicas = _most_least(per[uid])
    return capacity(conn, t), total, works


def _most_least(spans: list[tuple[float, float]]) -> tuple[int, int]:
    """The most and the least of these spans (seconds into the hour) that overlap at once."""
    edges = sorted({0.0, 3600.0, *(x for s in spans for x in s)})
    counts = [
        sum(1 for a, b in spans if a <= lo and b >= hi)
        for lo, hi in zip(edges, edges[1:], strict=False)
        if hi > lo
    ]
    return max(counts), min(counts)


# --- utilization ---------------------------------------------------------------------------


def quantile(values: list[float], q: float) -> float:
    """As Prometheus's quantile_over_time: linear between the ranks."""
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


@dataclass
class HourSeries:
    """The hour's per-pod samples, keyed (namespace, pod) -> {timestamp: value}."""

    util_sum: dict[tuple[str, str], dict[int, float]]
    util_count: dict[tuple[str, str], dict[int, float]]
    mem_used: dict[tuple[str, str], dict[int, float]]
    mem_total: dict[tuple[str, str], dict[int, float]]


def hour_series(c: Scope, hour: datetime) -> HourSeries | None:
    """The hour's GPU samples per pod, a minute apart (the hour's own minutes), or None
    when Prometheus is not configured or cannot answer (within a run opened with
    prom.missing_figures, a Prometheus that did not answer at all is not asked again: a
    backfill of many hours waits for its timeout once, not once an hour)."""
    if not c.prom.url:
        return None
    start = int(hour.timestamp())
    end = start + 3600 - STEP
    got = []
    for expr in prom.ACCOUNTING:
        series = c.prom.maybe_graph(expr, start, end, STEP)
        if series is None:
            return None
        one: dict[tuple[str, str], dict[int, float]] = {}
        for s in series:
            key = (s["labels"].get("namespace", ""), s["labels"].get("pod", ""))
            one[key] = {v["timestamp"]: v["value"] for v in s["values"]}
        got.append(one)
    return HourSeries(*got)


def _per_step(
    series: dict[tuple[str, str], dict[int, float]], members: set[tuple[str, str]]
) -> dict[int, float]:
    out: dict[int, float] = {}
    for key in members & series.keys():
        for ts, v in series[key].items():
            out[ts] = out.get(ts, 0.0) + v
    return out


def utilization(hs: HourSeries | None, members: set[tuple[str, str]]) -> dict[str, Any]:
    """avg, max, min, p50, p95 (percent) of the mean utilization of these pods' GPUs at each
    minute, and the minutes that had samples; every figure None without Prometheus."""
    none: dict[str, Any] = dict.fromkeys(("avg", "max", "min", "p50", "p95"), None)
    if hs is None:
        return {**none, "count": 0}
    sums, counts = _per_step(hs.util_sum, members), _per_step(hs.util_count, members)
    values = [sums[ts] / counts[ts] for ts in sorted(sums) if counts.get(ts)]
    if not values:
        return {**none, "count": 0}
    return {
        "avg": sum(values) / len(values),
        "max": max(values),
        "min": min(values),
        "p50": quantile(values, 0.5),
        "p95": quantile(values, 0.95),
        "count": len(values),
    }


def memory(hs: HourSeries | None, members: set[tuple[str, str]]) -> dict[str, float | None]:
    """GiB of GPU memory these pods used (mean and most over the minutes) and had."""
    if hs is None:
        return {"used": None, "max": None, "total": None}
    used = list(_per_step(hs.mem_used, members).values())
    total = list(_per_step(hs.mem_total, members).values())
    return {
        "used": sum(used) / len(used) / GIB if used else None,
        "max": max(used) / GIB if used else None,
        "total": sum(total) / len(total) / GIB if total else None,
    }


def _members(works: Iterable[WorkloadHour]) -> set[tuple[str, str]]:
    return {(w.namespace, pod) for w in works for pod in w.pods}


def namespace_members(hs: HourSeries | None, namespace: str) -> set[tuple[str, str]]:
    """Every pod of the namespace Prometheus has GPU samples of."""
    return {k for k in (hs.util_sum if hs else {}) if k[0] == namespace}


# --- the rows of an hour -------------------------------------------------------------------


def hour_rows(
    cluster: str,
    hour: datetime,
    cap: int,
    allocated: float,
    works: dict[str, WorkloadHour],
    hs: HourSeries | None,
    keys: Keys,
    now: datetime,
) -> dict[str, list[dict[str, Any]]]:
    """Table name -> the hour's rows: cluster, namespaces, labels and annotations,
    workloads."""
    stamp = {"cluster_name": cluster, "stat_hour": hour, "created_at": now, "updated_at": now}
    u = utilization(hs, set(hs.util_sum) if hs else set())  # every GPU series
    out: dict[str, list[dict[str, Any]]] = {
        "cluster_gpu_hourly_stats": [
            {
                **stamp,
                "total_gpu_capacity": cap,
                "allocated_gpu_count": allocated,
                "allocation_rate": 100 * allocated / cap if cap else 0.0,
                **_util_columns(u, p=True),
                "sample_count": u["count"],
            }
        ],
        "namespace_gpu_hourly_stats": [],
        "label_gpu_hourly_stats": [],
        "workload_gpu_hourly_stats": [],
    }
    for (dim, key, value), members in sorted(groups_of(works.values(), keys).items()):
        held = sum(m.allocated for m in members)
        if dim == "namespace":
            u = utilization(hs, namespace_members(hs, value))
            out["namespace_gpu_hourly_stats"].append(
                {
                    **stamp,
                    "namespace": value,
                    "total_gpu_capacity": 0,
                    "allocated_gpu_count": held,
                    "allocation_rate": 0.0,
                    **_util_columns(u, p=False),
                    "active_workload_count": len(members),
                }
            )
        else:
            u = utilization(hs, _members(members))
            out["label_gpu_hourly_stats"].append(
                {
                    **stamp,
                    "dimension_type": dim,
                    "dimension_key": key,
                    "dimension_value": value,
                    "allocated_gpu_count": held,
                    **_util_columns(u, p=False),
                    "active_workload_count": len(members),
                }
            )
    for uid, one in sorted(works.items()):
        if one.allocated <= 0:
            continue
        pods = _members([one])
        u, mem = utilization(hs, pods), memory(hs, pods)
        out["workload_gpu_hourly_stats"].append(
            {
                **stamp,
                "namespace": one.namespace,
                "workload_name": one.name,
                "workload_type": one.kind,
                "allocated_gpu_count": one.allocated,
                "requested_gpu_count": one.allocated,
                **_util_columns(u, p=True),
                "avg_gpu_memory_used": mem["used"],
                "max_gpu_memory_used": mem["max"],
                "avg_gpu_memory_total": mem["total"],
                "avg_replica_count": one.replicas,
                "max_replica_count": one.max_replicas,
                "min_replica_count": one.min_replicas,
                "workload_status": one.status,
                "sample_count": u["count"],
                "owner_uid": uid,
                "owner_name": one.name,
                "labels": one.labels,
                "annotations": one.annotations,
            }
        )
    return out


def _util_columns(u: dict[str, Any], p: bool) -> dict[str, Any]:
    cols = {"avg_utilization": u["avg"], "max_utilization": u["max"], "min_utilization": u["min"]}
    if p:
        cols |= {"p50_utilization": u["p50"], "p95_utilization": u["p95"]}
    return cols
