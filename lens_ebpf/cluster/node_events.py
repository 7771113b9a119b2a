"""The reporters' collector protocol, stored: every node's events in node_events, once per
(node, seq), and the GPUs a container_start names in pod_resources (source "agent").

An event is acknowledged to its reporter only once its row is committed, so while the
database is down the reporter keeps it in its replay buffer (and the recorder's queue
holds what it accepted); nothing is lost within the two bounds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from google.protobuf.json_format import MessageToDict
from sqlalchemy import Connection, func, select

from lens_ebpf.api.collector_server import Collector
from lens_ebpf.api.gen import lens_pb2 as pb
from lens_ebpf.cluster import schema as t
from lens_ebpf.cluster.store import Op, Writer, dialect_insert

# device nodes that are GPUs: NVIDIA's /dev/nvidiaN, AMD's DRI render nodes
GPU_DEVICES = (
    (re.compile(r"^/dev/nvidia\d+$"), "nvidia.com/gpu"),
    (re.compile(r"^/dev/dri/renderD\d+$"), "amd.com/gpu"),
)


def event_row(node: str, ev: pb.Event) -> dict[str, Any]:
    """The node_events row of one reporter event (a gap has no seq)."""
    kind = ev.WhichOneof("payload") or "unknown"
    payload = MessageToDict(getattr(ev, kind), preserving_proto_field_name=True) \
        if kind != "unknown" else {}  # fmt: skip
    ident = payload.get("identity") or {}
    at = datetime.fromtimestamp(ev.ts_unix_nano / 1e9, UTC) if ev.ts_unix_nano else \
        datetime.now(UTC)  # fmt: skip
    return {
        "node": node, "seq": None if kind == "gap" else ev.seq, "at": at, "kind": kind,
        "namespace": ident.get("namespace", ""), "pod": ident.get("pod", ""),
        "pod_uid": ident.get("pod_uid", ""), "container": ident.get("container", ""),
        "payload": payload,
    }  # fmt: skip


def agent_resources(ev: pb.Event, at: datetime) -> list[dict[str, Any]]:
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
    return [{"pod_uid": ident.pod_uid, "container": ident.container, "source": "agent",
             "resource": r, "count": len(devs), "model": "", "devices": sorted(devs),
             "updated_at": at} for r, devs in sorted(by_resource.items())]  # fmt: skip


# a device record's fields as node_devices stores them (the proto's name -> the column)
DEVICE_COLUMNS = {"device_kind": "kind", "slot": "slot", "key": "key", "index": "idx",
                  "vendor": "vendor", "model": "model", "uuid": "uuid", "serial": "serial",
                  "bdf": "bdf", "driver_version": "driver_version",
                  "firmware_version": "firmware_version", "vbios_version": "vbios_version",
                  "port_state": "port_state", "link_layer": "link_layer", "rate": "rate",
                  "retired_pages_pending": "retired_pages_pending",
                  "row_remap_pending": "row_remap_pending",
                  "row_remap_failure": "row_remap_failure"}  # fmt: skip
# what a change of identity or state is (not the index the agent numbers GPUs by)
TRACKED = [c for c in DEVICE_COLUMNS.values() if c not in ("kind", "slot", "idx")]


def _text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def device_writes(node: str, ev: pb.Event, at: datetime) -> Callable[[Connection], int] | None:
    """The node_devices and device_changelog writes of a device_change or device_inventory:
    each record compared with the stored one, one changelog row per field that differs
    (present: when it appeared or went). An inventory also marks the node's devices it
    no longer lists as gone. The same event twice writes nothing the second time, so a
    restart of either side loses and invents nothing. None for other events; the write
    returns the changelog rows it added."""
    kind = ev.WhichOneof("payload")
    if kind == "device_change":
        msgs, inventory = [ev.device_change], False
    elif kind == "device_inventory":
        msgs, inventory = list(ev.device_inventory.devices), True
    else:
        return None
    gone = {ev.device_change.slot} if kind == "device_change" and \
        ev.device_change.change == "disappeared" else set()  # fmt: skip
    records = [{col: getattr(m, name) for name, col in DEVICE_COLUMNS.items()} for m in msgs]
    nd, cl = t.node_devices, t.device_changelog

    def write(conn: Connection) -> int:
        added = 0

        def log(row: Any, field: str, old: Any, new: Any) -> None:
            nonlocal added
            conn.execute(cl.insert().values(at=at, node=node, kind=row["kind"],
                                            slot=row["slot"], device_key=row["key"],
                                            field=field, old_value=_text(old),
                                            new_value=_text(new)))  # fmt: skip
            added += 1

        q = select(nd).where(nd.c.node == node)
        if not inventory:  # a change: its own row is all it compares with
            q = q.where(nd.c.slot.in_([r["slot"] for r in records]))
        stored = {(r.kind, r.slot): r._mapping for r in conn.execute(q)}
        for rec in records:
            old = stored.get((rec["kind"], rec["slot"]))
            present = rec["slot"] not in gone
            if old is None:
                conn.execute(nd.insert().values(node=node, present=present, first_seen=at,
                                                last_seen=at, **rec))  # fmt: skip
                if present:
                    log(rec, "present", "", True)
                continue
            diff = [c for c in TRACKED if old[c] != rec[c]]
            for c in diff:
                log(rec, c, old[c], rec[c])
            if old["present"] != present:
                log(rec, "present", old["present"], present)
            conn.execute(nd.update().where(nd.c.id == old["id"]).values(
                present=present, last_seen=at, **rec))  # fmt: skip
        if inventory:
            listed = {(r["kind"], r["slot"]) for r in records}
            for slot, old in stored.items():
                if slot not in listed and old["present"]:
                    log(old, "present", True, False)
                    conn.execute(nd.update().where(nd.c.id == old["id"]).values(present=False))
        return added

    return write


def last_seqs(conn: Connection) -> dict[str, int]:
    """The highest stored sequence number per node: where each reporter resumes."""
    ne = t.node_events
    rows = conn.execute(select(ne.c.node, func.max(ne.c.seq)).group_by(ne.c.node))
    return {str(node): int(str(seq)) for node, seq in rows if seq is not None}


class NodeEvents(Collector):
    """A collector whose events go through the recorder's writer."""

    def __init__(self, writer: Writer, last: dict[str, int]) -> None:
        super().__init__(None, last)
        self.writer = writer
        self.committed = dict(last)
        self.stored: dict[str, int] = {}  # kind -> events committed

    def _held(self, node: str) -> int:
        return self.committed.get(node, 0)

    def _store(self, node: str, ev: pb.Event) -> bool:
        row = event_row(node, ev)
        item = (row, agent_resources(ev, row["at"]), device_writes(node, ev, row["at"]))

        def done() -> None:  # on the writer's thread, once committed
            with self._lock:
                if row["seq"] is not None:
                    self.committed[node] = max(self.committed.get(node, 0), row["seq"])
                self.stored[row["kind"]] = self.stored.get(row["kind"], 0) + 1
            self._changed(node)

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
        """Events in one multi-row insert (a replayed (node, seq) skipped); then, for those
        new, their GPU resources (one multi-row upsert) and device changes, in order."""
        ne = t.node_events
        rows = [row for row, _, _ in items if row["seq"] is not None]
        new: set[tuple[str, int]] = set()
        if rows:
            stmt = (dialect_insert(conn, ne).values(rows)
                    .on_conflict_do_nothing(index_elements=["node", "seq"])
                    .returning(ne.c.node, ne.c.seq))  # fmt: skip
            new = {(r.node, r.seq) for r in conn.execute(stmt)}
        resources: dict[tuple[str, str, str], dict[str, Any]] = {}
        for row, res, devices in items:
            if row["seq"] is None:
                conn.execute(ne.insert().values(**row))
            elif (row["node"], row["seq"]) not in new:
                continue  # a replay of a stored event: its effects are stored too
            for r in res:  # the last for a container wins, as one by one
                resources[(r["pod_uid"], r["container"], r["source"])] = r
            if devices is not None:
                devices(conn)
        if resources:
            pr = t.pod_resources
            stmt = dialect_insert(conn, pr).values(list(resources.values()))
            keep = ["pod_uid", "container", "source"]
            rest = {c: stmt.excluded[c] for c in next(iter(resources.values())) if c not in keep}
            conn.execute(stmt.on_conflict_do_update(index_elements=keep, set_=rest))
