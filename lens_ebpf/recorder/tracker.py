"""Follows GPU pods cluster-wide and the workloads above them, into the writer's queue.

Pods come from one list/watch of every pod. A pod that requests a configured GPU resource
is recorded (gpu_pods), snapshotted when something that matters changed (pod_snapshots),
its changes derived from the last snapshot (gpu_pods_events), its GPUs per container
(pod_resources), and its owner references followed to the top (gpu_workloads,
workload_pod_references): ReplicaSet -> Deployment, Job -> CronJob, and custom resources
(PyTorchJob, MPIJob, RayJob, ...) by API discovery of their apiVersion and kind.

Each tracked workload is watched until it is deleted ("a watcher per workload"): one
list/watch per kind serves every workload of that kind, started with the first and
stopped with the last. The recorder puts its finalizer on tracked workloads, so a
deletion waits until the final state is committed; the finalizer comes off right after.
On start the state is read back from the database: workloads not yet deleted are
watched again, and what happened while the recorder was down is found by the first list
(pods gone are recorded deleted; workloads held by the finalizer are finalized).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from sqlalchemy import Connection, func, or_, select, update

from lens_ebpf.core.backoff import Backoff
from lens_ebpf.k8s.objects import ObjectError
from lens_ebpf.k8s.reflector import Reflector, call_raw
from lens_ebpf.k8s.resources import container_request
from lens_ebpf.recorder import lifecycle as lc
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import Op, Writer, insert_new, upsert

log = logging.getLogger(__name__)

MAX_OWNER_HOPS = 5
# what reading a malformed object raises (a missing field, a wrong type, a bad quantity)
BAD_OBJECT = (ObjectError, TypeError, AttributeError, ValueError)
MERGE_PATCH = "application/merge-patch+json"
NODE_LABELS_TTL = 600.0
MODEL_LABELS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name", "amd.com/gpu.family")


def now_utc() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


class Api:
    """The API calls the recorder makes, as raw JSON: any namespaced kind of a named group
    through discovery (the dynamic client's way), pods and nodes through the core API."""

    def __init__(self, api_client: Any, timeout: float) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.timeout = timeout
        self._plurals: dict[tuple[str, str], dict[str, str]] = {}
        self._nodes: dict[str, tuple[float, dict[str, str]]] = {}

    def kind(self, api_version: str, kind: str) -> Kind | None:
        """The collection serving kind in api_version; None for the core group (Node,
        ReplicationController: not followed) or a kind the server does not serve."""
        group, version = lc.split_api_version(api_version)
        if not group:
            return None
        found = self._plurals.get((group, version))
        if found is None or kind not in found:
            doc = call_raw(self.custom.get_api_resources, group, version, timeout=self.timeout)
            found = {str(r["kind"]): str(r["name"]) for r in doc.get("resources") or ()
                     if isinstance(r, dict) and r.get("kind") and "/" not in str(r.get("name"))
                     and r.get("namespaced")}  # fmt: skip
            self._plurals[(group, version)] = found
        plural = found.get(kind)
        return Kind(group, version, plural) if plural else None

    def get(self, k: Kind, namespace: str, name: str) -> dict[str, Any]:
        return call_raw(self.custom.get_namespaced_custom_object, k.group, k.version,
                        namespace, k.plural, name, timeout=self.timeout)  # fmt: skip

    def patch(self, k: Kind, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return call_raw(self.custom.patch_namespaced_custom_object, k.group, k.version,
                        namespace, k.plural, name, body, timeout=self.timeout,
                        _content_type=MERGE_PATCH)  # fmt: skip

    def lister(self, k: Kind) -> Callable[..., Any]:
        return partial(self.custom.list_cluster_custom_object, k.group, k.version, k.plural)

    def node_labels(self, node: str) -> dict[str, str]:
        """A node's labels (the GPU product labels), read again after NODE_LABELS_TTL: GPU
        feature discovery may label a node after its first pods start."""
        hit = self._nodes.get(node)
        if hit is None or time.monotonic() > hit[0]:
            try:
                labels = (call_raw(self.core.read_node, node, timeout=self.timeout)
                          .get("metadata", {}).get("labels") or {})  # fmt: skip
            except Exception as exc:  # 404, 403: no model, not an error
                log.debug("node %s: %s", node, exc)
                labels = {}
            hit = (time.monotonic() + NODE_LABELS_TTL, {str(k): str(v) for k, v in labels.items()})
            self._nodes[node] = hit
        return hit[1]


def _status_code(exc: Exception) -> int | None:
    code = getattr(exc, "status", None)
    return code if isinstance(code, int) else None


@dataclass
class Workload:
    kind: Kind
    kind_name: str
    namespace: str
    name: str
    uid: str
    parent: dict[str, str] | None  # the controlling owner reference
    row: dict[str, Any] = field(default_factory=dict)
    finalizing: bool = False  # its final state is written; the finalizer comes off


@dataclass
class PodState:
    row: dict[str, Any]
    snap: dict[str, Any]
    refs: tuple[str, ...] = ()  # workload uids referenced, bottom to top
    resolved: bool = True  # False: an owner lookup failed; tried again at the next change


@dataclass(frozen=True)
class TrackedPod:
    uid: str
    namespace: str
    name: str
    node: str
    running: bool
    workload_uid: str  # the top owner ("" for a pod no workload owns)
    workload_kind: str
    workload_name: str


class Unresolved(Exception):
    """An owner the API could not tell about just now (not a 404)."""


class WorkloadTracker:
    """The recorder's state and its handlers for pod and workload watch events."""

    def __init__(self, api: Api, writer: Writer, resources: list[str], *,
                 finalizers: bool = True, reflector_opts: dict[str, Any] | None = None,
                 clock: Callable[[], datetime] = now_utc,
                 cluster: str = "local") -> None:  # fmt: skip
        self.api = api
        self.cluster = cluster  # every row it writes and reads is this cluster's
        self.writer = writer
        self.resources = list(resources)
        self.finalizers = finalizers
        self.opts = dict(reflector_opts or {})
        self.clock = clock
        self._lock = threading.RLock()
        self.pods: dict[str, PodState] = {}
        self.names: dict[tuple[str, str], str] = {}  # (namespace, name) -> uid of pods
        self.workloads: dict[str, Workload] = {}
        self.kinds: dict[Kind, tuple[Reflector, threading.Event, threading.Thread]] = {}
        self.pod_reflector = Reflector("pods", api.core.list_pod_for_all_namespaces,
                                       self.replace_pods, self.pod_event, **self.opts)  # fmt: skip
        self.malformed: dict[str, int] = {"pods": 0, "workloads": 0}
        self.lookups: dict[str, int] = {"cached": 0, "fetched": 0, "gone": 0, "error": 0,
                                        "not_followed": 0}  # fmt: skip
        self.finalizer_ops: dict[tuple[str, str], int] = {}
        self.watchers_collected = 0
        self._fin: queue.Queue[tuple[str, str, Kind, str, str]] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------
    def recover(self, conn: Connection) -> None:
        """State from the database: pods and workloads not yet deleted."""
        wl = t.gpu_workloads
        q = select(wl).where(
            wl.c.cluster == self.cluster, or_(wl.c.deleted.is_(False), wl.c.finalizer.is_(True))
        )
        for row in conn.execute(q).mappings():
            kind = self.api.kind(row["api_version"], row["kind"])
            if kind is None:
                log.warning("recorder: %s %s/%s: kind no longer served; not watched",
                            row["kind"], row["namespace"], row["name"])  # fmt: skip
                continue
            if row["deleted"]:  # stored as deleted, but the finalizer did not come off
                self._fin.put(("remove", str(row["uid"]), kind, row["namespace"], row["name"]))
                continue
            uid = str(row["uid"])
            self.workloads[uid] = Workload(kind, row["kind"], row["namespace"], row["name"], uid,
                                           None, dict(row))  # fmt: skip
        pods, snaps, refs = t.gpu_pods, t.pod_snapshots, t.workload_pod_references
        c = self.cluster
        live = select(pods.c.uid).where(pods.c.cluster == c, pods.c.deleted.is_(False))
        newest = select(func.max(snaps.c.id)).where(snaps.c.cluster == c,
                                                    snaps.c.pod_uid.in_(live))  # fmt: skip
        last: dict[str, dict[str, Any]] = {}
        for r in conn.execute(select(snaps).where(
                snaps.c.id.in_(newest.group_by(snaps.c.pod_uid)))).mappings():  # fmt: skip
            last[str(r["pod_uid"])] = {"metadata": r["pod_metadata"], "spec": r["spec"],
                                       "status": r["status"]}  # fmt: skip
        owners: dict[str, list[str]] = {}
        for pod_uid, w_uid in conn.execute(select(refs.c.pod_uid, refs.c.workload_uid)
                                           .where(refs.c.cluster == c,
                                                  refs.c.pod_uid.in_(live))):  # fmt: skip
            owners.setdefault(str(pod_uid), []).append(str(w_uid))
        for row in conn.execute(
            select(pods).where(pods.c.cluster == c, pods.c.deleted.is_(False))
        ).mappings():
            uid = str(row["uid"])
            # the top workload last: a pod's next row names it (refs[-1])
            uids = sorted(owners.get(uid, ()), key=lambda w, top=row["workload_uid"]: w == top)
            self.pods[uid] = PodState(dict(row), last.get(uid, {}), tuple(uids))
            self.names[(str(row["namespace"]), str(row["name"]))] = uid
        log.info("recorder: recovered %d pods and %d workloads from the database",
                 len(self.pods), len(self.workloads))  # fmt: skip

    def start(self) -> None:
        with self._lock:
            for kind in {w.kind for w in self.workloads.values()}:
                self._watch_kind(kind)
        self._spawn("recorder-pods", self.pod_reflector.run, self._stop)
        self._spawn("recorder-finalizers", self._finalizer_loop)

    def _spawn(self, name: str, fn: Callable[..., None], *args: Any) -> None:
        th = threading.Thread(target=fn, args=args, name=name, daemon=True)
        th.start()
        self._threads.append(th)

    def stop(self) -> None:
        self._stop.set()
        self.pod_reflector.stop()
        with self._lock:
            kinds = list(self.kinds.values())
        for refl, stop, _ in kinds:
            stop.set()
            refl.stop()
        for th in self._threads + [k[2] for k in kinds]:
            th.join(timeout=3)

    def reflectors(self) -> list[Reflector]:
        with self._lock:
            return [self.pod_reflector] + [k[0] for k in self.kinds.values()]

    def gpu_pod(self, namespace: str, name: str, uid: str = "") -> TrackedPod | None:
        """A GPU pod tracked now, by its uid or else its namespace and name, with its top
        workload; None for any other pod."""
        with self._lock:
            if not uid or uid not in self.pods:
                uid = self.names.get((namespace, name), "")
            st = self.pods.get(uid)
            return self._tracked(uid, st) if st is not None else None

    def _tracked(self, uid: str, st: PodState) -> TrackedPod:
        """A pod's row with its top workload's kind and name (the lock held)."""
        row = st.row
        top = str(row.get("workload_uid") or "")
        w = self.workloads.get(top)
        return TrackedPod(uid, str(row["namespace"]), str(row["name"]), str(row["node"]),
                          bool(row["running"]), top, w.kind_name if w else "",
                          w.name if w else "")  # fmt: skip

    def running_workloads(self) -> set[str]:
        """The top workloads with a pod running now."""
        return set(self.running_pods())

    def running_pods(self) -> dict[str, list[TrackedPod]]:
        """Top workload uid -> its pods running now (by name)."""
        out: dict[str, list[TrackedPod]] = {}
        with self._lock:
            for uid, st in self.pods.items():
                if st.row.get("running") and st.row.get("workload_uid"):
                    pod = self._tracked(uid, st)
                    out.setdefault(pod.workload_uid, []).append(pod)
        for pods in out.values():
            pods.sort(key=lambda p: p.name)
        return out

    def _malformed(self, resource: str, what: str, exc: Exception) -> None:
        self.malformed[resource] += 1
        log.warning("recorder: %s: %s", what, exc)

    # -- pods --------------------------------------------------------------------
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

    def _pod_update(self, uid: str, obj: dict[str, Any], snap: dict[str, Any],
                    reqs: dict[str, int]) -> None:  # fmt: skip
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
            "cluster": self.cluster, "uid": uid, "namespace": str(m.get("namespace", "")),
            "name": str(m["name"]),
            "node": str((obj.get("spec") or {}).get("nodeName") or ""),
            "gpus": sum(reqs.values()), "gpu_resources": reqs, "phase": phase,
            "running": phase == "Running", "deleted": False,
            "workload_uid": refs[-1] if refs else None,
            "resource_version": str(m.get("resourceVersion", "")),
            "created_at": lc.parse_time(m.get("creationTimestamp")) or now,
            "started_at": started, "ended_at": ended, "deleted_at": None, "updated_at": now,
        }  # fmt: skip
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
                insert_new(conn, t.workload_pod_references,
                           {"cluster": self.cluster, "workload_uid": w, "pod_uid": uid,
                            "created_at": now},
                           ["cluster", "workload_uid", "pod_uid"])  # fmt: skip

        self.writer.submit(Op("gpu_pods", write))

    def _write_snapshot(self, conn: Connection, uid: str, rv: str, at: datetime,
                        snap: dict[str, Any]) -> None:  # fmt: skip
        insert_new(conn, t.pod_snapshots, {
            "cluster": self.cluster, "pod_uid": uid, "resource_version": rv, "taken_at": at,
            "pod_metadata": snap["metadata"], "spec": snap["spec"], "status": snap["status"],
        }, ["cluster", "pod_uid", "resource_version"])  # fmt: skip

    def _write_changes(self, conn: Connection, uid: str, rv: str, at: datetime,
                       changes: list[lc.Change]) -> None:  # fmt: skip
        for c in changes:
            insert_new(conn, t.gpu_pods_events, {
                "cluster": self.cluster, "pod_uid": uid, "resource_version": rv, "at": at,
                "type": c.type, "subject": c.subject, "old_value": c.old, "new_value": c.new,
            }, ["cluster", "pod_uid", "resource_version", "type", "subject"])  # fmt: skip

    def _spec_resources(self, uid: str, obj: dict[str, Any], node: str,
                        now: datetime) -> list[dict[str, Any]]:  # fmt: skip
        """pod_resources rows from the spec: per container, the GPUs it requests."""
        labels = self.api.node_labels(node) if node else {}
        model = next((labels[k] for k in MODEL_LABELS if labels.get(k)), "")
        spec = obj.get("spec") or {}
        out = []
        for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
            for r in self.resources:
                n = container_request(c, r, f"pod {uid}")
                if n:
                    out.append({"cluster": self.cluster, "pod_uid": uid,
                                "container": str(c.get("name", "")),
                                "source": "spec", "resource": r, "count": n, "model": model,
                                "devices": [], "updated_at": now})  # fmt: skip
        return out

    def _pod_deleted(self, uid: str, obj: dict[str, Any] | None,
                     snap: dict[str, Any] | None = None) -> None:  # fmt: skip
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
        row = {**old.row, "running": False, "deleted": True, "deleted_at": now,
               "ended_at": old.row.get("ended_at") or now, "updated_at": now}  # fmt: skip
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

    # -- workloads -----------------------------------------------------------------
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
                except Unresolved:
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
            code = _status_code(exc)
            self.lookups["gone" if code == 404 else "error"] += 1
            log.log(logging.DEBUG if code == 404 else logging.WARNING,
                    "recorder: owner %s %s/%s: %s", ref["kind"], namespace, ref["name"],
                    f"HTTP {code}" if code else f"{type(exc).__name__}: {exc}")  # fmt: skip
            if code == 404:
                return None
            raise Unresolved from None
        self.lookups["fetched"] += 1
        w = Workload(kind, ref["kind"], namespace, str(m["name"]), str(m["uid"]),
                     lc.owner_ref(obj))  # fmt: skip
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
                "cluster": self.cluster, "uid": w.uid, "api_version": w.kind.api_version,
                "kind": w.kind_name,
                "namespace": w.namespace, "name": w.name,
                "parent_uid": w.parent["uid"] if w.parent else None,
                "gpu_request": sum(reqs.values()), "gpu_resources": reqs, "status": status,
                "running": ended is None and not deleting, "deleted": False,
                "labels": dict(m.get("labels") or {}),
                "resource_version": str(m.get("resourceVersion", "")),
                "created_at": lc.parse_time(m.get("creationTimestamp")) or now,
                "ended_at": prev.get("ended_at") or ended, "deleted_at": None,
            }  # fmt: skip
            fins = list(m.get("finalizers") or ())
        else:
            deleting, row, fins = True, dict(prev), []
        if deleting:
            at = lc.parse_time((obj or {}).get("metadata", {}).get("deletionTimestamp")) or now
            row.update(running=False, deleted=True, deleted_at=at,
                       ended_at=row.get("ended_at") or at)  # fmt: skip
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
        refl = Reflector(str(kind), self.api.lister(kind), partial(self.replace_workloads, kind),
                         self.workload_event, **self.opts)  # fmt: skip
        th = threading.Thread(target=refl.run, args=(stop,), name=f"recorder-{kind}",
                              daemon=True)  # fmt: skip
        self.kinds[kind] = (refl, stop, th)
        th.start()

    # -- finalizers ------------------------------------------------------------------
    def _finalizer_loop(self) -> None:
        backoff = Backoff(30.0)
        while not self._stop.is_set():
            try:
                item = self._fin.get(timeout=0.5)
            except queue.Empty:
                continue
            action = item[0]
            try:
                result = self._finalize(*item)
                backoff.reset()
                if action == "add" and result == "ok":
                    self._note_finalizer(item[1], True)
                elif action == "remove" and result != "conflict":
                    self._note_finalizer(item[1], False)
            except Exception as exc:  # API down: try again later
                result = "error"
                log.warning("recorder: %s finalizer on %s %s/%s: %s", action, item[2], item[3],
                            item[4], f"{type(exc).__name__}: {exc}"[:200])  # fmt: skip
                if self._stop.wait(backoff.next()):
                    return
                self._fin.put(item)
            key = (action, result)
            self.finalizer_ops[key] = self.finalizer_ops.get(key, 0) + 1
            self._fin.task_done()

    def _note_finalizer(self, uid: str, held: bool) -> None:
        wl = t.gpu_workloads
        stmt = update(wl).where(wl.c.cluster == self.cluster, wl.c.uid == uid
                                ).values(finalizer=held)  # fmt: skip

        def write(conn: Connection) -> None:
            conn.execute(stmt)

        self.writer.submit(Op("gpu_workloads", write))

    def release_finalizers(self) -> int:
        """Take the finalizer off every workload followed, now (its cluster is no longer
        followed: nothing would take it off later); the removals. After stop()."""
        done = 0
        for w in list(self.workloads.values()):
            try:
                if self._finalize("remove", w.uid, w.kind, w.namespace, w.name) \
                        in ("ok", "unchanged"):  # fmt: skip
                    self._note_finalizer(w.uid, False)
                    done += 1
            except Exception as exc:  # its API gone too: said; uninstall's command is left
                log.warning("recorder (%s): finalizer of %s %s/%s stays: %s", self.cluster,
                            w.kind_name, w.namespace, w.name,
                            f"{type(exc).__name__}: {exc}"[:200])  # fmt: skip
        return done

    def _finalize(self, action: str, uid: str, kind: Kind, namespace: str, name: str) -> str:
        return change_finalizer(self.api, kind, namespace, name, uid, action == "add",
                                partial(self._may_add, uid))  # fmt: skip

    def _may_add(self, uid: str) -> bool:
        """Still tracked and not being finalized: the finalizer may go on."""
        with self._lock:
            w = self.workloads.get(uid)
            return w is not None and not w.finalizing


def change_finalizer(api: Api, kind: Kind, namespace: str, name: str, uid: str, add: bool,
                     may_add: Callable[[], bool] = lambda: True) -> str:  # fmt: skip
    """Add or remove the recorder's finalizer on the object uid names ("ok", "unchanged",
    "gone", "conflict"), with its resourceVersion as a precondition (409: read again and
    retry, five times)."""
    for _ in range(5):
        try:
            obj = api.get(kind, namespace, name)
        except Exception as exc:
            if _status_code(exc) == 404:
                return "gone"
            raise
        m = obj.get("metadata") or {}
        if m.get("uid") != uid:
            return "gone"
        fins = [f for f in m.get("finalizers") or () if isinstance(f, str)]
        if add:
            if lc.FINALIZER in fins or m.get("deletionTimestamp") or not may_add():
                return "unchanged"  # none may be added to an object being deleted
            fins.append(lc.FINALIZER)
        else:
            if lc.FINALIZER not in fins:
                return "unchanged"
            fins.remove(lc.FINALIZER)
        body = {"metadata": {"finalizers": fins, "resourceVersion": m.get("resourceVersion")}}
        try:
            api.patch(kind, namespace, name, body)
            return "ok"
        except Exception as exc:
            code = _status_code(exc)
            if code == 404:
                return "gone"
            if code != 409:
                raise
    return "conflict"
