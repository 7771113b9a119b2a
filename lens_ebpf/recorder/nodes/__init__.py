"""The cluster's nodes: a Node watch kept in the `nodes` table (status from the Ready
condition as Kubernetes reports it, GPU capacity and allocatable per configured resource,
the labels that matter, the node's software), for the node routes. Beside it: gpus.py
(the GPU nodes and their GPUs), allocation.py (the GPUs allocated now), analysis.py
(fragmentation and load balance), overview.py (the cluster at a glance, its heatmap)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from lens_ebpf.k8s.quantity import whole
from lens_ebpf.k8s.reflector import Reflector
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import Op, Writer, upsert

log = logging.getLogger(__name__)

# labels kept: the GPU product (GPU feature discovery, AMD's labeller), the instance type
# and the zone
KEPT_LABELS = re.compile(
    r"^(nvidia\.com/gpu\.(product|count|memory|device-name)|amd\.com/gpu\.("
    r"product-name|family|vram|device-id)|beta\.amd\.com/gpu\.(product-"
    r"name|family)|node\.kubernetes\.io/instance-type|topology\.kubernetes"
    r"\.io/(zone|region))$"
)


def node_status(node: dict[str, Any]) -> str:
    """Ready, NotReady or Unknown, from the Ready condition (no condition: Unknown)."""
    for c in (node.get("status") or {}).get("conditions") or ():
        if isinstance(c, dict) and c.get("type") == "Ready":
            return {"True": "Ready", "False": "NotReady"}.get(str(c.get("status")), "Unknown")
    return "Unknown"


def node_row(node: dict[str, Any], resources: list[str], at: datetime) -> dict[str, Any]:
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    info = status.get("nodeInfo") or {}
    capacity, allocatable = status.get("capacity") or {}, status.get("allocatable") or {}
    address = next(
        (
            a.get("address", "")
            for a in status.get("addresses") or ()
            if isinstance(a, dict) and a.get("type") == "InternalIP"
        ),
        "",
    )
    return {
        "name": meta["name"],
        "address": address,
        "status": node_status(node),
        "gpu_capacity": {r: whole(capacity[r]) for r in resources if r in capacity},
        "gpu_allocatable": {r: whole(allocatable[r]) for r in resources if r in allocatable},
        "labels": {
            k: str(v) for k, v in (meta.get("labels") or {}).items() if KEPT_LABELS.match(k)
        },
        "cpu_count": whole(capacity.get("cpu")),
        "memory_bytes": whole(capacity.get("memory")),
        "memory": str(capacity.get("memory", "")),
        "kernel": str(info.get("kernelVersion", "")),
        "os_image": str(info.get("osImage", "")),
        "kubelet_version": str(info.get("kubeletVersion", "")),
        "container_runtime": str(info.get("containerRuntimeVersion", "")),
        "taints": len((node.get("spec") or {}).get("taints") or ()),
        "deleted": False,
        "updated_at": at,
    }


class NodeTracker:
    """Nodes listed and watched into the `nodes` table through the writer; a node that
    goes is kept, marked deleted."""

    def __init__(
        self,
        list_nodes: Callable[..., Any],
        writer: Writer,
        resources: list[str],
        clock: Callable[[], datetime],
        cluster: str = "local",
        **reflector_opts: Any,
    ) -> None:
        self.writer, self.resources, self.clock = writer, list(resources), clock
        self.cluster = cluster
        self.malformed = 0
        self.known: dict[str, dict[str, Any]] = {}  # name -> the row last written
        self.listed = False  # the first list writes even when empty (marks the gone)
        self.reflector = Reflector("nodes", list_nodes, self.replace, self.event, **reflector_opts)

    def _row(self, node: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return {"cluster": self.cluster, **node_row(node, self.resources, self.clock())}
        except (KeyError, TypeError, AttributeError) as exc:
            self.malformed += 1
            log.warning("recorder: a node the API served is malformed: %r", exc)
            return None

    def _changed(self, row: dict[str, Any]) -> bool:
        """Whether this row differs from the one last written (updated_at aside); a
        re-list or a status heartbeat that changes nothing writes nothing."""
        key = {k: v for k, v in row.items() if k != "updated_at"}
        if self.known.get(row["name"]) == key:
            return False
        self.known[row["name"]] = key
        return True

    def replace(self, items: list[dict[str, Any]]) -> None:
        rows = [r for r in (self._row(n) for n in items) if r is not None]
        names = {r["name"] for r in rows}
        gone = [n for n in self.known if n not in names]
        for name in gone:
            del self.known[name]
        rows = [r for r in rows if self._changed(r)]
        if not rows and not gone and self.listed:
            return
        self.listed = True
        at = self.clock()

        def write(conn: Connection) -> None:
            for row in rows:
                upsert(conn, t.nodes, row, ["cluster", "name"])
            # every node the list does not have is gone (those the service knew before a
            # restart too)
            stale = t.nodes.update().where(
                t.nodes.c.cluster == self.cluster, t.nodes.c.deleted.is_(False)
            )
            if names:
                stale = stale.where(t.nodes.c.name.not_in(names))
            conn.execute(stale.values(deleted=True, updated_at=at))

        self.writer.submit(Op("nodes", write))

    def event(self, kind: str, node: dict[str, Any]) -> None:
        row = self._row(node)
        if row is None:
            return
        if kind == "DELETED":
            name, at = row["name"], row["updated_at"]
            self.known.pop(name, None)

            def gone(conn: Connection) -> None:
                conn.execute(
                    t.nodes.update()
                    .where(t.nodes.c.cluster == self.cluster, t.nodes.c.name == name)
                    .values(deleted=True, updated_at=at)
                )

            self.writer.submit(Op("nodes", gone))
            return
        if self._changed(row):
            self.writer.submit(
                Op("nodes", lambda conn: upsert(conn, t.nodes, row, ["cluster", "name"]))
            )
