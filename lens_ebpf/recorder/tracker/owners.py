"""The tracker's workload side: a pod's owner references followed to the top
(ReplicaSet -> Deployment, Job -> CronJob, custom resources by API discovery), each
workload recorded (gpu_workloads) and watched until it is deleted: one list/watch per
kind, started with the first workload of that kind and stopped with the last."""

from __future__ import annotations

import logging
import threading
from functools import partial
from typing import Any

from sqlalchemy import Connection

from lens_ebpf.k8s.dynamic import Kind, status_code
from lens_ebpf.k8s.objects import ObjectError
from lens_ebpf.k8s.reflector import Reflector
from lens_ebpf.recorder import lifecycle as lc
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import Op, upsert
from lens_ebpf.recorder.tracker.state import (
    BAD_OBJECT,
    MAX_OWNER_HOPS,
    TrackerState,
    UnresolvedError,
    Workload,
    log,
)


class OwnerWatch(TrackerState):
    """Owner chains, and handlers for the watches of workload kinds."""

    def _chain(self, pod_meta: dict[str, Any]) -> tuple[tuple[str, ...], bool]:
        """The uids of the workloads above a pod, bottom to top, tracking each; and False
        when a lookup failed for now (the chain may go higher)."""
        namespace = str(pod_meta.get("namespace", ""))
        ref = lc.owner_ref({"metadata": pod_meta})
        out: list[str] = []
        for _ in range(MAX_OWNER_HOPS):
            if ref is None:
                break
            w = self.workloads.get(ref["uid"]) if ref.get("uid") else None
            if w is not None:
                self.lookups["cached"] += 1
            else:
                try:
                    w = self._fetch(namespace, ref)
                except UnresolvedError:
                    return tuple(out), False
                if w is None:
                    break
            out.append(w.uid)
            ref = w.parent
        return tuple(out), True

    def _fetch(self, namespace: str, ref: dict[str, str]) -> Workload | None:
        try:
            kind = self.api.kind(ref["apiVersion"], ref["kind"])
            if kind is None:
                self.lookups["not_followed"] += 1
                return None
            obj = self.api.get(kind, namespace, ref["name"])
            m = lc.meta(obj)
        except ObjectError as exc:
            self._malformed("workloads", f"{ref['kind']} {namespace}/{ref['name']}", exc)
            return None
        except Exception as exc:
            code = status_code(exc)
            self.lookups["gone" if code == 404 else "error"] += 1
            log.log(
                logging.DEBUG if code == 404 else logging.WARNING,
                "recorder: owner %s %s/%s: %s",
                ref["kind"],
                namespace,
                ref["name"],
                f"HTTP {code}" if code else f"{type(exc).__name__}: {exc}",
            )
            if code == 404:
                return None
            raise UnresolvedError from None
        self.lookups["fetched"] += 1
        w = Workload(kind, ref["kind"], namespace, str(m["name"]), str(m["uid"]), lc.owner_ref(obj))
        if ref.get("uid") and ref["uid"] != w.uid:
            return None  # a new object of the same name: the pod's owner is gone
        self.workloads[w.uid] = w
        self._workload_update(w, obj, gone=False)
        self._watch_kind(kind)
        return w

    def workload_event(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            uid = str(lc.meta(obj)["uid"])
        except ObjectError as exc:
            self._malformed("workloads", "skipping a malformed workload", exc)
            return
        with self._lock:
            w = self.workloads.get(uid)
            if w is not None:
                self._workload_update(w, obj, gone=kind == "DELETED")

    def replace_workloads(self, kind: Kind, items: list[dict[str, Any]]) -> None:
        seen = set()
        for obj in items:
            self.workload_event("ADDED", obj)
            uid = (obj.get("metadata") or {}).get("uid") if isinstance(obj, dict) else None
            if uid:
                seen.add(uid)
        with self._lock:
            gone = [w for w in self.workloads.values() if w.kind == kind and w.uid not in seen]
            for w in gone:  # deleted while nobody held a finalizer on it
                self._workload_update(w, None, gone=True)

    def _workload_update(self, w: Workload, obj: dict[str, Any] | None, gone: bool) -> None:
        if w.finalizing:
            return
        now = self.clock()
        prev = w.row
        if obj is not None:
            try:
                m = lc.meta(obj)
                status, ended = lc.workload_status(obj)
            except BAD_OBJECT as exc:
                self._malformed("workloads", f"workload {w.namespace}/{w.name}", exc)
                return
            try:
                reqs = lc.workload_request(obj, self.resources)
            except BAD_OBJECT as exc:
                # its pods still name it: recorded, with no GPU request it could read
                self._malformed("workloads", f"workload {w.namespace}/{w.name}", exc)
                reqs = {}
            w.parent = lc.owner_ref(obj)
            deleting = gone or bool(m.get("deletionTimestamp"))
            row = {
                "cluster": self.cluster,
                "uid": w.uid,
                "api_version": w.kind.api_version,
                "kind": w.kind_name,
                "namespace": w.namespace,
                "name": w.name,
                "parent_uid": w.parent["uid"] if w.parent else None,
                "gpu_request": sum(reqs.values()),
                "gpu_resources": reqs,
                "status": status,
                "running": ended is None and not deleting,
                "deleted": False,
                "labels": dict(m.get("labels") or {}),
                "resource_version": str(m.get("resourceVersion", "")),
                "created_at": lc.parse_time(m.get("creationTimestamp")) or now,
                "ended_at": prev.get("ended_at") or ended,
                "deleted_at": None,
            }
            fins = list(m.get("finalizers") or ())
        else:
            deleting, row, fins = True, dict(prev), []
        if deleting:
            at = lc.parse_time((obj or {}).get("metadata", {}).get("deletionTimestamp")) or now
            row.update(
                running=False, deleted=True, deleted_at=at, ended_at=row.get("ended_at") or at
            )
        same = all(prev.get(k) == v for k, v in row.items() if k != "updated_at")
        if not deleting:
            if not same:
                w.row = {**row, "updated_at": now}
                self.writer.submit(Op("gpu_workloads", partial(self._write_workload, w.row)))
            if self.finalizers and lc.FINALIZER not in fins:
                self._fin.put(("add", w.uid, w.kind, w.namespace, w.name))
            return
        w.finalizing = True
        w.row = {**row, "updated_at": now}
        held = lc.FINALIZER in fins

        def done() -> None:
            if held:
                self._fin.put(("remove", w.uid, w.kind, w.namespace, w.name))
            self._collect(w)

        self.writer.submit(Op("gpu_workloads", partial(self._write_workload, w.row), done))

    @staticmethod
    def _write_workload(row: dict[str, Any], conn: Connection) -> None:
        upsert(conn, t.gpu_workloads, row, ["cluster", "uid"])

    def _collect(self, w: Workload) -> None:
        """The workload is finished and stored: drop its watcher (and its kind's watch when
        it was the last of its kind)."""
        with self._lock:
            self.workloads.pop(w.uid, None)
            self.watchers_collected += 1
            if any(o.kind == w.kind for o in self.workloads.values()):
                return
            entry = self.kinds.pop(w.kind, None)
        if entry is not None:
            entry[1].set()
            entry[0].stop()

    def _watch_kind(self, kind: Kind) -> None:
        if kind in self.kinds:
            return
        stop = threading.Event()
        refl = Reflector(
            str(kind),
            self.api.lister(kind),
            partial(self.replace_workloads, kind),
            self.workload_event,
            **self.opts,
        )
        th = threading.Thread(target=refl.run, args=(stop,), name=f"recorder-{kind}", daemon=True)
        self.kinds[kind] = (refl, stop, th)
        th.start()
