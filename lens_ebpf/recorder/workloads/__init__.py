"""The workloads: their states, hierarchy and pods, the list and one workload's detail,
those on a node now and before, the running ones' GPUs (consumers), and their graphs.

A workload's status is its owner's own where that says it (Running, Done, Failed, or
Deleted), and follows its pods where it is silent or behind (a CronJob between its
schedule and its Job's status, a Deployment before its readyReplicas): Running while a
pod of it runs (a Deployment's, ReplicaSet's, StatefulSet's or DaemonSet's once Ready).
statuses() is that rule, for every route and the accounting."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, func, select

from lens_ebpf.core.times import aware, utc
from lens_ebpf.recorder import prom
from lens_ebpf.recorder.errors import NotFound
from lens_ebpf.recorder.nodes.gpus import gpu_names, known
from lens_ebpf.recorder.scope import Scope
from lens_ebpf.recorder.store.schema import Scoped

# the recorder's workload states -> the Primus-Lens API's (Running, Pending, Done,
# Deleted, Failed), and their colors as the original gives them
WORKLOAD_STATUS = {
    "Running": "Running",
    "Active": "Running",
    "Available": "Running",
    "Pending": "Pending",
    "Scheduled": "Pending",
    "Created": "Pending",
    "Complete": "Done",
    "Succeeded": "Done",
    "Failed": "Failed",
}
WORKLOAD_COLORS = {
    "Running": "green",
    "Done": "blue",
    "Deleted": "gray",
    "Pending": "yellow",
    "Failed": "red",
}
SAID = frozenset(("Running", "Done", "Failed", "Deleted"))  # an owner's status that stands
# the kinds whose pods serve once Ready (their status counts ready replicas); any other
# kind's (a Job's, a CronJob's, a training operator's) run once Running
SERVING = frozenset(("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"))
CHUNK = 500  # uids in one IN (...)


def ts(value: Any) -> int:
    return int(utc(value).timestamp()) if value is not None else 0


def workload_status(row: Any) -> str:
    """The owner's own status, as the Primus-Lens API names it."""
    return "Deleted" if row.deleted else WORKLOAD_STATUS.get(row.status, row.status)


def statuses(conn: Connection, t: Scoped, rows: list[Any]) -> dict[str, str]:
    """Each gpu_workloads row's status by uid (the module's rule): its owner's own where
    that stands (SAID), else Running while a pod of it runs (SERVING kinds': a Ready
    one), else its owner's own."""
    out = {str(r.uid): workload_status(r) for r in rows}
    behind = {str(r.uid): r for r in rows if out[str(r.uid)] not in SAID}
    if not behind:
        return out
    p, refs = t.gpu_pods, t.workload_pod_references
    live: dict[str, set[str]] = {}
    wanted = sorted(behind)
    for i in range(0, len(wanted), CHUNK):
        for r in conn.execute(
            select(refs.c.workload_uid, p.c.uid)
            .join(p, p.c.uid == refs.c.pod_uid)
            .where(
                refs.c.workload_uid.in_(wanted[i : i + CHUNK]),
                p.c.running.is_(True),
                p.c.deleted.is_(False),
            )
        ):
            live.setdefault(str(r.workload_uid), set()).add(str(r.uid))
    serving = {u for uid, r in behind.items() if r.kind in SERVING for u in live.get(uid, ())}
    ready = ready_pods(conn, t, serving) if serving else set()
    for uid, r in behind.items():
        pods = live.get(uid, set())
        if pods and (r.kind not in SERVING or pods & ready):
            out[uid] = "Running"
    return out


def ready_pods(conn: Connection, t: Scoped, uids: set[str]) -> set[str]:
    """Of these pods, those whose newest snapshot holds the Ready condition True."""
    s = t.pod_snapshots
    wanted = sorted(uids)
    out = set()
    for i in range(0, len(wanted), CHUNK):
        newest = (
            select(func.max(s.c.id))
            .where(s.c.pod_uid.in_(wanted[i : i + CHUNK]))
            .group_by(s.c.pod_uid)
        )
        for r in conn.execute(select(s.c.pod_uid, s.c.status).where(s.c.id.in_(newest))):
            conds = (r.status or {}).get("conditions") or ()
            if any(
                isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
                for c in conds
            ):
                out.add(str(r.pod_uid))
    return out


def workload(conn: Connection, t: Scoped, uid: str) -> Any:
    w = t.gpu_workloads
    row = conn.execute(select(w).where(w.c.uid == uid)).first()
    if row is None:
        raise NotFound(f"workload not found: {uid!r}")
    return row


def hierarchy(conn: Connection, t: Scoped, uid: str) -> dict[str, Any]:
    """model.WorkloadHierarchyItem: the workload and every workload below it."""
    w = t.gpu_workloads
    rows = list(
        conn.execute(
            select(w.c.uid, w.c.parent_uid, w.c.kind, w.c.name, w.c.namespace, w.c.created_at)
        )
    )
    children: dict[str, list[Any]] = {}
    for r in rows:
        if r.parent_uid:
            children.setdefault(r.parent_uid, []).append(r)
    by_uid = {r.uid: r for r in rows}

    def node(r: Any, seen: frozenset[str]) -> dict[str, Any]:
        kids = sorted(children.get(r.uid, ()), key=lambda c: (ts(c.created_at), c.name))
        below = [node(c, seen | {r.uid}) for c in kids if c.uid not in seen]
        return {
            "kind": r.kind,
            "name": r.name,
            "namespace": r.namespace,
            "uid": r.uid,
            "children": below,
        }

    if uid not in by_uid:
        raise NotFound(f"workload not found: {uid!r}")
    return node(by_uid[uid], frozenset())


def workload_pods(conn: Connection, t: Scoped, uid: str) -> list[Any]:
    """The GPU pods below a workload, at any level (oldest first)."""
    p, refs = t.gpu_pods, t.workload_pod_references
    return list(
        conn.execute(
            select(p)
            .join(refs, refs.c.pod_uid == p.c.uid)
            .where(refs.c.workload_uid == uid)
            .order_by(p.c.created_at, p.c.name)
        )
    )


def gpu_allocation_info(pods: list[Any], names: dict[str, str]) -> dict[str, float]:
    """model.GpuAllocationInfo: GPUs the workload's live pods were given, by GPU name (the
    resource's name where the node's GPUs have none)."""
    out: dict[str, float] = {}
    for pod in pods:
        if pod.deleted or not pod.running:
            continue
        for resource, n in (pod.gpu_resources or {}).items():
            key = names.get(pod.node) or resource
            out[key] = out.get(key, 0.0) + float(n)
    return out


def metadata(conn: Connection, t: Scoped) -> dict[str, Any]:
    """The namespaces and kinds of the top-level workloads."""
    w = t.gpu_workloads
    top = w.c.parent_uid.is_(None) | (w.c.parent_uid == "")
    return {
        "namespaces": sorted({r[0] for r in conn.execute(select(w.c.namespace).where(top))}),
        "kinds": sorted({r[0] for r in conn.execute(select(w.c.kind).where(top))}),
    }


def hierarchy_of(
    conn: Connection, t: Scoped, kind: str, name: str, ns: str | None
) -> dict[str, Any]:
    """The hierarchy of the newest workload of that kind and name (in that namespace)."""
    w = t.gpu_workloads
    cond = [w.c.kind == kind, w.c.name == name] + ([w.c.namespace == ns] if ns else [])
    row = conn.execute(select(w.c.uid).where(*cond).order_by(w.c.created_at.desc())).first()
    if row is None:
        raise NotFound(f"workload not found: {kind}/{name}")
    return hierarchy(conn, t, row.uid)


def detail(conn: Connection, t: Scoped, uid: str) -> dict[str, Any]:
    """model.WorkloadInfo."""
    row = workload(conn, t, uid)
    pods = workload_pods(conn, t, uid)
    items = [
        {
            "podUid": p.uid,
            "podNamespace": p.namespace,
            "podName": p.name,
            "nodeName": p.node,
            "phase": p.phase,
            "running": p.running,
            "gpuAllocated": int(p.gpus),
            "createdAt": ts(p.created_at),
            "updatedAt": ts(p.updated_at),
        }
        for p in pods
    ]
    active = [i for i, p in zip(items, pods, strict=True) if p.running and not p.deleted]
    return {
        "apiVersion": row.api_version,
        "kind": row.kind,
        "name": row.name,
        "namespace": row.namespace,
        "uid": row.uid,
        "gpu_allocation": gpu_allocation_info(pods, gpu_names(conn, t)),
        "pods": items,
        "activePods": active,
        "startTime": ts(row.created_at),
        "endTime": ts(row.ended_at),
        "source": "k8s",
    }


def on_node(conn: Connection, t: Scoped, name: str, num: int, size: int) -> dict[str, Any]:
    """NodeWorkloadsResponse of model.WorkloadNodeView: one page of the running top-level
    workloads with a live pod on the node, their GPUs in all and on this node."""
    known(conn, t, name)
    p, w = t.gpu_pods, t.gpu_workloads
    live = p.c.running.is_(True) & p.c.deleted.is_(False)
    uids = {
        r.workload_uid
        for r in conn.execute(
            select(p.c.workload_uid).where(live, p.c.node == name, p.c.workload_uid.is_not(None))
        )
    }
    found = list(
        conn.execute(select(w).where(w.c.uid.in_(uids)).order_by(w.c.created_at, w.c.name))
    )
    state = statuses(conn, t, found)
    rows = [r for r in found if state[r.uid] == "Running"]
    views = []
    for r in rows[(num - 1) * size : num * size]:
        pods = [q for q in workload_pods(conn, t, r.uid) if q.running and not q.deleted]
        views.append(
            {
                "kind": r.kind,
                "name": r.name,
                "namespace": r.namespace,
                "uid": r.uid,
                "gpu_allocated": sum(int(q.gpus) for q in pods),
                "gpu_allocated_node": sum(int(q.gpus) for q in pods if q.node == name),
                "node_name": name,
                "status": "Running",
            }
        )
    return {"data": views, "total": len(rows)}


def node_history(conn: Connection, t: Scoped, name: str, num: int, size: int) -> dict[str, Any]:
    """NodeWorkloadsHistoryResponse of model.WorkloadHistoryNodeView: one page of the
    node's GPU pods that ran and are over (not running, not pending), newest first, each
    with its top-level workload."""
    p, w = t.gpu_pods, t.gpu_workloads
    done = (p.c.node == name, p.c.running.is_(False), p.c.phase != "Pending")
    total = int(conn.execute(select(func.count()).select_from(p).where(*done)).scalar_one())
    pods = list(
        conn.execute(
            select(p)
            .where(*done)
            .order_by(p.c.created_at.desc(), p.c.name)
            .offset((num - 1) * size)
            .limit(size)
        )
    )
    tops = {
        r.uid: r
        for r in conn.execute(
            select(w).where(w.c.uid.in_({q.workload_uid for q in pods if q.workload_uid}))
        )
    }
    views = []
    for q in pods:
        top = tops.get(q.workload_uid)
        if top is None:
            continue  # as the original: a pod without a workload is not listed
        views.append(
            {
                "kind": top.kind,
                "name": top.name,
                "namespace": top.namespace,
                "uid": top.uid,
                "gpu_allocated": int(q.gpus),
                "pod_name": q.name,
                "pod_namespace": q.namespace,
                "start_time": ts(q.created_at),
                "end_time": ts(q.ended_at or q.updated_at),
            }
        )
    return {"data": views, "total": total}


def listing(
    conn: Connection,
    c: Scope,
    now: datetime,
    num: int,
    size: int,
    order: str,
    name: str | None,
    namespace: str | None,
    kind: str | None,
    status: str | None,
) -> dict[str, Any]:
    """WorkloadListResponse of model.WorkloadListItem: one page of the top-level workloads,
    newest first (by start_at or end_at), each with its GPUs and its pods' GPU utilization
    over its life (average, p50, p90, p95 of the per-minute mean; the instant value while
    it runs)."""
    w = c.tables.gpu_workloads
    cond: list[ColumnElement[bool]] = [w.c.parent_uid.is_(None) | (w.c.parent_uid == "")]
    if name:
        cond.append(w.c.name.contains(name, autoescape=True))
    for col, value in (("namespace", namespace), ("kind", kind)):
        if value:
            cond.append(w.c[col] == value)
    rows = list(conn.execute(select(w).where(*cond)))
    state_of = statuses(conn, c.tables, rows)
    if status:
        rows = [r for r in rows if state_of[r.uid] == status]
    key = "ended_at" if order == "end_at" else "created_at"
    rows.sort(key=lambda r: (ts(getattr(r, key)), r.name), reverse=True)
    names = gpu_names(conn, c.tables)
    items = []
    for r in rows[(num - 1) * size : num * size]:
        pods = workload_pods(conn, c.tables, r.uid)
        state = state_of[r.uid]
        item = {
            "kind": r.kind,
            "name": r.name,
            "namespace": r.namespace,
            "uid": r.uid,
            "gpu_allocated": sum(int(p.gpus) for p in pods if p.running and not p.deleted),
            "gpu_allocation": gpu_allocation_info(pods, names),
            "status": state,
            "status_color": WORKLOAD_COLORS.get(state, ""),
            "start_at": ts(r.created_at),
            "end_at": ts(r.ended_at or r.updated_at),
            "source": "k8s",
        }
        item.update(utilization_stats(c, r, pods, state == "Running", now))
        items.append(item)
    return {"data": items, "total": len(rows)}


def utilization_stats(
    c: Scope, row: Any, pods: list[Any], running: bool, now: datetime
) -> dict[str, Any]:
    """From the agents' gpu_utilization of the GPUs the workload's pods held (each 0 where
    Prometheus cannot answer, and the instant one once the workload no longer runs)."""
    stats: dict[str, Any] = {
        "instant_gpu_utilization": 0.0,
        "avg_gpu_utilization": 0.0,
        "p50_gpu_utilization": 0.0,
        "p90_gpu_utilization": 0.0,
        "p95_gpu_utilization": 0.0,
    }
    if not pods:
        return stats
    start = aware(row.created_at) or now
    end = aware(row.ended_at) or now
    seconds = max(60, int((min(end, now) - start).total_seconds()))
    sel = prom.pods_selector(row.namespace, [p.name for p in pods])
    series = f"avg(gpu_utilization{{{sel}}})[{seconds}s:60s]"
    at = min(end, now)
    stats["avg_gpu_utilization"] = c.prom.maybe_scalar(f"avg_over_time({series})", at)
    for q, field in ((0.5, "p50"), (0.9, "p90"), (0.95, "p95")):
        stats[f"{field}_gpu_utilization"] = c.prom.maybe_scalar(
            f"quantile_over_time({q}, {series})", at
        )
    if running:
        stats["instant_gpu_utilization"] = c.prom.maybe_scalar(
            f"avg(gpu_utilization{{{sel}}})", now
        )
    return stats


def consumers(conn: Connection, c: Scope, now: datetime, num: int, size: int) -> dict[str, Any]:
    """ClusterConsumersResponse of model.TopLevelGpuResource: one page of the running
    top-level workloads, their GPU request and their pods' GPU utilization now (0 where
    Prometheus cannot answer); pods [] (the original's []GpuPod, not filled here)."""
    w = c.tables.gpu_workloads
    top = w.c.parent_uid.is_(None) | (w.c.parent_uid == "")
    found = list(
        conn.execute(
            select(w).where(top, w.c.deleted.is_(False)).order_by(w.c.created_at, w.c.name)
        )
    )
    state = statuses(conn, c.tables, found)
    rows = [r for r in found if state[r.uid] == "Running"]
    items = []
    for r in rows[(num - 1) * size : num * size]:
        pods = [p.name for p in workload_pods(conn, c.tables, r.uid) if p.running and not p.deleted]
        util = (
            c.prom.maybe_scalar(
                f"avg(gpu_utilization{{" f"{prom.pods_selector(r.namespace, pods)}}})", now
            )
            if pods
            else 0.0
        )
        items.append(
            {
                "kind": r.kind,
                "name": r.name,
                "namespace": r.namespace,
                "uid": r.uid,
                "stat": {"gpu_request": int(r.gpu_request), "gpu_utilization": util},
                "pods": [],
                "source": "k8s",
            }
        )
    return {"data": items, "total": len(rows)}


def graphs(conn: Connection, c: Scope, uid: str, start: int, end: int, step: int) -> dict[str, Any]:
    """Map of model.MetricsGraph: its GPUs' utilization, memory and power per node (the
    original's three), and beyond the original: memory and power per pod and summed, TCP
    bytes/s and median RTT from its pods' nodes to its own pods (prom.TooManyPointsError beyond
    max_points)."""
    row = workload(conn, c.tables, uid)
    pods = workload_pods(conn, c.tables, uid)
    # the agents name a remote pod's workload by its top owner
    tops = {p.workload_uid for p in pods if p.workload_uid}
    top = workload(conn, c.tables, next(iter(tops))) if len(tops) == 1 else row
    out: dict[str, Any] = {}
    asked = prom.workload_graphs(
        row.namespace,
        top.name,
        [p.name for p in pods],
        sorted({p.node for p in pods if p.node}),
        step,
    )
    for title, (serial, unit, expr) in asked.items():
        series = c.prom.graph(expr, start, end, step) if pods else []
        out[title] = {"serial": serial, "series": series, "config": {"y_axis_unit": unit}}
    return out
