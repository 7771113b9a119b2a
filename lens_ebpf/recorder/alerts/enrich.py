"""What an alert concerns, from its labels, through the maps remote write already uses
(remote_write/index.py): the node a label names (by name or address), the GPU a device
label names on it (index, UUID, serial, PCI address), the pod that held that GPU when the
alert began (or the pod a label names), and the pod's top workload; with the workload's
GPU request and the node's GPUs from the tables. Our own alerts name their workload
outright (labels workload_uid, namespace, workload, pod, node)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from lens_ebpf.recorder.nodes.gpus import GPU_NAME_LABELS
from lens_ebpf.recorder.remote_write.index import Index
from lens_ebpf.recorder.remote_write.receiver import RemoteWrite
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.schema import scoped
from lens_ebpf.recorder.workloads import statuses


@dataclass
class Concern:
    """Who an alert is about; empty strings where its labels do not say."""

    node: str = ""
    pod: str = ""
    pod_uid: str = ""
    namespace: str = ""
    workload_uid: str = ""
    workload_name: str = ""
    workload_kind: str = ""
    gpu: dict[str, Any] = field(default_factory=dict)  # {slot, index}

    def enriched(self, conn: Connection, cluster: str) -> dict[str, Any]:
        """The enriched_data the pages read: the flat keys and workload_info, pod_info,
        node_info, gpu_info (those it knows)."""
        out: dict[str, Any] = {}
        if self.workload_uid:
            tables = scoped(cluster)
            w = tables.gpu_workloads
            row = conn.execute(select(w).where(w.c.uid == self.workload_uid)).first()
            info = {
                "uid": self.workload_uid,
                "name": self.workload_name,
                "namespace": self.namespace,
                "kind": self.workload_kind,
                "gpu_request": int(row.gpu_request) if row else None,
            }
            out["workload_info"] = info
            out |= {
                "workload_name": self.workload_name,
                "workload_namespace": self.namespace,
                "workload_kind": self.workload_kind,
                "workload_status": statuses(conn, tables, [row])[row.uid] if row else "",
            }
        if self.pod:
            p = t.gpu_pods
            row = conn.execute(
                select(p.c.phase, p.c.gpus).where(p.c.cluster == cluster, p.c.uid == self.pod_uid)
            ).first()
            out["pod_info"] = {
                "name": self.pod,
                "namespace": self.namespace,
                "phase": str(row.phase) if row else "",
                "gpus": int(row.gpus) if row else None,
            }
            out |= {"pod_name": self.pod, "pod_phase": out["pod_info"]["phase"]}
        if self.node:
            n = t.nodes
            row = conn.execute(
                select(n.c.gpu_capacity, n.c.labels, n.c.status).where(
                    n.c.cluster == cluster, n.c.name == self.node
                )
            ).first()
            if row is not None:
                labels = row.labels or {}
                model = next((labels[k] for k in GPU_NAME_LABELS if labels.get(k)), "")
                out["node_info"] = {
                    "name": self.node,
                    "status": str(row.status),
                    "gpu_count": sum(int(v) for v in (row.gpu_capacity or {}).values()),
                    "gpu_model": model,
                }
                out["node_status"] = str(row.status)
        if self.gpu:
            out["gpu_info"] = dict(self.gpu)
        return out


OURS = ("workload_uid", "workload", "namespace", "pod", "pod_uid", "node")


def concern(labels: dict[str, str], at: datetime, rw: RemoteWrite | None) -> Concern:
    """What labels name, as the remote-write maps resolve them at `at`."""
    c = Concern()
    if rw is not None:
        idx = rw.indexer.index
        r = rw.relabeler.resolve(labels, idx)
        if r.missing and r.node:  # a pod just started, a node just joined: read it again
            ns, name = rw.relabeler.named(labels)
            read, idx = rw.indexer.look_again(
                r.node, labels.get("pod_uid", ""), (ns, name) if ns else None
            )
            if read:
                r = rw.relabeler.resolve(labels, idx)
        c.node = r.node if r.node in idx.nodes else ""
        uid = r.pod or (r.static or "")
        if not uid and r.device is not None:
            held = idx.held(r.device[0], r.device[1], at.timestamp() * 1000)
            uid = held[0] if held else ""
        if r.device is not None:
            c.gpu = {"node": r.device[0], "slot": r.device[1], "index": _index_of(idx, *r.device)}
        pod = idx.pods.get(uid)
        if pod is not None:
            c.pod, c.pod_uid, c.namespace = pod.name, pod.uid, pod.namespace
            c.node = c.node or pod.node
            if pod.workloads:
                c.workload_kind, c.workload_name, c.workload_uid = pod.workloads[-1]
    # our own alerts (and any that say so) name what they concern outright
    c.workload_uid = labels.get("workload_uid") or c.workload_uid
    c.workload_name = labels.get("workload") or c.workload_name
    c.workload_kind = labels.get("workload_kind") or c.workload_kind
    c.namespace = c.namespace or labels.get("namespace", "")
    c.pod = c.pod or labels.get("pod", "")
    c.pod_uid = c.pod_uid or labels.get("pod_uid", "")
    c.node = c.node or labels.get("node", "")
    return c


def _index_of(idx: Index, node: str, slot: str) -> int | None:
    for (match, value), s in idx.gpus.get(node, {}).items():
        if s == slot and match == "index" and value.isdigit():
            return int(value)
    return None
