"""The nodes' devices as their agents reported them: what each node holds, what changed,
and one device's history wherever it sat (its places, changes, holders and faults)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, or_, select, tuple_

from lens_ebpf.core.times import aware, utc
from lens_ebpf.recorder.errors import NotFound
from lens_ebpf.recorder.ingest.node_events import DEVICE_COLUMNS
from lens_ebpf.recorder.store.schema import Scoped


def _device(row: Any) -> dict[str, Any]:
    """A node_devices row as the device routes answer it: the agent's record under its
    proto field names (kind for device_kind), where and when it was seen."""
    rec = {
        ("kind" if name == "device_kind" else name): getattr(row, col)
        for name, col in DEVICE_COLUMNS.items()
    }
    return {
        **rec,
        "present": row.present,
        "first_seen": int(utc(row.first_seen).timestamp()),
        "last_seen": int(utc(row.last_seen).timestamp()),
    }


def _change(row: Any) -> dict[str, Any]:
    return {
        "time": int(utc(row.at).timestamp()),
        "node": row.node,
        "kind": row.kind,
        "slot": row.slot,
        "device_key": row.device_key,
        "field": row.field,
        "old": row.old_value,
        "new": row.new_value,
    }


def node_devices(conn: Connection, t: Scoped, name: str) -> dict[str, Any]:
    """The node's GPUs and RDMA ports as its agent last reported them (`present` false for
    one that went)."""
    nd = t.node_devices
    rows = list(
        conn.execute(select(nd).where(nd.c.node == name).order_by(nd.c.kind, nd.c.idx, nd.c.slot))
    )
    if not rows:
        raise NotFound(f"no devices known for node {name!r}")
    return {"node_name": name, "devices": [_device(r) for r in rows]}


def changelog(
    conn: Connection, t: Scoped, name: str, since: datetime | None, num: int, size: int
) -> dict[str, Any]:
    """One row per field that changed on the node (since a time), oldest first, one page."""
    cl = t.device_changelog
    cond = [cl.c.node == name] + ([cl.c.at >= since] if since is not None else [])
    known = conn.execute(
        select(func.count()).select_from(t.node_devices).where(t.node_devices.c.node == name)
    ).scalar_one()
    if not known:
        raise NotFound(f"no devices known for node {name!r}")
    total = conn.execute(select(func.count()).select_from(cl).where(*cond)).scalar_one()
    rows = conn.execute(
        select(cl).where(*cond).order_by(cl.c.at, cl.c.id).offset((num - 1) * size).limit(size)
    )
    return {"data": [_change(r) for r in rows], "total": int(total)}


FAULTS_MAX = 1000  # the newest faults a history lists, per place the device sat


def _arrived(conn: Connection, t: Scoped, place: Any, serial: str) -> datetime:
    """Since when this device sits in this place: its serial's arrival in the slot, or
    the slot's first report."""
    cl = t.device_changelog
    arrived: datetime | None = conn.execute(
        select(func.max(cl.c.at)).where(
            cl.c.node == place.node,
            cl.c.slot == place.slot,
            cl.c.field == "serial",
            cl.c.new_value == serial,
        )
    ).scalar_one_or_none()
    first = utc(place.first_seen)
    return max(first, utc(arrived)) if arrived else first


def _holders(conn: Connection, t: Scoped, place: Any, serial: str) -> list[dict[str, Any]]:
    """The pods the kubelet gave this GPU while it sat in this place, oldest first, each
    {"namespace", "pod", "workload" (its top owner, kind/name, where the service knows
    the pod), "from", "to" (unix seconds; to null while it holds the GPU)}: from the
    holder changes its agent reported in the slot, and the holder now."""
    cl = t.device_changelog
    since = _arrived(conn, t, place, serial)
    changes = list(
        conn.execute(
            select(cl.c.at, cl.c.old_value, cl.c.new_value)
            .where(
                cl.c.node == place.node,
                cl.c.slot == place.slot,
                cl.c.field == "holder",
                cl.c.at >= since,
            )
            .order_by(cl.c.at, cl.c.id)
        )
    )
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
        for r in conn.execute(
            select(p.c.namespace, p.c.name, p.c.created_at, w.c.kind, w.c.name.label("workload"))
            .join(w, w.c.uid == p.c.workload_uid)
            .where(held)
        ):
            owners.setdefault((r.namespace, r.name), []).append(
                (aware(r.created_at) or since, f"{r.kind}/{r.workload}")
            )
    out = []
    for h, begin, end in spans:
        ns, _, pod = h.partition("/")
        # a name used again (a StatefulSet's pod): the pod made before this span began
        made = sorted(o for o in owners.get((ns, pod), []) if o[0] <= begin) or sorted(
            owners.get((ns, pod), [])
        )
        out.append(
            {
                "namespace": ns,
                "pod": pod,
                "workload": made[-1][1] if made else "",
                "from": int(begin.timestamp()),
                "to": int(end.timestamp()) if end else None,
            }
        )
    return out


def _faults(conn: Connection, t: Scoped, place: Any, serial: str) -> list[dict[str, Any]]:
    """The GPU faults its agent reported for this node and slot since this device sat
    there (since its serial arrived in the slot), each with the pod that held the GPU
    then (the newest FAULTS_MAX, oldest first)."""
    since = _arrived(conn, t, place, serial)
    ne = t.node_events
    rows = conn.execute(
        select(ne)
        .where(ne.c.node == place.node, ne.c.kind == "gpu_fault", ne.c.at >= since)
        .order_by(ne.c.at.desc(), ne.c.id.desc())
    )
    out = []
    for r in rows:
        p = r.payload or {}
        if p.get("bdf") != place.slot:
            continue
        out.append(
            {
                "time": int(utc(r.at).timestamp()),
                "node": r.node,
                "slot": place.slot,
                "fault": p.get("fault", ""),
                "code": p.get("code", ""),
                "message": p.get("message", ""),
                "namespace": r.namespace,
                "pod": r.pod,
                "workload": (p.get("identity") or {}).get("workload", ""),
            }
        )
        if len(out) >= FAULTS_MAX:
            break
    return out[::-1]


def device_history(conn: Connection, t: Scoped, name: str) -> dict[str, Any]:
    """Where the device sat (every node and slot), every change it had, every pod the
    kubelet gave it and when, and every fault its agent reported there with the pod that
    held it; looked up by serial, UUID or key."""
    nd, cl = t.node_devices, t.device_changelog
    match = or_(nd.c.serial == name, nd.c.uuid == name, nd.c.key == name)
    places = list(conn.execute(select(nd).where(match).order_by(nd.c.first_seen)))
    if not places:
        raise NotFound(f"no device with serial, UUID or key {name!r}")
    keys = sorted({p.key for p in places})
    # changes recorded under its key, and the change that brought its serial into a slot
    rows = conn.execute(
        select(cl)
        .where(or_(cl.c.device_key.in_(keys), (cl.c.field == "serial") & (cl.c.new_value == name)))
        .order_by(cl.c.at, cl.c.id)
    )
    faults = sorted(
        (f for p in places for f in _faults(conn, t, p, p.serial)), key=lambda f: f["time"]
    )
    holders = sorted(
        (h for p in places for h in _holders(conn, t, p, p.serial)), key=lambda h: h["from"]
    )
    return {
        "serial": name,
        "places": [_device(p) for p in places],
        "changes": [_change(r) for r in rows],
        "holders": holders,
        "faults": faults,
    }
