"""The tracker's pod side: GPU pods from the watch of every pod, each recorded
(gpu_pods), snapshotted when something that matters changed (pod_snapshots), its changes
derived from the last snapshot (gpu_pods_events), its GPUs per container (pod_resources)
and its owners referenced (workload_pod_references)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from lens_ebpf.k8s.resources import container_request
from lens_ebpf.recorder import lifecycle as lc
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import Op, insert_new, upsert
from lens_ebpf.recorder.tracker.owners import OwnerWatch
from lens_ebpf.recorder.tracker.state import BAD_OBJECT, MODEL_LABELS, PodState


class PodWatch(OwnerWatch):
    """Handlers for the pod watch's events."""

    def replace_pods(self, items: list[dict[str, Any]]) -> None:
        """A full list: every pod in it, and pods no longer there were deleted meanwhile."""
        seen = set()
        for obj in items:
            uid = self.pod("ADDED", obj)
            if uid:
                seen.add(uid)
        with self._lock:
            gone = [uid for uid in self.pods if uid not in seen]
        for uid in gone:
            self._pod_deleted(uid, None)

    def pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.pod(kind, obj)

    def pod(self, kind: str, obj: dict[str, Any]) -> str:
        """One pod from the watch; returns its uid when it is a GPU pod."""
        try:
            m = lc.meta(obj)
            uid = str(m["uid"])
            with self._lock:
                known = uid in self.pods
            reqs = lc.gpu_requests(obj, self.resources)
            if not reqs and not known:
                return ""
            snap = lc.snapshot(obj)
        except BAD_OBJECT as exc:
            self._malformed("pods", "skipping a malformed pod", exc)
            return ""
        if kind == "DELETED":
            self._pod_deleted(uid, obj, snap)
            return uid
        with self._lock:
            self._pod_update(uid, obj, snap, reqs)
        return uid

    def _pod_update(
        self, uid: str, obj: dict[str, Any], snap: dict[str, Any], reqs: dict[str, int]
    ) -> None:
        old = self.pods.get(uid)
        if old is not None and old.snap == snap:
            return  # nothing that matters changed
        now = self.clock()
        m, st = obj["metadata"], obj.get("status") or {}
        phase = str(st.get("phase", ""))
        if old is not None and old.resolved:
            refs, resolved = old.refs, True
        else:
            refs, resolved = self._chain(m)
        prev = old.row if old is not None else {}
        started = prev.get("started_at")
        if started is None and phase in ("Running", *lc.TERMINAL_PHASES):
            started = lc.parse_time(st.get("startTime")) or now
        ended = prev.get("ended_at")
        if ended is None and phase in lc.TERMINAL_PHASES:
            ended = now
        row = {
            "cluster": self.cluster,
            "uid": uid,
            "namespace": str(m.get("namespace", "")),
            "name": str(m["name"]),
            "node": str((obj.get("spec") or {}).get("nodeName") or ""),
            "gpus": sum(reqs.values()),
            "gpu_resources": reqs,
            "phase": phase,
            "running": phase == "Running",
            "deleted": False,
            "workload_uid": refs[-1] if refs else None,
            "resource_version": str(m.get("resourceVersion", "")),
            "created_at": lc.parse_time(m.get("creationTimestamp")) or now,
            "started_at": started,
            "ended_at": ended,
            "deleted_at": None,
            "updated_at": now,
        }
        changes = lc.pod_changes(old.snap if old is not None and old.snap else None, snap)
        if old is not None and not old.snap:
            changes = [c for c in changes if c.type != "created"]
        self.pods[uid] = PodState(row, snap, refs, resolved)
        self.names[(str(row["namespace"]), str(row["name"]))] = uid
        resources = self._spec_resources(uid, obj, str(row["node"]), now)
        new_refs = [r for r in refs if old is None or r not in old.refs]
        rv = str(row["resource_version"])

        def write(conn: Connection) -> None:
            upsert(conn, t.gpu_pods, row, ["cluster", "uid"])
            self._write_snapshot(conn, uid, rv, now, snap)
            self._write_changes(conn, uid, rv, now, changes)
            for res in resources:
                upsert(conn, t.pod_resources, res, ["cluster", "pod_uid", "container", "source"])
            for w in new_refs:
                insert_new(
                    conn,
                    t.workload_pod_references,
                    {"cluster": self.cluster, "workload_uid": w, "pod_uid": uid, "created_at": now},
                    ["cluster", "workload_uid", "pod_uid"],
                )

        self.writer.submit(Op("gpu_pods", write))

    def _write_snapshot(
        self, conn: Connection, uid: str, rv: str, at: datetime, snap: dict[str, Any]
    ) -> None:
        insert_new(
            conn,
            t.pod_snapshots,
            {
                "cluster": self.cluster,
                "pod_uid": uid,
                "resource_version": rv,
                "taken_at": at,
                "pod_metadata": snap["metadata"],
                "spec": snap["spec"],
                "status": snap["status"],
            },
            ["cluster", "pod_uid", "resource_version"],
        )

    def _write_changes(
        self, conn: Connection, uid: str, rv: str, at: datetime, changes: list[lc.Change]
    ) -> None:
        for c in changes:
            insert_new(
                conn,
                t.gpu_pods_events,
                {
                    "cluster": self.cluster,
                    "pod_uid": uid,
                    "resource_version": rv,
                    "at": at,
                    "type": c.type,
                    "subject": c.subject,
                    "old_value": c.old,
                    "new_value": c.new,
                },
                ["cluster", "pod_uid", "resource_version", "type", "subject"],
            )

    def _spec_resources(
        self, uid: str, obj: dict[str, Any], node: str, now: datetime
    ) -> list[dict[str, Any]]:
        """pod_resources rows from the spec: per container, the GPUs it requests."""
        labels = self.api.node_labels(node) if node else {}
        model = next((labels[k] for k in MODEL_LABELS if labels.get(k)), "")
        spec = obj.get("spec") or {}
        out = []
        for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
            for r in self.resources:
                n = container_request(c, r, f"pod {uid}")
                if n:
                    out.append(
                        {
                            "cluster": self.cluster,
                            "pod_uid": uid,
                            "container": str(c.get("name", "")),
                            "source": "spec",
                            "resource": r,
                            "count": n,
                            "model": model,
                            "devices": [],
                            "updated_at": now,
                        }
                    )
        return out

    def _pod_deleted(
        self, uid: str, obj: dict[str, Any] | None, snap: dict[str, Any] | None = None
    ) -> None:
        """The pod is gone: its row is kept, marked deleted (obj None: deleted while the
        recorder was not watching)."""
        with self._lock:
            old = self.pods.pop(uid, None)
            if old is None:
                return
            key = (str(old.row["namespace"]), str(old.row["name"]))
            if self.names.get(key) == uid:
                del self.names[key]
        now = self.clock()
        row = {
            **old.row,
            "running": False,
            "deleted": True,
            "deleted_at": now,
            "ended_at": old.row.get("ended_at") or now,
            "updated_at": now,
        }
        if obj is not None:
            row["resource_version"] = str(obj["metadata"].get("resourceVersion", ""))
            st = obj.get("status") or {}
            row["phase"] = str(st.get("phase", row["phase"]))
        changes = []
        if snap is not None and old.snap and snap != old.snap:
            changes = lc.pod_changes(old.snap, snap)
        changes.append(lc.Change("deleted", "", str(old.row.get("phase", "")), ""))
        rv = row["resource_version"] or f"deleted-{now.timestamp():.0f}"

        def write(conn: Connection) -> None:
            upsert(conn, t.gpu_pods, row, ["cluster", "uid"])
            if snap is not None and snap != old.snap:
                self._write_snapshot(conn, uid, rv, now, snap)
            self._write_changes(conn, uid, rv, now, changes)

        self.writer.submit(Op("gpu_pods", write))
