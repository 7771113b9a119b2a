"""The cluster API's envelope and parameters (the Primus-Lens API's: `/v1/` as its web UI
calls it, and the same routes under `/api/`), and the routes over the nodes' devices.

Envelope `{"meta": {"code": 2000, "message": "OK"}, "data": ...}`; errors carry
`meta.code` 4001 (a bad parameter, named), 4004 (an unknown name) or 5003 (a dependency
that is down, named) with HTTP 400, 404 and 503. Parameters are taken in snake_case (the
UI's `page_num`) and camelCase (`pageNum`). Paged lists answer `{"data": [...], "total": N}`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from sqlalchemy import ColumnElement, Connection, func, or_, select, tuple_
from sqlalchemy.exc import SQLAlchemyError

from lens_ebpf.core.http import Response, json_response
from lens_ebpf.core.times import aware
from lens_ebpf.recorder import prom
from lens_ebpf.recorder.ingest.node_events import DEVICE_COLUMNS
from lens_ebpf.recorder.lifecycle import parse_time
from lens_ebpf.recorder.store.schema import Scoped, scoped

# /v1 as the UI names its API, /lens/v1 as it asks it when served under /lens/ (its build's
# base: its proxy passes the path on unchanged), and the seed's /api
PREFIXES = ("/v1", "/lens/v1", "/api")
PAGE_MAX = 1000


class ApiError(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def bad(message: str) -> ApiError:
    return ApiError(400, 4001, message)


@dataclass(frozen=True)
class Scope:
    """The cluster a request asks about (`?cluster=`): its name, the Prometheus holding
    its metrics, its storage scan's totals; its tables are its rows only."""

    name: str
    prom: prom.Prom
    storage: Callable[[], dict[str, float]] | None = None

    @property
    def tables(self) -> Scoped:
        return scoped(self.name)


def ok(data: Any) -> Response:
    return json_response(200, {"meta": {"code": 2000, "message": "OK"}, "data": data})


def error(e: ApiError) -> Response:
    return json_response(e.status, {"meta": {"code": e.code, "message": e.message},
                                    "data": None})  # fmt: skip


def param(query: dict[str, str], name: str) -> str | None:
    """A parameter by its snake_case name, or its camelCase spelling."""
    if name in query:
        return query[name]
    camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)
    return query.get(camel)


def page(query: dict[str, str]) -> tuple[int, int]:
    """(page_num, page_size): defaults 1 and 10; a page size above 1,000 is refused."""
    out = []
    for name, default, most in (("page_num", 1, None), ("page_size", 10, PAGE_MAX)):
        n = integer(query, name, default)
        if n < 1 or (most is not None and n > most):
            raise bad(f"{name}={n}: must be from 1 to {most}" if most else f"{name}={n}: "
                      "must be 1 or more")  # fmt: skip
        out.append(n)
    return out[0], out[1]


MILLIS = 100_000_000_000  # a unix time above this is milliseconds (year 5138 in seconds)


def when(query: dict[str, str], name: str) -> datetime | None:
    """A time parameter: unix seconds, unix milliseconds (as Grafana and the original's
    trainingPerformance send them), or RFC 3339; None when absent."""
    raw = param(query, name)
    if not raw:
        return None
    try:
        v = float(raw)
        return datetime.fromtimestamp(v / 1000 if v > MILLIS else v, UTC)
    except (ValueError, OverflowError, OSError):
        pass
    got = parse_time(raw)
    if got is None:
        raise bad(f"{name}={raw!r}: not unix seconds, unix milliseconds or RFC 3339")
    return got


def _device(row: Any) -> dict[str, Any]:
    """A node_devices row as the device routes answer it: the agent's record under its
    proto field names (kind for device_kind), where and when it was seen."""
    rec = {("kind" if name == "device_kind" else name): getattr(row, col)
           for name, col in DEVICE_COLUMNS.items()}  # fmt: skip
    return {**rec, "present": row.present,
            "first_seen": int(aware(row.first_seen).timestamp()),  # type: ignore[union-attr]
            "last_seen": int(aware(row.last_seen).timestamp())}  # type: ignore[union-attr]  # fmt: skip


def _change(row: Any) -> dict[str, Any]:
    return {"time": int(aware(row.at).timestamp()), "node": row.node,  # type: ignore[union-attr]
            "kind": row.kind, "slot": row.slot, "device_key": row.device_key,
            "field": row.field, "old": row.old_value, "new": row.new_value}  # fmt: skip


def node_devices(conn: Connection, name: str, query: dict[str, str], c: Scope
                 ) -> dict[str, Any]:  # fmt: skip
    """nodes/{name}/devices: the node's GPUs and RDMA ports as its agent last reported
    them (`present` false for one that went)."""
    nd = c.tables.node_devices
    rows = list(conn.execute(select(nd).where(nd.c.node == name)
                             .order_by(nd.c.kind, nd.c.idx, nd.c.slot)))  # fmt: skip
    if not rows:
        raise ApiError(404, 4004, f"no devices known for node {name!r}")
    return {"node_name": name, "devices": [_device(r) for r in rows]}


def changelog(conn: Connection, name: str, query: dict[str, str], c: Scope) -> dict[str, Any]:
    """nodes/{name}/devices/changelog?since=: one row per field that changed, oldest
    first, paged."""
    t = c.tables
    num, size = page(query)
    since = when(query, "since")
    cl = t.device_changelog
    cond = [cl.c.node == name] + ([cl.c.at >= since] if since is not None else [])
    known = conn.execute(select(func.count()).select_from(t.node_devices)
                         .where(t.node_devices.c.node == name)).scalar_one()  # fmt: skip
    if not known:
        raise ApiError(404, 4004, f"no devices known for node {name!r}")
    total = conn.execute(select(func.count()).select_from(cl).where(*cond)).scalar_one()
    rows = conn.execute(select(cl).where(*cond).order_by(cl.c.at, cl.c.id)
                        .offset((num - 1) * size).limit(size))  # fmt: skip
    return {"data": [_change(r) for r in rows], "total": int(total)}


FAULTS_MAX = 1000  # the newest faults a history lists, per place the device sat


def _arrived(conn: Connection, t: Scoped, place: Any, serial: str) -> datetime:
    """Since when this device sits in this place: its serial's arrival in the slot, or
    the slot's first report."""
    cl = t.device_changelog
    arrived = conn.execute(select(func.max(cl.c.at)).where(
        cl.c.node == place.node, cl.c.slot == place.slot, cl.c.field == "serial",
        cl.c.new_value == serial)).scalar_one_or_none()  # fmt: skip
    first = aware(place.first_seen)
    return max(first, aware(arrived)) if arrived else first  # type: ignore[type-var,return-value]


def _holders(conn: Connection, t: Scoped, place: Any, serial: str) -> list[dict[str, Any]]:
    """The pods the kubelet gave this GPU while it sat in this place, oldest first, each
    {"namespace", "pod", "workload" (its top owner, kind/name, where the service knows
    the pod), "from", "to" (unix seconds; to null while it holds the GPU)}: from the
    holder changes its agent reported in the slot, and the holder now."""
    cl = t.device_changelog
    since = _arrived(conn, t, place, serial)
    changes = list(conn.execute(select(cl.c.at, cl.c.old_value, cl.c.new_value).where(
        cl.c.node == place.node, cl.c.slot == place.slot, cl.c.field == "holder",
        cl.c.at >= since).order_by(cl.c.at, cl.c.id)))  # fmt: skip
    spans: list[tuple[str, datetime, datetime | None]] = []
    holder, start = (changes[0].old_value if changes else place.holder), since
    for c in changes:
        at = aware(c.at) or since  # never None: a changelog time is required
        if holder:
            spans.append((holder, start, at))
        holder, start = c.new_value, at
    if holder:
        spans.append((holder, start, None if place.present else aware(place.last_seen)))
    p, w = t.gpu_pods, t.gpu_workloads
    names = {tuple(h.split("/", 1)) for h, _, _ in spans if "/" in h}  # namespace/pod
    owners: dict[tuple[str, str], list[tuple[datetime, str]]] = {}
    if names:
        held = tuple_(p.c.namespace, p.c.name).in_(sorted(names))
        for r in conn.execute(select(p.c.namespace, p.c.name, p.c.created_at, w.c.kind,
                                     w.c.name.label("workload"))
                              .join(w, w.c.uid == p.c.workload_uid).where(held)):  # fmt: skip
            owners.setdefault((r.namespace, r.name), []).append(
                (aware(r.created_at) or since, f"{r.kind}/{r.workload}"))  # fmt: skip
    out = []
    for h, begin, end in spans:
        ns, _, pod = h.partition("/")
        # a name used again (a StatefulSet's pod): the pod made before this span began
        made = sorted(o for o in owners.get((ns, pod), []) if o[0] <= begin) or \
            sorted(owners.get((ns, pod), []))  # fmt: skip
        out.append({"namespace": ns, "pod": pod, "workload": made[-1][1] if made else "",
                    "from": int(begin.timestamp()),
                    "to": int(end.timestamp()) if end else None})  # fmt: skip
    return out


def _faults(conn: Connection, t: Scoped, place: Any, serial: str) -> list[dict[str, Any]]:
    """The GPU faults its agent reported for this node and slot since this device sat
    there (since its serial arrived in the slot), each with the pod that held the GPU
    then (the newest FAULTS_MAX, oldest first)."""
    since = _arrived(conn, t, place, serial)
    ne = t.node_events
    rows = conn.execute(select(ne).where(ne.c.node == place.node, ne.c.kind == "gpu_fault",
                                         ne.c.at >= since)
                        .order_by(ne.c.at.desc(), ne.c.id.desc()))  # fmt: skip
    out = []
    for r in rows:
        p = r.payload or {}
        if p.get("bdf") != place.slot:
            continue
        out.append({"time": int(aware(r.at).timestamp()), "node": r.node,  # type: ignore[union-attr]
                    "slot": place.slot, "fault": p.get("fault", ""), "code": p.get("code", ""),
                    "message": p.get("message", ""), "namespace": r.namespace, "pod": r.pod,
                    "workload": (p.get("identity") or {}).get("workload", "")})  # fmt: skip
        if len(out) >= FAULTS_MAX:
            break
    return out[::-1]


def device_history(conn: Connection, name: str, query: dict[str, str], c: Scope
                   ) -> dict[str, Any]:  # fmt: skip
    """devices/{serial}/history: where the device sat (every node and slot), every
    change it had, every pod the kubelet gave it and when, and every fault its agent
    reported there with the pod that held it; looked up by serial, UUID or key."""
    t = c.tables
    nd, cl = t.node_devices, t.device_changelog
    match = or_(nd.c.serial == name, nd.c.uuid == name, nd.c.key == name)
    places = list(conn.execute(select(nd).where(match).order_by(nd.c.first_seen)))
    if not places:
        raise ApiError(404, 4004, f"no device with serial, UUID or key {name!r}")
    keys = sorted({p.key for p in places})
    # changes recorded under its key, and the change that brought its serial into a slot
    rows = conn.execute(select(cl).where(or_(cl.c.device_key.in_(keys),
                                             (cl.c.field == "serial") & (cl.c.new_value == name)))
                        .order_by(cl.c.at, cl.c.id))  # fmt: skip
    faults = sorted((f for p in places for f in _faults(conn, t, p, p.serial)),
                    key=lambda f: f["time"])  # fmt: skip
    holders = sorted((h for p in places for h in _holders(conn, t, p, p.serial)),
                     key=lambda h: h["from"])  # fmt: skip
    return {"serial": name, "places": [_device(p) for p in places],
            "changes": [_change(r) for r in rows], "holders": holders,
            "faults": faults}  # fmt: skip


# a GPU resource -> the vendor the Primus-Lens API names it by (its GpuVendor values)
VENDORS = {"amd.com/gpu": "amd", "nvidia.com/gpu": "NVIDIA"}


def gpu_allocation(conn: Connection, name: str, query: dict[str, str], c: Scope
                   ) -> list[dict[str, Any]]:  # fmt: skip
    """nodes/gpuAllocation (model.GpuAllocation): per node and GPU resource with a
    capacity, the GPUs running pods requested; allocationRate is a ratio (0 to 1), as
    the original computes it."""
    n, p = c.tables.nodes, c.tables.gpu_pods
    allocated: dict[tuple[str, str], int] = {}
    for row in conn.execute(select(p.c.node, p.c.gpu_resources).where(
            p.c.running.is_(True), p.c.deleted.is_(False))):  # fmt: skip
        node, res = row.node, row.gpu_resources or {}
        for resource, count in res.items():
            key = (str(node), str(resource))
            allocated[key] = allocated.get(key, 0) + int(count)
    out = []
    for row in conn.execute(select(n).where(n.c.deleted.is_(False)).order_by(n.c.name)):
        for resource, capacity in sorted((row.gpu_capacity or {}).items()):
            if not capacity:
                continue
            used = allocated.get((row.name, resource), 0)
            out.append({"node": row.name, "vendor": VENDORS.get(resource, resource),
                        "capacity": int(capacity), "allocated": used,
                        "allocationRate": used / int(capacity)})  # fmt: skip
    return out


STATUS_COLORS = {"Ready": "green", "NotReady": "red", "Unknown": "yellow"}  # the original's
# the node label that names its GPUs, as the original reads it (AMD's labeller, NVIDIA's),
# then GPU feature discovery's product label
GPU_NAME_LABELS = ("amd.com/gpu.product-name", "nvidia.com/gpu.device-name",
                   "nvidia.com/gpu.product")  # fmt: skip
ORDER = {"name", "ip", "gpu_name", "gpu_count", "gpu_allocation", "gpu_utilization", "status"}


def _gpu_nodes(conn: Connection, t: Scoped, only: str | None = None) -> list[dict[str, Any]]:
    """Every node with GPU capacity (or only that one), as model.GPUNode but the
    utilization."""
    n, p, nd = t.nodes, t.gpu_pods, t.node_devices
    live = [p.c.running.is_(True), p.c.deleted.is_(False)] + ([p.c.node == only] if only else [])
    allocated: dict[str, int] = {}
    for r in conn.execute(select(p.c.node, p.c.gpus).where(*live)):
        allocated[r.node] = allocated.get(r.node, 0) + int(r.gpus)
    nodes = list(conn.execute(select(n).where(n.c.deleted.is_(False),
                                              *([n.c.name == only] if only else []))
                              .order_by(n.c.name)))  # fmt: skip
    unnamed = [r.name for r in nodes if not any((r.labels or {}).get(k) for k in GPU_NAME_LABELS)]
    models = {str(r.node): str(r.model) for r in conn.execute(
        select(nd.c.node, nd.c.model).where(nd.c.kind == "gpu", nd.c.present.is_(True),
                                            nd.c.model != "", nd.c.node.in_(unnamed)))
    } if unnamed else {}  # fmt: skip
    out = []
    for row in nodes:
        count = sum(int(v) for v in (row.gpu_capacity or {}).values())
        if not count:
            continue
        labels = row.labels or {}
        name = next((labels[k] for k in GPU_NAME_LABELS if labels.get(k)), "") or \
            models.get(row.name, "")  # fmt: skip
        out.append({"name": row.name, "ip": row.address, "gpu_name": name, "gpu_count": count,
                    "gpu_allocation": allocated.get(row.name, 0), "gpu_utilization": 0.0,
                    "status": row.status,
                    "status_color": STATUS_COLORS.get(row.status, "")})  # fmt: skip
    return out


# the recorder's workload states -> the Primus-Lens API's (Running, Pending, Done,
# Deleted, Failed), and their colors as the original gives them
WORKLOAD_STATUS = {"Running": "Running", "Active": "Running", "Available": "Running",
                   "Pending": "Pending", "Scheduled": "Pending", "Created": "Pending",
                   "Complete": "Done", "Succeeded": "Done", "Failed": "Failed"}  # fmt: skip
WORKLOAD_COLORS = {"Running": "green", "Done": "blue", "Deleted": "gray", "Pending": "yellow",
                   "Failed": "red"}  # fmt: skip


def _ts(value: Any) -> int:
    return int(aware(value).timestamp()) if value is not None else 0  # type: ignore[union-attr]


def workload_status(row: Any) -> str:
    return "Deleted" if row.deleted else WORKLOAD_STATUS.get(row.status, row.status)


def _workload(conn: Connection, t: Scoped, uid: str) -> Any:
    w = t.gpu_workloads
    row = conn.execute(select(w).where(w.c.uid == uid)).first()
    if row is None:
        raise ApiError(404, 4004, f"workload not found: {uid!r}")
    return row


def hierarchy(conn: Connection, t: Scoped, uid: str) -> dict[str, Any]:
    """model.WorkloadHierarchyItem: the workload and every workload below it."""
    w = t.gpu_workloads
    rows = list(conn.execute(select(w.c.uid, w.c.parent_uid, w.c.kind, w.c.name, w.c.namespace,
                                    w.c.created_at)))  # fmt: skip
    children: dict[str, list[Any]] = {}
    for r in rows:
        if r.parent_uid:
            children.setdefault(r.parent_uid, []).append(r)
    by_uid = {r.uid: r for r in rows}

    def node(r: Any, seen: frozenset[str]) -> dict[str, Any]:
        kids = sorted(children.get(r.uid, ()), key=lambda c: (_ts(c.created_at), c.name))
        below = [node(c, seen | {r.uid}) for c in kids if c.uid not in seen]
        return {"kind": r.kind, "name": r.name, "namespace": r.namespace, "uid": r.uid,
                "children": below}  # fmt: skip

    if uid not in by_uid:
        raise ApiError(404, 4004, f"workload not found: {uid!r}")
    return node(by_uid[uid], frozenset())


def workload_pods(conn: Connection, t: Scoped, uid: str) -> list[Any]:
    """The GPU pods below a workload, at any level (oldest first)."""
    p, refs = t.gpu_pods, t.workload_pod_references
    return list(conn.execute(select(p).join(refs, refs.c.pod_uid == p.c.uid)
                             .where(refs.c.workload_uid == uid)
                             .order_by(p.c.created_at, p.c.name)))  # fmt: skip


def gpu_names(conn: Connection, t: Scoped) -> dict[str, str]:
    """node -> the name of its GPUs (as the node list gives it)."""
    return {n["name"]: n["gpu_name"] for n in _gpu_nodes(conn, t)}


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


def workload_metadata(conn: Connection, name: str, query: dict[str, str], c: Scope
                      ) -> dict[str, Any]:  # fmt: skip
    """workloadMetadata: the namespaces and kinds of the top-level workloads."""
    w = c.tables.gpu_workloads
    top = w.c.parent_uid.is_(None) | (w.c.parent_uid == "")
    return {"namespaces": sorted({r[0] for r in conn.execute(select(w.c.namespace).where(top))}),
            "kinds": sorted({r[0] for r in conn.execute(select(w.c.kind).where(top))})}  # fmt: skip


def hierarchy_query(conn: Connection, name: str, query: dict[str, str], c: Scope
                    ) -> dict[str, Any]:  # fmt: skip
    """workloads/hierarchy?kind=&name=[&namespace=]."""
    kind, wname, ns = param(query, "kind"), param(query, "name"), param(query, "namespace")
    if not kind or not wname:
        raise bad("kind and name are required")
    w = c.tables.gpu_workloads
    cond = [w.c.kind == kind, w.c.name == wname] + ([w.c.namespace == ns] if ns else [])
    row = conn.execute(select(w.c.uid).where(*cond).order_by(w.c.created_at.desc())).first()
    if row is None:
        raise ApiError(404, 4004, f"workload not found: {kind}/{wname}")
    return hierarchy(conn, c.tables, row.uid)


def hierarchy_by_uid(conn: Connection, name: str, query: dict[str, str], c: Scope
                     ) -> dict[str, Any]:  # fmt: skip
    return hierarchy(conn, c.tables, name)


def workload_detail(conn: Connection, name: str, query: dict[str, str], c: Scope
                    ) -> dict[str, Any]:  # fmt: skip
    """workloads/{uid} (model.WorkloadInfo)."""
    row = _workload(conn, c.tables, name)
    pods = workload_pods(conn, c.tables, name)
    items = [{"podUid": p.uid, "podNamespace": p.namespace, "podName": p.name,
              "nodeName": p.node, "phase": p.phase, "running": p.running,
              "gpuAllocated": int(p.gpus), "createdAt": _ts(p.created_at),
              "updatedAt": _ts(p.updated_at)} for p in pods]  # fmt: skip
    active = [i for i, p in zip(items, pods, strict=True) if p.running and not p.deleted]
    return {"apiVersion": row.api_version, "kind": row.kind, "name": row.name,
            "namespace": row.namespace, "uid": row.uid,
            "gpu_allocation": gpu_allocation_info(pods, gpu_names(conn, c.tables)), "pods": items,
            "activePods": active, "startTime": _ts(row.created_at),
            "endTime": _ts(row.ended_at), "source": "k8s"}  # fmt: skip


def _rfc3339(value: Any) -> str:
    """A time as Go's encoding/json writes a UTC time.Time."""
    return aware(value).strftime("%Y-%m-%dT%H:%M:%SZ")  # type: ignore[union-attr]


def hourly_stats(conn: Connection, name: str, query: dict[str, str], c: Scope
                 ) -> dict[str, Any]:  # fmt: skip
    """gpu-aggregation/cluster/hourly-stats?start_time=&end_time=&page=&page_size=&order_by=
    &order_direction= (RFC 3339; PaginatedResponse of dbmodel.ClusterGpuHourlyStats)."""
    bounds = []
    for key in ("start_time", "end_time"):
        raw = param(query, key)
        got = parse_time(raw) if raw else None
        if got is None:
            raise bad(f"{key}={raw!r}: an RFC 3339 time is required")
        bounds.append(got)
    num = integer(query, "page", 1)
    size = integer(query, "page_size", 20)
    if num < 1 or not 1 <= size <= PAGE_MAX:
        raise bad(f"page={num}, page_size={size}: page from 1, page_size from 1 to {PAGE_MAX}")
    order = param(query, "order_by") or "time"
    direction = (param(query, "order_direction") or "desc").lower()
    if order not in ("time", "utilization") or direction not in ("asc", "desc"):
        raise bad(f"order_by={order!r}, order_direction={direction!r}: time or utilization, "
                  "asc or desc")  # fmt: skip
    hs = c.tables.cluster_gpu_hourly_stats
    col = hs.c.stat_hour if order == "time" else hs.c.avg_utilization
    cond = [hs.c.stat_hour >= bounds[0], hs.c.stat_hour <= bounds[1]]
    total = int(conn.execute(select(func.count()).select_from(hs).where(*cond)).scalar_one())
    rows = conn.execute(select(hs).where(*cond)
                        .order_by(col.desc() if direction == "desc" else col.asc(), hs.c.id)
                        .offset((num - 1) * size).limit(size))  # fmt: skip
    data = [{**{c: getattr(r, c) for c in (
        "id", "cluster_name", "total_gpu_capacity", "allocated_gpu_count", "allocation_rate",
        "avg_utilization", "max_utilization", "min_utilization", "p50_utilization",
        "p95_utilization", "sample_count")},
        "stat_hour": _rfc3339(r.stat_hour), "created_at": _rfc3339(r.created_at),
        "updated_at": _rfc3339(r.updated_at)} for r in rows]  # fmt: skip
    return {"data": data, "total": total, "page": num, "page_size": size,
            "total_pages": -(-total // size)}  # fmt: skip


def node_workloads(conn: Connection, name: str, query: dict[str, str], c: Scope
                   ) -> dict[str, Any]:  # fmt: skip
    """nodes/{name}/workloads?page_num=&page_size= (NodeWorkloadsResponse of
    model.WorkloadNodeView): the running top-level workloads with a live pod on the node,
    their GPUs in all and on this node."""
    t = c.tables
    num, size = page(query)
    if conn.execute(select(t.nodes.c.name).where(t.nodes.c.name == name)).first() is None:
        raise ApiError(404, 4004, f"node not found: {name!r}")
    p, w = t.gpu_pods, t.gpu_workloads
    live = p.c.running.is_(True) & p.c.deleted.is_(False)
    uids = {r.workload_uid for r in conn.execute(select(p.c.workload_uid).where(
        live, p.c.node == name, p.c.workload_uid.is_not(None)))}  # fmt: skip
    rows = [r for r in conn.execute(select(w).where(w.c.uid.in_(uids))
                                    .order_by(w.c.created_at, w.c.name))
            if workload_status(r) == "Running"]  # fmt: skip
    views = []
    for r in rows[(num - 1) * size : num * size]:
        pods = [q for q in workload_pods(conn, t, r.uid) if q.running and not q.deleted]
        views.append({"kind": r.kind, "name": r.name, "namespace": r.namespace, "uid": r.uid,
                      "gpu_allocated": sum(int(q.gpus) for q in pods),
                      "gpu_allocated_node": sum(int(q.gpus) for q in pods if q.node == name),
                      "node_name": name, "status": "Running"})  # fmt: skip
    return {"data": views, "total": len(rows)}


def cluster_allocation(conn: Connection, name: str, query: dict[str, str], c: Scope
                       ) -> dict[str, Any]:  # fmt: skip
    """clusters/allocation?start=&end= (unix seconds or RFC 3339; either may be left
    out): the cluster's allocation snapshots, `{"points": [{"timestamp", "allocatable",
    "requested", "rate"}]}` (rate in percent); more than 10,000 points is refused."""
    end = when(query, "end")
    start = when(query, "start")
    s = c.tables.allocation_snapshots
    cond = [s.c.node == ""]
    if start is not None:
        cond.append(s.c.at >= start)
    if end is not None:
        cond.append(s.c.at <= end)
    if start is not None and end is not None and end < start:
        raise bad("end is before start")
    n = int(conn.execute(select(func.count()).select_from(s).where(*cond)).scalar_one())
    if n > PAGE_MAX * 10:
        raise bad(f"start, end: {n} snapshots; at most {PAGE_MAX * 10}: narrow the range")
    rows = conn.execute(select(s).where(*cond).order_by(s.c.at))
    return {"points": [{"timestamp": _ts(r.at), "allocatable": r.allocatable,
                        "requested": r.requested, "rate": r.rate} for r in rows]}  # fmt: skip


def node_workloads_history(conn: Connection, name: str, query: dict[str, str], c: Scope
                           ) -> dict[str, Any]:  # fmt: skip
    """nodes/{name}/workloadsHistory?page_num=&page_size= (NodeWorkloadsHistoryResponse of
    model.WorkloadHistoryNodeView): the node's GPU pods that ran and are over (not
    running, not pending), newest first, each with its top-level workload."""
    num, size = page(query)
    p, w = c.tables.gpu_pods, c.tables.gpu_workloads
    done = (p.c.node == name, p.c.running.is_(False), p.c.phase != "Pending")
    total = int(conn.execute(select(func.count()).select_from(p).where(*done)).scalar_one())
    pods = list(conn.execute(select(p).where(*done).order_by(p.c.created_at.desc(), p.c.name)
                             .offset((num - 1) * size).limit(size)))  # fmt: skip
    tops = {r.uid: r for r in conn.execute(select(w).where(
        w.c.uid.in_({q.workload_uid for q in pods if q.workload_uid})))}  # fmt: skip
    views = []
    for q in pods:
        top = tops.get(q.workload_uid)
        if top is None:
            continue  # as the original: a pod without a workload is not listed
        views.append({"kind": top.kind, "name": top.name, "namespace": top.namespace,
                      "uid": top.uid, "gpu_allocated": int(q.gpus), "pod_name": q.name,
                      "pod_namespace": q.namespace, "start_time": _ts(q.created_at),
                      "end_time": _ts(q.ended_at or q.updated_at)})  # fmt: skip
    return {"data": views, "total": total}


def _allocation_percent(conn: Connection, c: Scope,
                        per_node: list[dict[str, Any]] | None = None) -> float:  # fmt: skip
    """The cluster's GPUs requested by running pods, percent of its GPU capacity, tainted
    nodes left out as the original leaves them out (per_node: gpu_allocation's rows,
    when the caller has them)."""
    n = c.tables.nodes
    tainted = {r.name for r in conn.execute(select(n.c.name, n.c.taints).where(
        n.c.deleted.is_(False))) if r.taints}  # fmt: skip
    kept = [a for a in (gpu_allocation(conn, "", {}, c) if per_node is None else per_node)
            if a["node"] not in tainted]  # fmt: skip
    capacity = sum(a["capacity"] for a in kept)
    return 100 * sum(a["allocated"] for a in kept) / capacity if capacity else 0.0


def integer(query: dict[str, str], name: str, default: int | None = None) -> int:
    raw = param(query, name)
    if not raw:
        if default is None:
            raise bad(f"{name} is required (unix seconds)")
        return default
    try:
        return int(raw)
    except ValueError:
        raise bad(f"{name}={raw!r}: not a whole number") from None


Table = list[tuple[re.Pattern[str], Callable[..., Any]]]


def routes(read: Callable[[Callable[[Connection], Any]], Any],
           scopes: Callable[[str | None], Scope],
           clock: Callable[[], datetime] = lambda: datetime.now(UTC),
           extra: Table | None = None,
           clusters: Callable[[], list[str]] | None = None,
           ) -> Callable[..., Response]:  # fmt: skip
    """The query route for /v1 and /api: rest is the path below the prefix; scopes: the
    cluster `?cluster=` names (None: the default one; ApiError 404 for one not known);
    extra: more (pattern, fn(conn, name, query, c)) entries, matched first; clusters:
    the names gpu-aggregation/clusters lists."""

    def utilization(conn: Connection, name: str, query: dict[str, str], c: Scope
            ) -> dict[str, Any]:  # fmt: skip
        """nodes/gpuUtilization (model.GPUUtilization): the cluster's allocation rate
        (percent, from the pods and nodes it keeps) and GPU utilization now (percent)."""
        return {"allocationRate": _allocation_percent(conn, c),
                "utilization": c.prom.scalar(prom.UTILIZATION, clock())}  # fmt: skip

    def history(conn: Connection, name: str, query: dict[str, str], c: Scope
            ) -> dict[str, Any]:  # fmt: skip
        """nodes/gpuUtilizationHistory?start=&end=&step= (model.GpuUtilizationHistory)."""
        start, end = integer(query, "start"), integer(query, "end")
        step = integer(query, "step", 60)
        if step <= 0:
            raise bad(f"step={step}: must be 1 or more")
        try:
            return {key: c.prom.series(q, start, end, step) for key, q in (
                ("allocationRate", prom.ALLOCATION_RATE), ("utilization", prom.UTILIZATION),
                ("vramUtilization", prom.VRAM_RATIO))}  # fmt: skip
        except prom.TooManyPoints as exc:
            raise bad(str(exc)) from None

    def node_list(conn: Connection, name: str, query: dict[str, str], c: Scope
            ) -> dict[str, Any]:  # fmt: skip
        """nodes?page_num=&page_size=&name=&gpu_name=&status=&order_by=&desc=
        (NodeListResponse): GPU nodes, each with its GPUs' mean utilization now."""
        num, size = page(query)
        order_by = param(query, "order_by") or "name"
        if order_by not in ORDER:
            raise bad(f"order_by={order_by!r}: one of {', '.join(sorted(ORDER))}")
        desc = (param(query, "desc") or "false").lower()
        if desc not in ("true", "false", "1", "0"):
            raise bad(f"desc={desc!r}: true or false")
        nodes = _gpu_nodes(conn, c.tables)
        sub, gpu = param(query, "name") or "", param(query, "gpu_name") or ""
        wanted = {s for s in (param(query, "status") or "").split(",") if s}
        nodes = [n for n in nodes if sub in n["name"] and (not gpu or n["gpu_name"] == gpu)
                 and (not wanted or n["status"] in wanted)]  # fmt: skip

        def utilization(of: list[dict[str, Any]], every: bool) -> None:
            if not of:
                return
            expr = prom.utilization_by_node(None if every else [n["name"] for n in of])
            util = {lbl.get("node", ""): v for lbl, v in c.prom.instant(expr, clock())}
            for n in of:
                n["gpu_utilization"] = util.get(n["name"], 0.0)

        by_use = order_by == "gpu_utilization"
        if by_use:  # every node's, to order them; else only the page's
            utilization(nodes, True)
        nodes.sort(key=lambda n: (n[order_by], n["name"]), reverse=desc in ("true", "1"))
        shown = nodes[(num - 1) * size : num * size]
        if not by_use:
            utilization(shown, False)
        return {"data": shown, "total": len(nodes), "cluster_name": c.name}

    def node_detail(conn: Connection, name: str, query: dict[str, str], c: Scope
            ) -> dict[str, Any]:  # fmt: skip
        """nodes/{name} (NodeDetailResponse: model.GpuNodeDetail and cluster_name)."""
        n = c.tables.nodes
        row = conn.execute(select(n).where(n.c.name == name)).first()
        if row is None:
            raise ApiError(404, 4004, f"node not found: {name!r}")
        listed = next(iter(_gpu_nodes(conn, c.tables, name)), None)
        nd = c.tables.node_devices
        drivers = sorted({str(d) for (d,) in conn.execute(select(nd.c.driver_version).where(
            nd.c.node == name, nd.c.kind == "gpu", nd.c.present.is_(True),
            nd.c.driver_version != ""))})  # fmt: skip
        model = ""
        if c.prom.url:  # the CPU model is the agent's hw_node_info; without Prometheus: count
            info = c.prom.instant(f'hw_node_info{{node="{prom.escape(name)}"}}', clock())
            model = next((lbl.get("cpu_model", "") for lbl, _ in info), "")
        runtime = str(row.container_runtime)
        return {
            "name": row.name, "health": row.status,
            "cpu": f"{row.cpu_count} X {model}" if model else str(row.cpu_count),
            "memory": row.memory, "os": row.os_image, "gpu_driver_version": ",".join(drivers),
            "static_gpu_details": f"{listed['gpu_count']} X {listed['gpu_name']}" if listed
            else "",
            "kubelet_version": row.kubelet_version,
            "containerd_version": runtime.removeprefix("containerd://"),
            "cluster_name": c.name,
        }  # fmt: skip

    def overview(conn: Connection, name: str, query: dict[str, str], c: Scope
            ) -> dict[str, Any]:  # fmt: skip
        """clusters/overview (model.GpuClusterOverview): GPU nodes by health (faulty: not
        Ready, or tainted) and by idleness, allocation rate and utilization (percent),
        RDMA bytes/s, and the storage scan's space (the volumes' capacity and what their
        claims use; inodes and bandwidth are not measured: 0)."""
        n = c.tables.nodes
        rows = [r for r in conn.execute(select(n).where(n.c.deleted.is_(False)))
                if sum(int(v) for v in (r.gpu_capacity or {}).values())]  # fmt: skip
        faulty = sum(1 for r in rows if r.status != "Ready" or r.taints)
        per_node: dict[str, list[int]] = {}
        allocation = gpu_allocation(conn, "", {}, c)
        for a in allocation:
            pair = per_node.setdefault(a["node"], [0, 0])
            pair[0] += a["allocated"]
            pair[1] += a["capacity"]
        idle = sum(1 for a, c in per_node.values() if a == 0)
        busy = sum(1 for a, c in per_node.values() if a >= c)
        at = clock()
        space = {"total_space": 0.0, "used_space": 0.0, "usage_percentage": 0.0}
        if c.storage is not None:
            space.update(c.storage())
        return {
            **space, "total_inodes": 0.0, "used_inodes": 0.0, "inodes_usage_percentage": 0.0,
            "read_bandwidth": 0.0, "write_bandwidth": 0.0,
            "total_tx": c.prom.scalar(prom.RDMA_TX, at),
            "total_rx": c.prom.scalar(prom.RDMA_RX, at),
            "totalNodes": len(rows), "healthyNodes": len(rows) - faulty, "faultyNodes": faulty,
            "fullyIdleNodes": idle, "partiallyIdleNodes": len(per_node) - idle - busy,
            "busyNodes": busy, "allocationRate": _allocation_percent(conn, c, allocation),
            "utilization": c.prom.scalar(prom.UTILIZATION, at),
        }  # fmt: skip

    def workload_list(conn: Connection, name: str, query: dict[str, str], c: Scope
            ) -> dict[str, Any]:  # fmt: skip
        """workloads?page_num=&page_size=&name=&namespace=&kind=&status=&order_by=
        (WorkloadListResponse of model.WorkloadListItem): top-level workloads, newest
        first, each with its GPUs and its pods' GPU utilization over its life (average,
        p50, p90, p95 of the per-minute mean; the instant value while it runs)."""
        num, size = page(query)
        order = param(query, "order_by") or ""
        if order not in ("", "start_at", "end_at"):
            raise bad(f"order_by={order!r}: start_at or end_at")
        w = c.tables.gpu_workloads
        cond: list[ColumnElement[bool]] = [w.c.parent_uid.is_(None) | (w.c.parent_uid == "")]
        if sub := param(query, "name"):
            cond.append(w.c.name.contains(sub, autoescape=True))
        for col in ("namespace", "kind"):
            if value := param(query, col):
                cond.append(w.c[col] == value)
        rows = list(conn.execute(select(w).where(*cond)))
        if status := param(query, "status"):
            rows = [r for r in rows if workload_status(r) == status]
        key = "ended_at" if order == "end_at" else "created_at"
        rows.sort(key=lambda r: (_ts(getattr(r, key)), r.name), reverse=True)
        names, now = gpu_names(conn, c.tables), clock()
        items = []
        for r in rows[(num - 1) * size : num * size]:
            pods = workload_pods(conn, c.tables, r.uid)
            status = workload_status(r)
            item = {"kind": r.kind, "name": r.name, "namespace": r.namespace, "uid": r.uid,
                    "gpu_allocated": sum(int(p.gpus) for p in pods
                                         if p.running and not p.deleted),
                    "gpu_allocation": gpu_allocation_info(pods, names), "status": status,
                    "status_color": WORKLOAD_COLORS.get(status, ""),
                    "start_at": _ts(r.created_at), "end_at": _ts(r.ended_at or r.updated_at),
                    "source": "k8s"}  # fmt: skip
            item.update(utilization_stats(c, r, pods, status == "Running", now))
            items.append(item)
        return {"data": items, "total": len(rows)}

    def utilization_stats(c: Scope, row: Any, pods: list[Any], running: bool, now: datetime
                          ) -> dict[str, Any]:  # fmt: skip
        """From the agents' gpu_utilization of the GPUs the workload's pods held."""
        stats: dict[str, Any] = {"instant_gpu_utilization": None, "avg_gpu_utilization": 0.0,
                                 "p50_gpu_utilization": 0.0, "p90_gpu_utilization": 0.0,
                                 "p95_gpu_utilization": 0.0}  # fmt: skip
        if not pods:
            return stats
        start = aware(row.created_at) or now
        end = aware(row.ended_at) or now
        seconds = max(60, int((min(end, now) - start).total_seconds()))
        sel = prom.pods_selector(row.namespace, [p.name for p in pods])
        series = f"avg(gpu_utilization{{{sel}}})[{seconds}s:60s]"
        at = min(end, now)
        stats["avg_gpu_utilization"] = c.prom.scalar(f"avg_over_time({series})", at)
        for q, field in ((0.5, "p50"), (0.9, "p90"), (0.95, "p95")):
            stats[f"{field}_gpu_utilization"] = c.prom.scalar(
                f"quantile_over_time({q}, {series})", at)  # fmt: skip
        if running:
            stats["instant_gpu_utilization"] = c.prom.scalar(
                f"avg(gpu_utilization{{{sel}}})", now)  # fmt: skip
        return stats

    def heatmap(conn: Connection, name: str, query: dict[str, str], c: Scope
            ) -> dict[str, Any]:  # fmt: skip
        """clusters/gpuHeatmap: every GPU of the 5 nodes with the highest mean, for
        utilization, temperature and power, with the original's axes and units (its
        items under a capital `Data`, as its struct has no json tag there)."""
        now, out = clock(), {}
        axes = {"utilization": (1, "%", 100, 0), "power": (2, "W", 850, 0),
                "temperature": (3, "℃", 110, 20)}  # fmt: skip
        for key, expr in prom.HEATMAP.items():
            gpus = [(lbl.get("node", ""), lbl.get("gpu_id", ""), v)
                    for lbl, v in c.prom.instant(expr, now)]  # fmt: skip
            by_node: dict[str, list[float]] = {}
            for node, _, v in gpus:
                by_node.setdefault(node, []).append(v)
            means = sorted(by_node, key=lambda n: (-sum(by_node[n]) / len(by_node[n]), n))
            top = set(means[:5])  # topk(5, avg by (node) (...)), then those nodes' GPUs
            items = sorted(({"node_name": node, "gpu_id": int(gpu) if gpu.isdigit() else 0,
                             "value": v} for node, gpu, v in gpus if node in top),
                           key=lambda i: (i["node_name"], i["gpu_id"]))  # fmt: skip
            serial, unit, ymax, ymin = axes[key]
            out[key] = {"serial": serial, "unit": unit, "yaxis_max": ymax, "yaxis_min": ymin,
                        "Data": items}  # fmt: skip
        return out

    def consumers(conn: Connection, name: str, query: dict[str, str], c: Scope
            ) -> dict[str, Any]:  # fmt: skip
        """clusters/consumers?page_num=&page_size= (ClusterConsumersResponse of
        model.TopLevelGpuResource): running top-level workloads, their GPU request and
        their pods' GPU utilization now."""
        num, size = page(query)
        w = c.tables.gpu_workloads
        top = w.c.parent_uid.is_(None) | (w.c.parent_uid == "")
        rows = [r for r in conn.execute(select(w).where(top, w.c.deleted.is_(False))
                                        .order_by(w.c.created_at, w.c.name))
                if workload_status(r) == "Running"]  # fmt: skip
        items, now = [], clock()
        for r in rows[(num - 1) * size : num * size]:
            pods = [
                p.name for p in workload_pods(conn, c.tables, r.uid) if p.running and not p.deleted
            ]
            util = c.prom.scalar(f"avg(gpu_utilization{{"
                                  f"{prom.pods_selector(r.namespace, pods)}}})", now) \
                if pods else 0.0  # fmt: skip
            items.append({"kind": r.kind, "name": r.name, "namespace": r.namespace,
                          "uid": r.uid, "stat": {"gpu_request": int(r.gpu_request),
                                                 "gpu_utilization": util},
                          "pods": None, "source": "k8s"})  # fmt: skip
        return {"data": items, "total": len(rows)}

    def node_gpu_devices(conn: Connection, name: str, query: dict[str, str], c: Scope
            ) -> dict[str, Any]:  # fmt: skip
        """nodes/{name}/gpuDevices (NodeGPUDevicesResponse of model.GpuDeviceInfo): the
        node's GPUs as its agent reported them, with their utilization, temperature,
        power and memory now."""
        nd = c.tables.node_devices
        if (
            conn.execute(select(c.tables.nodes.c.name).where(c.tables.nodes.c.name == name)).first()
            is None
        ):
            raise ApiError(404, 4004, f"node not found: {name!r}")
        mine = (nd.c.node == name, nd.c.kind == "gpu", nd.c.present.is_(True))
        gpus = list(conn.execute(select(nd).where(*mine).order_by(nd.c.idx)))
        now, values = clock(), {}
        for key, expr in prom.node_gpus(name).items():
            values[key] = {(lbl.get("vendor", ""), lbl.get("gpu_index", "")): v
                           for lbl, v in c.prom.instant(expr, now)}  # fmt: skip
        devices = []
        for g in gpus:
            k = (g.vendor, str(g.idx))
            memory = values["memory"].get(k)
            devices.append({"deviceId": int(g.idx), "model": g.model,
                            "memory": f"{int(memory // 2**30)}GB" if memory is not None else "",
                            "utilization": values["utilization"].get(k, 0.0),
                            "temperature": values["temperature"].get(k, 0.0),
                            "power": values["power"].get(k, 0.0)})  # fmt: skip
        return {"node_name": name, "cluster_name": c.name, "devices": devices}

    def workload_metrics(conn: Connection, name: str, query: dict[str, str], c: Scope
            ) -> dict[str, Any]:  # fmt: skip
        """workloads/{uid}/metrics?start=&end=&step= (map of model.MetricsGraph): its GPUs'
        utilization, memory and power per node (the original's three), and beyond the
        original: memory and power per pod and summed, TCP bytes/s and median RTT from its
        pods' nodes to its own pods."""
        start, end = integer(query, "start"), integer(query, "end")
        step = integer(query, "step", 60)
        if step <= 0:
            raise bad(f"step={step}: must be 1 or more")
        row = _workload(conn, c.tables, name)
        pods = workload_pods(conn, c.tables, name)
        # the agents name a remote pod's workload by its top owner
        tops = {p.workload_uid for p in pods if p.workload_uid}
        top = _workload(conn, c.tables, next(iter(tops))) if len(tops) == 1 else row
        out: dict[str, Any] = {}
        graphs = prom.workload_graphs(row.namespace, top.name, [p.name for p in pods],
                                      sorted({p.node for p in pods if p.node}), step)  # fmt: skip
        for title, (serial, unit, expr) in graphs.items():
            try:
                series = c.prom.graph(expr, start, end, step) if pods else []
            except prom.TooManyPoints as exc:
                raise bad(str(exc)) from None
            out[title] = {"serial": serial, "series": series, "config": {"y_axis_unit": unit}}
        return out

    def node_gpu_metrics(conn: Connection, name: str, query: dict[str, str], c: Scope
            ) -> dict[str, Any]:  # fmt: skip
        """nodes/{name}/gpuMetrics?start=&end=&step= (NodeGPUMetricsResponse): its GPUs'
        utilization (one series per GPU) and its allocation rate, percent."""
        start, end = integer(query, "start"), integer(query, "end")
        step = integer(query, "step", 60)
        if step <= 0:
            raise bad(f"step={step}: must be 1 or more")
        if (
            conn.execute(select(c.tables.nodes.c.name).where(c.tables.nodes.c.name == name)).first()
            is None
        ):
            raise ApiError(404, 4004, f"node not found: {name!r}")
        try:
            return {key: {"serial": 0, "series": c.prom.graph(expr, start, end, step),
                          "config": {"y_axis_unit": "%"}}
                    for key, expr in prom.node_history(name).items()}  # fmt: skip
        except prom.TooManyPoints as exc:
            raise bad(str(exc)) from None

    table: Table = [
        *(extra or []),
        (re.compile(r"^nodes/([^/]+)/gpuMetrics$"), node_gpu_metrics),
        (re.compile(r"^nodes/([^/]+)/workloadsHistory$"), node_workloads_history),
        (re.compile(r"^workloads/([^/]+)/metrics$"), workload_metrics),
        (re.compile(r"^nodes/([^/]+)/gpuDevices$"), node_gpu_devices),
        (re.compile(r"^(clusters/allocation)$"), cluster_allocation),
        (re.compile(r"^(gpu-aggregation/cluster/hourly-stats)$"), hourly_stats),
        (re.compile(r"^(clusters/gpuHeatmap)$"), heatmap),
        (re.compile(r"^(clusters/consumers)$"), consumers),
        (re.compile(r"^(clusters/overview)$"), overview),
        (re.compile(r"^(workloads)$"), workload_list),
        (re.compile(r"^(workloadMetadata)$"), workload_metadata),
        (re.compile(r"^(workloads/hierarchy)$"), hierarchy_query),
        (re.compile(r"^workloads/([^/]+)/hierarchy$"), hierarchy_by_uid),
        (re.compile(r"^workloads/([^/]+)$"), workload_detail),
        (re.compile(r"^(nodes)$"), node_list),
        (re.compile(r"^(nodes/gpuUtilization)$"), utilization),
        (re.compile(r"^(nodes/gpuUtilizationHistory)$"), history),
        (re.compile(r"^(nodes/gpuAllocation)$"), gpu_allocation),
        (re.compile(r"^nodes/([^/]+)/devices$"), node_devices),
        (re.compile(r"^nodes/([^/]+)/devices/changelog$"), changelog),
        (re.compile(r"^devices/([^/]+)/history$"), device_history),
        (re.compile(r"^nodes/([^/]+)/workloads$"), node_workloads),
        (re.compile(r"^nodes/([^/]+)$"), node_detail),
    ]

    def route(rest: str, query: dict[str, str]) -> Response:
        try:
            c = scopes(param(query, "cluster") or None)
        except ApiError as e:
            return error(e)
        if rest == "gpu-aggregation/clusters":
            return ok(clusters() if clusters is not None else [c.name])
        for pattern, fn in table:
            if m := pattern.match(rest):
                try:
                    return ok(read(partial(fn, name=m.group(1), query=query, c=c)))
                except ApiError as e:
                    return error(e)
                except SQLAlchemyError as exc:
                    return error(ApiError(503, 5003, "database unavailable: "
                                          f"{type(exc).__name__}"))  # fmt: skip
                except prom.PromError as exc:
                    return error(ApiError(503, 5003, str(exc)))
        return error(ApiError(404, 4004, f"no route {rest!r}"))

    return route
