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

import queue
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, or_, select

from lens_ebpf.k8s.dynamic import DynamicApi, Kind
from lens_ebpf.k8s.reflector import Reflector
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import Writer
from lens_ebpf.recorder.tracker.finalizers import Finalizers, change_finalizer
from lens_ebpf.recorder.tracker.pods import PodWatch
from lens_ebpf.recorder.tracker.state import PodState, TrackedPod, Workload, log, now_utc

__all__ = ["TrackedPod", "WorkloadTracker", "change_finalizer"]


class WorkloadTracker(PodWatch, Finalizers):
    """The recorder's state and its handlers for pod and workload watch events."""

    def __init__(
        self,
        api: DynamicApi,
        writer: Writer,
        resources: list[str],
        *,
        finalizers: bool = True,
        reflector_opts: dict[str, Any] | None = None,
        clock: Callable[[], datetime] = now_utc,
        cluster: str = "local",
    ) -> None:
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
        self.pod_reflector = Reflector(
            "pods",
            api.core.list_pod_for_all_namespaces,
            self.replace_pods,
            self.pod_event,
            **self.opts,
        )
        self.malformed: dict[str, int] = {"pods": 0, "workloads": 0}
        self.lookups: dict[str, int] = {
            "cached": 0,
            "fetched": 0,
            "gone": 0,
            "error": 0,
            "not_followed": 0,
        }
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
                log.warning(
                    "recorder: %s %s/%s: kind no longer served; not watched",
                    row["kind"],
                    row["namespace"],
                    row["name"],
                )
                continue
            if row["deleted"]:  # stored as deleted, but the finalizer did not come off
                self._fin.put(("remove", str(row["uid"]), kind, row["namespace"], row["name"]))
                continue
            uid = str(row["uid"])
            self.workloads[uid] = Workload(
                kind, row["kind"], row["namespace"], row["name"], uid, None, dict(row)
            )
        pods, snaps, refs = t.gpu_pods, t.pod_snapshots, t.workload_pod_references
        c = self.cluster
        live = select(pods.c.uid).where(pods.c.cluster == c, pods.c.deleted.is_(False))
        newest = select(func.max(snaps.c.id)).where(snaps.c.cluster == c, snaps.c.pod_uid.in_(live))
        last: dict[str, dict[str, Any]] = {}
        for r in conn.execute(
            select(snaps).where(snaps.c.id.in_(newest.group_by(snaps.c.pod_uid)))
        ).mappings():
            last[str(r["pod_uid"])] = {
                "metadata": r["pod_metadata"],
                "spec": r["spec"],
                "status": r["status"],
            }
        owners: dict[str, list[str]] = {}
        for pod_uid, w_uid in conn.execute(
            select(refs.c.pod_uid, refs.c.workload_uid).where(
                refs.c.cluster == c, refs.c.pod_uid.in_(live)
            )
        ):
            owners.setdefault(str(pod_uid), []).append(str(w_uid))
        for row in conn.execute(
            select(pods).where(pods.c.cluster == c, pods.c.deleted.is_(False))
        ).mappings():
            uid = str(row["uid"])
            # the top workload last: a pod's next row names it (refs[-1])
            uids = sorted(owners.get(uid, ()), key=lambda w, top=row["workload_uid"]: w == top)
            self.pods[uid] = PodState(dict(row), last.get(uid, {}), tuple(uids))
            self.names[(str(row["namespace"]), str(row["name"]))] = uid
        log.info(
            "recorder: recovered %d pods and %d workloads from the database",
            len(self.pods),
            len(self.workloads),
        )

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
        return TrackedPod(
            uid,
            str(row["namespace"]),
            str(row["name"]),
            str(row["node"]),
            bool(row["running"]),
            top,
            w.kind_name if w else "",
            w.name if w else "",
        )

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
