"""The reporters' collector protocol, stored: every node's events in node_events, once per
(node, agent instance, seq), and the GPUs a container_start names in pod_resources (source
"agent"). Each agent process numbers its events from 1 (its instance: the stream's
lens-agent-instance, protocol/collector_server.py), so a restarted agent's events are rows
beside its predecessor's, and a reporter resumes after the last of its own instance.

An event is acknowledged to its reporter only once its row is committed, so while the
database is down the reporter keeps it in its replay buffer (and the recorder's queue
holds what it accepted); nothing is lost within the two bounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, and_, bindparam, func, or_, select, tuple_

from lens_ebpf.protocol.collector_server import EventReceiver, Seqs, bounded, keep
from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.jsondict import to_dict
from lens_ebpf.protocol.stream_auth import Claim
from lens_ebpf.recorder.inputs import without_nul
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import Op, Writer, insert_rows

# device nodes that are GPUs: NVIDIA's /dev/nvidiaN, AMD's DRI render nodes
GPU_DEVICES = (
    (re.compile(r"^/dev/nvidia\d+$"), "nvidia.com/gpu"),
    (re.compile(r"^/dev/dri/renderD\d+$"), "amd.com/gpu"),
)


def event_row(cluster: str, node: str, ev: pb.Event, instance: str = "") -> dict[str, Any]:
    """The node_events row of one reporter event (a gap has no seq)."""
    kind = ev.WhichOneof("payload") or "unknown"
    payload = to_dict(getattr(ev, kind)) if kind != "unknown" else {}
    ident = payload.get("identity") or {}
    at = (
        datetime.fromtimestamp(ev.ts_unix_nano / 1e9, UTC) if ev.ts_unix_nano else datetime.now(UTC)
    )
    return {
        "cluster": cluster,
        "node": node,
        "instance": instance,
        "seq": None if kind == "gap" else ev.seq,
        "at": at,
        "kind": kind,
        "namespace": ident.get("namespace", ""),
        "pod": ident.get("pod", ""),
        "pod_uid": ident.get("pod_uid", ""),
        "container": ident.get("container", ""),
        "payload": payload,
    }


def agent_resources(cluster: str, ev: pb.Event, at: datetime) -> list[dict[str, Any]]:
    """pod_resources rows from a container_start's device list (GPUs only)."""
    if ev.WhichOneof("payload") != "container_start":
        return []
    ident = ev.container_start.identity
    if not ident.pod_uid:
        return []
    by_resource: dict[str, list[str]] = {}
    for dev in ev.container_start.devices:
        for pattern, resource in GPU_DEVICES:
            if pattern.match(dev):
                by_resource.setdefault(resource, []).append(dev)
    return [
        {
            "cluster": cluster,
            "pod_uid": ident.pod_uid,
            "container": ident.container,
            "source": "agent",
            "resource": r,
            "count": len(devs),
            "model": "",
            "devices": sorted(devs),
            "updated_at": at,
        }
        for r, devs in sorted(by_resource.items())
    ]


# a device record's fields as node_devices stores them (the proto's name -> the column)
DEVICE_COLUMNS = {
    "device_kind": "kind",
    "slot": "slot",
    "key": "key",
    "index": "idx",
    "vendor": "vendor",
    "model": "model",
    "uuid": "uuid",
    "serial": "serial",
    "bdf": "bdf",
    "driver_version": "driver_version",
    "firmware_version": "firmware_version",
    "vbios_version": "vbios_version",
    "port_state": "port_state",
    "link_layer": "link_layer",
    "rate": "rate",
    "retired_pages_pending": "retired_pages_pending",
    "row_remap_pending": "row_remap_pending",
    "row_remap_failure": "row_remap_failure",
    "recovery_action": "recovery_action",
    "holder": "holder",
}
# what a change of identity or state is (not the index the agent numbers GPUs by)
TRACKED = [c for c in DEVICE_COLUMNS.values() if c not in ("kind", "slot", "idx")]


def _text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


@dataclass
class DeviceUpdate:
    """The device records one device_change or device_inventory brings."""

    cluster: str
    node: str
    at: datetime
    records: list[dict[str, Any]]
    inventory: bool  # the node's whole inventory: what it does not list is gone
    gone: set[str]  # slots a change says disappeared


def device_update(cluster: str, node: str, ev: pb.Event, at: datetime) -> DeviceUpdate | None:
    """The device records of a device_change or device_inventory; None for other events."""
    kind = ev.WhichOneof("payload")
    if kind == "device_change":
        msgs, inventory = [ev.device_change], False
    elif kind == "device_inventory":
        msgs, inventory = list(ev.device_inventory.devices), True
    else:
        return None
    gone = (
        {ev.device_change.slot}
        if kind == "device_change" and ev.device_change.change == "disappeared"
        else set()
    )
    records = [{col: getattr(m, name) for name, col in DEVICE_COLUMNS.items()} for m in msgs]
    return DeviceUpdate(cluster, node, at, records, inventory, gone)


def apply_devices(conn: Connection, updates: list[DeviceUpdate]) -> int:
    """node_devices and device_changelog for updates, in order: each record compared with
    the stored one (or one an earlier update of the batch wrote), one changelog row per
    field that differs (present: when it appeared or went); an inventory marks the
    node's devices it no longer lists as gone. The same update twice writes nothing the
    second time, so a restart of either side loses and invents nothing. One read (every
    device of a node with an inventory in the batch, else the devices the batch names),
    then multi-row writes; the changelog rows added."""
    clusters = dict.fromkeys(u.cluster for u in updates)  # each its own, in order
    return sum(_apply_devices(conn, c, [u for u in updates if u.cluster == c]) for c in clusters)


def _apply_devices(conn: Connection, cluster: str, updates: list[DeviceUpdate]) -> int:
    """apply_devices for one cluster's updates."""
    nd, cl = t.node_devices, t.device_changelog
    whole = {u.node for u in updates if u.inventory}
    named = sorted(
        {
            (cluster, u.node, r["kind"], r["slot"])
            for u in updates
            if u.node not in whole
            for r in u.records
        }
    )
    # both by the unique key's leading columns (cluster, node[, kind, slot])
    wanted = [
        c
        for c in (
            and_(nd.c.cluster == cluster, nd.c.node.in_(sorted(whole))) if whole else None,
            tuple_(nd.c.cluster, nd.c.node, nd.c.kind, nd.c.slot).in_(named) if named else None,
        )
        if c is not None
    ]
    # (node, kind, slot) -> the row as it stands, with its id (None: inserted by this batch)
    state: dict[tuple[str, str, str], dict[str, Any]] = (
        {
            (r.node, r.kind, r.slot): dict(r._mapping)
            for r in conn.execute(select(nd).where(or_(*wanted)))
        }
        if wanted
        else {}
    )
    changed: dict[tuple[str, str, str], dict[str, Any]] = {}
    log: list[dict[str, Any]] = []

    def entry(node: str, at: datetime, row: dict[str, Any], field: str, old: Any, new: Any) -> None:
        log.append(
            {
                "cluster": cluster,
                "at": at,
                "node": node,
                "kind": row["kind"],
                "slot": row["slot"],
                "device_key": row["key"],
                "field": field,
                "old_value": _text(old),
                "new_value": _text(new),
            }
        )

    for u in updates:
        for rec in u.records:
            key = (u.node, rec["kind"], rec["slot"])
            present = rec["slot"] not in u.gone
            old = state.get(key)
            if old is None:
                row = {
                    "id": None,
                    "cluster": cluster,
                    "node": u.node,
                    "present": present,
                    "first_seen": u.at,
                    "last_seen": u.at,
                    **rec,
                }
                state[key] = changed[key] = row
                if present:
                    entry(u.node, u.at, rec, "present", "", True)
                continue
            for c in TRACKED:
                if old[c] != rec[c]:
                    entry(u.node, u.at, rec, c, old[c], rec[c])
            if old["present"] != present:
                entry(u.node, u.at, rec, "present", old["present"], present)
            old.update(present=present, last_seen=u.at, **rec)
            changed[key] = old
        if u.inventory:
            listed = {(u.node, r["kind"], r["slot"]) for r in u.records}
            for key, old in state.items():
                if key[0] == u.node and key not in listed and old["present"]:
                    entry(u.node, u.at, old, "present", True, False)
                    old["present"] = False
                    changed[key] = old
    inserts = [
        {k: v for k, v in row.items() if k != "id"} for row in changed.values() if row["id"] is None
    ]
    # bound as v_<column> (a bind parameter may not take its column's name)
    skip = ("id", "first_seen")
    updates_ = [
        {**{f"v_{k}": v for k, v in row.items() if k not in skip}, "row_id": row["id"]}
        for row in changed.values()
        if row["id"] is not None
    ]
    insert_rows(conn, nd, inserts)
    if updates_:
        cols: dict[str, Any] = {c[2:]: bindparam(c) for c in updates_[0] if c != "row_id"}
        conn.execute(nd.update().where(nd.c.id == bindparam("row_id")).values(cols), updates_)
    insert_rows(conn, cl, log)
    return len(log)


def last_seqs(conn: Connection) -> Seqs:
    """The highest stored sequence number per "cluster/node" and agent instance: where each
    reporter resumes; a node's instances in the order they last stored (their newest row),
    its newest INSTANCES_KEPT (the collector keeps no more)."""
    ne = t.node_events
    newest = func.max(ne.c.id)
    rows = conn.execute(
        select(ne.c.cluster, ne.c.node, ne.c.instance, func.max(ne.c.seq))
        .where(ne.c.seq.is_not(None))
        .group_by(ne.c.cluster, ne.c.node, ne.c.instance)
        .order_by(newest)
    )
    out: Seqs = {}
    for c, node, instance, seq in rows:
        out.setdefault(source(str(c), str(node)), {})[str(instance)] = int(str(seq))
    return bounded(out)


def source(cluster: str, node: str) -> str:
    """A reporter's key: its cluster and node ("/" is in neither name)."""
    return f"{cluster}/{node}"


class NodeEvents(EventReceiver):
    """A collector whose events go through the recorder's writer."""

    def __init__(self, writer: Writer, last: Seqs, home: str = "local") -> None:
        super().__init__(None, last)
        self.writer = writer
        self.home = home  # the cluster of a reporter that does not say its own
        self.committed = bounded(last)  # as last, once committed
        self.stored: dict[str, int] = {}  # kind -> events committed

    def _source(self, meta: dict[str, str]) -> str:
        """ "cluster/node": the cluster its reporter says (node.cluster), else the home one."""
        return source(meta.get("lens-cluster") or self.home, meta.get("lens-node", "unknown"))

    def _claim(self, meta: dict[str, str]) -> Claim:
        return Claim(meta.get("lens-node", "unknown"), meta.get("lens-cluster") or self.home)

    def _held(self, node: str, instance: str) -> int:
        return self.committed.get(node, {}).get(instance, 0)

    def _store(self, node: str, instance: str, ev: pb.Event) -> bool:
        key = node
        cluster, _, node = key.partition("/")
        # a NUL in any of the agent's strings made U+FFFD: PostgreSQL's text and jsonb hold
        # none, and the refused write would hold the node's acknowledgement back for good
        row = without_nul(event_row(cluster, node, ev, instance))
        update = device_update(cluster, node, ev, row["at"])
        if update is not None:
            update.records = without_nul(update.records)
            update.gone = {without_nul(slot) for slot in update.gone}
        item = (row, without_nul(agent_resources(cluster, ev, row["at"])), update)

        def done() -> None:  # on the writer's thread, once committed
            with self._lock:
                seq = row["seq"]
                if seq is not None and seq > self._held(key, instance):
                    keep(self.committed, key, instance, seq)
                self.stored[row["kind"]] = self.stored.get(row["kind"], 0) + 1
            self._changed(key, instance)

        return self.writer.submit(
            Op(
                "node_events",
                lambda conn: self.write_many(conn, [item]),
                done,
                bulk=self.write_many,
                item=item,
            )
        )

    def write_many(self, conn: Connection, items: list[Any]) -> None:
        """Events in one multi-row insert (a replayed (node, instance, seq) skipped); then,
        for those new, their GPU resources (one multi-row upsert) and device changes, in
        order."""
        ne = t.node_events
        rows = [row for row, _, _ in items if row["seq"] is not None]
        new: set[tuple[str, str, str, int]] = set()
        if rows:
            key = ("cluster", "node", "instance", "seq")
            new = {
                (r.cluster, r.node, r.instance, r.seq)
                for r in insert_rows(conn, ne, rows, keys=list(key), returning=key)
            }
        resources: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        devices: list[DeviceUpdate] = []
        for row, res, update in items:
            if row["seq"] is None:
                conn.execute(ne.insert().values(**row))
            elif (row["cluster"], row["node"], row["instance"], row["seq"]) not in new:
                continue  # a replay of a stored event: its effects are stored too
            for r in res:  # the last for a container wins, as one by one
                resources[(r["cluster"], r["pod_uid"], r["container"], r["source"])] = r
            if update is not None:
                devices.append(update)
        if devices:
            apply_devices(conn, devices)
        if resources:
            insert_rows(
                conn,
                t.pod_resources,
                list(resources.values()),
                keys=["cluster", "pod_uid", "container", "source"],
                update=True,
            )
