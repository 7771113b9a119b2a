"""The recorder's finalizer on tracked workloads: put on while a workload is followed, so
its deletion waits until the final state is committed, and taken off right after."""

from __future__ import annotations

import queue
from collections.abc import Callable
from functools import partial

from sqlalchemy import Connection, update

from lens_ebpf.core.backoff import Backoff
from lens_ebpf.k8s.dynamic import DynamicApi, Kind, status_code
from lens_ebpf.recorder import lifecycle as lc
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import Op
from lens_ebpf.recorder.tracker.state import TrackerState, log


class Finalizers(TrackerState):
    """The queue of finalizers to add or remove, and its consumer."""

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
                log.warning(
                    "recorder: %s finalizer on %s %s/%s: %s",
                    action,
                    item[2],
                    item[3],
                    item[4],
                    f"{type(exc).__name__}: {exc}"[:200],
                )
                if self._stop.wait(backoff.next()):
                    return
                self._fin.put(item)
            key = (action, result)
            self.finalizer_ops[key] = self.finalizer_ops.get(key, 0) + 1
            self._fin.task_done()

    def _note_finalizer(self, uid: str, held: bool) -> None:
        wl = t.gpu_workloads
        stmt = (
            update(wl).where(wl.c.cluster == self.cluster, wl.c.uid == uid).values(finalizer=held)
        )

        def write(conn: Connection) -> None:
            conn.execute(stmt)

        self.writer.submit(Op("gpu_workloads", write))

    def release_finalizers(self) -> int:
        """Take the finalizer off every workload followed, now (its cluster is no longer
        followed: nothing would take it off later); the removals. After stop()."""
        done = 0
        for w in list(self.workloads.values()):
            try:
                if self._finalize("remove", w.uid, w.kind, w.namespace, w.name) in (
                    "ok",
                    "unchanged",
                ):
                    self._note_finalizer(w.uid, False)
                    done += 1
            except Exception as exc:  # its API gone too: said; uninstall's command is left
                log.warning(
                    "recorder (%s): finalizer of %s %s/%s stays: %s",
                    self.cluster,
                    w.kind_name,
                    w.namespace,
                    w.name,
                    f"{type(exc).__name__}: {exc}"[:200],
                )
        return done

    def _finalize(self, action: str, uid: str, kind: Kind, namespace: str, name: str) -> str:
        return change_finalizer(
            self.api, kind, namespace, name, uid, action == "add", partial(self._may_add, uid)
        )

    def _may_add(self, uid: str) -> bool:
        """Still tracked and not being finalized: the finalizer may go on."""
        with self._lock:
            w = self.workloads.get(uid)
            return w is not None and not w.finalizing


def change_finalizer(
    api: DynamicApi,
    kind: Kind,
    namespace: str,
    name: str,
    uid: str,
    add: bool,
    may_add: Callable[[], bool] = lambda: True,
) -> str:
    """Add or remove the recorder's finalizer on the object uid names ("ok", "unchanged",
    "gone", "conflict"), with its resourceVersion as a precondition (409: read again and
    retry, five times)."""
    for _ in range(5):
        try:
            obj = api.get(kind, namespace, name)
        except Exception as exc:
            if status_code(exc) == 404:
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
            code = status_code(exc)
            if code == 404:
                return "gone"
            if code != 409:
                raise
    return "conflict"
