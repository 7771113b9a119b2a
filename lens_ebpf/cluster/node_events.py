"""The reporters' collector protocol, stored: every node's events in node_events, once per
(node, seq), and the GPUs a container_start names in pod_resources (source "agent").

An event is acknowledged to its reporter only once its row is committed, so while the
database is down the reporter keeps it in its replay buffer (and the recorder's queue
holds what it accepted); nothing is lost within the two bounds.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from google.protobuf.json_format import MessageToDict
from sqlalchemy import Connection, func, select

from lens_ebpf.api.collector_server import Collector
from lens_ebpf.api.gen import lens_pb2 as pb
from lens_ebpf.cluster import schema as t
from lens_ebpf.cluster.store import Op, Writer, insert_new, upsert

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
        resources = agent_resources(ev, row["at"])

        def write(conn: Connection) -> None:
            if row["seq"] is None:
                conn.execute(t.node_events.insert().values(**row))
            else:
                insert_new(conn, t.node_events, row, ["node", "seq"])
            for res in resources:
                upsert(conn, t.pod_resources, res, ["pod_uid", "container", "source"])

        def done() -> None:  # on the writer's thread, once committed
            with self._lock:
                if row["seq"] is not None:
                    self.committed[node] = max(self.committed.get(node, 0), row["seq"])
                self.stored[row["kind"]] = self.stored.get(row["kind"], 0) + 1
            self._changed(node)

        return self.writer.submit(Op("node_events", write, done))
