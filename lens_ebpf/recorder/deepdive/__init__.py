"""The deep dive into a workload's pods through their nodes' agents (lens.v1.DeepDiveService
on each agent's gRPC port, agent/deepdive): a pod's process tree, and py-spy tasks with the
web UI's lifecycle (pending -> running -> completed / failed / cancelled), their output
kept in pyspy_tasks and served as a file.

The recorder calls the agent on the pod's node (nodes.address, recorder.deepdive.agent_port)
with its own bearer token (recorder.deepdive.token_file: its ServiceAccount's token for
the agents' audience). What the agent refuses comes back as the domain's errors: NotFound
(the pod or the pid is not there), BadRequest (a non-Python pid, a process that exited
mid-sample, bounds), Unavailable (the agent down, or refusing the recorder).

Here the tasks' lifecycle and the stall and hang captures; the agents' calls and where a
pod runs are agents.py's, the stacks compared stacks.py's, the tasks as the API reads them
tasks.py's."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection, Engine

from lens_ebpf.recorder.config import DeepDiveConfig
from lens_ebpf.recorder.deepdive.agents import Agents, PodPlace, pod_place, tree_of, workload_pods
from lens_ebpf.recorder.deepdive.stacks import Capture, compare, main_stack
from lens_ebpf.recorder.deepdive.tasks import ENDED, EXT, FORMATS, stamp, task_view
from lens_ebpf.recorder.errors import BadRequest, NotFound, Unavailable
from lens_ebpf.recorder.store import schema

log = logging.getLogger(__name__)
KEEP_TRIES = 50  # an alert's row looked for this many times, 0.2 s apart


class DeepDive:
    """The process tree and the py-spy tasks of one recorder; each task runs on a thread
    of its own, its row the truth (a cancel written by any replica is seen while it runs)."""

    def __init__(
        self, cfg: DeepDiveConfig, engine: Engine, cluster: str, clock: Callable[[], datetime]
    ) -> None:
        self.cfg, self.engine, self.cluster, self.clock = cfg, engine, cluster, clock
        self.agents = Agents(cfg)
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.captures: dict[str, Capture] = {}  # workload uid -> its last stall's stacks
        self.stalls_captured = 0

    def expire(self) -> int:
        """Tasks left pending or running past their deadline (the replica running them
        stopped) ended failed; how many. At start: a task runs on one replica's thread."""
        t = schema.pyspy_tasks
        now = self.clock()
        ended = 0
        with self.engine.begin() as conn:
            rows = conn.execute(
                select(t.c.task_id, t.c.options, t.c.created_at).where(
                    t.c.cluster == self.cluster, t.c.status.in_(("pending", "running"))
                )
            )
            for r in rows.all():
                created = r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=UTC)
                late = int(r.options.get("duration") or 0) + self.cfg.timeout_seconds + 60
                if (now - created).total_seconds() > late:
                    conn.execute(
                        update(t)
                        .where(t.c.task_id == r.task_id)
                        .values(
                            status="failed",
                            completed_at=now,
                            error="the recorder running it stopped before it ended",
                        )
                    )
                    ended += 1
        return ended

    # -- the process tree ------------------------------------------------------------
    def process_tree(self, conn: Connection, tables: Any, pod_uid: str) -> dict[str, Any]:
        from lens_ebpf.protocol.gen import deepdive_pb2 as pb

        self._on()
        pod = pod_place(conn, tables, pod_uid)
        got = self.agents.call(
            pod.node,
            pod.address,
            "ProcessTree",
            pb.ProcessTreeRequest(pod_uid=pod_uid),
            self.cfg.timeout_seconds,
        )
        containers = [tree_of(list(c.processes), c, pod) for c in got.containers]
        return {
            "pod_name": got.pod_name or pod.name,
            "pod_namespace": got.pod_namespace or pod.namespace,
            "pod_uid": pod_uid,
            "node_name": pod.node,
            "containers": containers,
            "total_processes": sum(c["process_count"] for c in containers),
            "total_python": sum(c["python_count"] for c in containers),
            "collected_at": stamp(self.clock()),
        }

    def _on(self) -> None:
        if not self.cfg.enabled:
            raise Unavailable("the deep dive is off (recorder.deepdive.enabled)")

    # -- py-spy tasks --------------------------------------------------------------------
    def create(
        self,
        conn: Connection,
        tables: Any,
        pod_uid: str,
        pid: int,
        node: str,
        fmt: str,
        duration: int,
        rate: int,
        native: bool = False,
        subprocesses: bool = False,
        locals_: bool = False,
        workload_uid: str = "",
        reason: str = "requested",
    ) -> dict[str, Any]:
        """A pending task, started at once on a thread; its row as the API answers it."""
        self._on()
        if fmt not in FORMATS:
            raise BadRequest(f"format {fmt!r}: one of {', '.join(FORMATS)}")
        if not 1 <= duration <= self.cfg.max_duration_seconds:
            raise BadRequest(
                f"duration {duration}: 1 to {self.cfg.max_duration_seconds} s "
                "(recorder.deepdive.max_duration_seconds)"
            )
        if not 1 <= rate <= 1000:
            raise BadRequest(f"rate {rate}: 1 to 1000 samples a second")
        if pid <= 0:
            raise BadRequest("pid: a host pid is required")
        pod = pod_place(conn, tables, pod_uid)
        if node and node != pod.node:
            raise BadRequest(
                f"pod {pod.namespace}/{pod.name} runs on node {pod.node}, not " f"{node}"
            )
        task = f"pyspy-{uuid.uuid4().hex[:8]}"
        row = {
            "cluster": self.cluster,
            "task_id": task,
            "status": "pending",
            "workload_uid": workload_uid or pod.workload_uid,
            "pod_uid": pod_uid,
            "pod_name": pod.name,
            "pod_namespace": pod.namespace,
            "node_name": pod.node,
            "pid": pid,
            "action": "dump" if fmt == "dump" else "record",
            "options": {
                "duration": duration,
                "rate": rate,
                "format": fmt,
                "native": native,
                "subprocesses": subprocesses,
                "locals": locals_,
            },
            "reason": reason,
            "output_file": "",
            "file_size": 0,
            "content": None,
            "error": "",
            "created_at": self.clock(),
        }
        conn.execute(insert(schema.pyspy_tasks).values(row))
        self.start(task, pod)
        return task_view(row)

    def start(self, task: str, pod: PodPlace) -> threading.Thread:
        """Run a created task (once its row is committed)."""
        t = threading.Thread(target=self._run, args=(task, pod), name=f"pyspy-{task}", daemon=True)
        t.start()
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        return t

    def _row(self, task: str) -> Any:
        t = schema.pyspy_tasks
        with self.engine.connect() as conn:
            return conn.execute(select(t).where(t.c.task_id == task)).first()

    def _set(self, task: str, only_from: tuple[str, ...], **values: Any) -> bool:
        """Update the task's row while its status is one of only_from; whether it was."""
        t = schema.pyspy_tasks
        with self.engine.begin() as conn:
            got = conn.execute(
                update(t).where(t.c.task_id == task, t.c.status.in_(only_from)).values(**values)
            )
        return bool(got.rowcount)

    def _run(self, task: str, pod: PodPlace) -> None:
        import grpc

        from lens_ebpf.protocol.gen import deepdive_pb2 as pb

        row = self._row(task)
        for _ in range(100):  # the request that made it commits it as it answers
            if row is not None or self._stop.wait(0.05):
                break
            row = self._row(task)
        if row is None or not self._set(
            task, ("pending",), status="running", started_at=self.clock()
        ):
            return  # cancelled before it started
        o = row.options
        req = pb.PySpyRequest(
            pod_uid=row.pod_uid,
            pid=row.pid,
            action=row.action,
            duration_seconds=o["duration"],
            rate=o["rate"],
            format="speedscope" if o["format"] == "dump" else o["format"],
            native=o["native"],
            subprocesses=o["subprocesses"],
            locals=o["locals"],
            task_id=task,
        )
        limit = (o["duration"] if row.action == "record" else 0) + self.cfg.timeout_seconds + 10
        try:
            fut = self.agents.start(pod.node, pod.address, "PySpy", req, limit)
            while True:
                try:
                    got = self.agents.result(pod.node, fut, 0.5)
                    break
                except grpc.FutureTimeoutError:
                    if self._stop.is_set() or self._status(task) == "cancelled":
                        fut.cancel()  # the agent kills py-spy
                        return
        except Exception as exc:  # the agent's refusal, or none reached
            self._set(
                task,
                ("running",),
                status="failed",
                error=str(exc)[:2000],
                completed_at=self.clock(),
            )
            log.info("py-spy task %s failed: %s", task, exc)
            return
        name = f"{task}.{EXT[o['format']]}"
        data = bytes(got.output)
        self._set(
            task,
            ("running",),
            status="completed",
            content=data,
            file_size=len(data),
            output_file=name,
            completed_at=self.clock(),
        )

    def _status(self, task: str) -> str:
        row = self._row(task)
        if row is None:
            return "cancelled"
        status: str = row.status
        return status

    def cancel(self, conn: Connection, task: str, reason: str) -> dict[str, Any]:
        t = schema.pyspy_tasks
        mine = (t.c.task_id == task, t.c.cluster == self.cluster)
        row = conn.execute(select(t.c.status).where(*mine)).first()
        if row is None:
            raise NotFound(f"task {task} not found")
        if row.status in ENDED:
            raise BadRequest(f"cannot cancel task in status: {row.status}")
        conn.execute(
            update(t)
            .where(t.c.task_id == task)
            .values(
                status="cancelled",
                completed_at=self.clock(),
                error=f"cancelled: {reason}" if reason else "cancelled",
            )
        )
        return {"task_id": task, "status": "cancelled", "message": "task cancelled"}

    # -- the stacks at a stall -----------------------------------------------------------
    def stall(self, workload_uid: str, at: datetime, why: str) -> None:
        """A training stall opened: each rank's stack (recorder.deepdive.stall_stacks)."""
        self._capture(workload_uid, why, "", at)

    def hang(self, workload_uid: str, alert_id: str, name: str) -> None:
        """A hang's log alert fired: each rank's stack, kept with that alert."""
        self._capture(workload_uid, name, alert_id, None)

    def _capture(self, uid: str, why: str, alert_id: str, stall_at: datetime | None) -> None:
        """Once per stall: a workload's capture serves every trigger within
        stall_repeat_seconds (the stall, and each rank's watchdog line); a later trigger
        of the same workload takes its alert along."""
        if not (self.cfg.enabled and self.cfg.stall_stacks):
            return
        now = self.clock()
        with self._lock:
            held = self.captures.get(uid)
            fresh = (
                held is not None
                and (now - held.started).total_seconds() < self.cfg.stall_repeat_seconds
            )
            if fresh:
                assert held is not None
                if alert_id:
                    held.alerts.append(alert_id)
                if stall_at is not None:
                    held.stall_at = stall_at
                done = held.summary is not None
            else:
                held = Capture(uid, why, now, [alert_id] if alert_id else [], stall_at)
                self.captures[uid] = held
                self.stalls_captured += 1
        if not fresh:
            t = threading.Thread(
                target=self._take, args=(held,), name=f"stall-{uid[:8]}", daemon=True
            )
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
        elif done:
            self._keep_soon(held)  # the capture made already goes with this alert too

    def _take(self, cap: Capture) -> None:
        """A py-spy dump of each running pod's main Python process, at once; kept as tasks
        (reason stall), compared, and put with the alert and on the timeline."""
        try:
            with self.engine.connect() as conn:
                pods = workload_pods(conn, schema.scoped(self.cluster), cap.workload_uid)
            ranks = [self._rank(p) for p in pods]
            started = [(r, self._dump(r)) for r in ranks]
            for r, fut in started:
                self._finish(r, fut, cap)
        except Exception as exc:  # noqa: BLE001 (a capture that fails is said, not raised)
            log.warning("stall stacks of workload %s: %s", cap.workload_uid, exc)
            ranks = []
        cap.summary = compare(ranks, cap.why, stamp(self.clock()) or "")
        if not any(r["stack"] for r in ranks):  # no agent reached, no Python: nothing to keep
            why = "; ".join(f"{r['pod']}: {r['error']}" for r in ranks) or "no pods"
            log.info("stall stacks of workload %s: none read (%s)", cap.workload_uid, why)
            return
        self._keep(cap)
        self._keep_soon(cap)

    def _keep_soon(self, cap: Capture) -> None:
        """The capture with the alerts not stored yet (their write is queued behind the
        trigger), looked for a few times over KEEP_TRIES x 0.2 s."""

        def again() -> None:
            for _ in range(KEEP_TRIES):
                with self._lock:
                    waiting = bool(cap.alerts)
                if not waiting or self._stop.wait(0.2):
                    return
                self._keep(cap)

        t = threading.Thread(target=again, name="stall-keep", daemon=True)
        t.start()
        self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _rank(self, pod: PodPlace) -> dict[str, Any]:
        """The pod's main Python process (the Python one nearest its container's init)."""
        from lens_ebpf.protocol.gen import deepdive_pb2 as pb

        r: dict[str, Any] = {
            "pod": pod.name,
            "pod_uid": pod.uid,
            "node": pod.node,
            "pid": 0,
            "task_id": "",
            "status": "failed",
            "error": "",
            "stack": [],
            "_pod": pod,
        }
        try:
            tree = self.agents.call(
                pod.node,
                pod.address,
                "ProcessTree",
                pb.ProcessTreeRequest(pod_uid=pod.uid),
                self.cfg.timeout_seconds,
            )
        except Exception as exc:  # noqa: BLE001
            r["error"] = str(exc)
            return r
        pythons = [p for c in tree.containers for p in c.processes if p.is_python]
        if not pythons:
            r["error"] = "no Python process in the pod"
            return r
        main = min(pythons, key=lambda p: (p.container_pid or 1 << 30, p.host_pid))
        r["pid"] = main.host_pid
        return r

    def _dump(self, r: dict[str, Any]) -> Any:
        from lens_ebpf.protocol.gen import deepdive_pb2 as pb

        if not r["pid"]:
            return None
        pod: PodPlace = r["_pod"]
        req = pb.PySpyRequest(pod_uid=pod.uid, pid=r["pid"], action="dump")
        try:
            return self.agents.start(pod.node, pod.address, "PySpy", req, self.cfg.timeout_seconds)
        except Exception as exc:  # noqa: BLE001
            r["error"] = str(exc)
            return None

    def _finish(self, r: dict[str, Any], fut: Any, cap: Capture) -> None:
        """The dump's answer into r (stack: the main thread's frames, innermost first) and
        its task row."""
        pod: PodPlace = r.pop("_pod")
        data = b""
        if fut is not None:
            try:
                data = bytes(self.agents.result(pod.node, fut).output)
                r["stack"] = main_stack(data)
                r["status"] = "completed"
            except Exception as exc:  # noqa: BLE001
                r["error"] = str(exc)
        if not r["pid"]:
            return
        task = f"pyspy-{uuid.uuid4().hex[:8]}"
        now = self.clock()
        row = {
            "cluster": self.cluster,
            "task_id": task,
            "status": r["status"],
            "workload_uid": cap.workload_uid,
            "pod_uid": pod.uid,
            "pod_name": pod.name,
            "pod_namespace": pod.namespace,
            "node_name": pod.node,
            "pid": r["pid"],
            "action": "dump",
            "options": {
                "duration": 0,
                "rate": 0,
                "format": "dump",
                "native": False,
                "subprocesses": False,
                "locals": False,
            },
            "reason": "stall",
            "output_file": f"{task}.dump.json" if data else "",
            "file_size": len(data),
            "content": data or None,
            "error": r["error"][:2000],
            "created_at": now,
            "started_at": now,
            "completed_at": now,
        }
        with self.engine.begin() as conn:
            conn.execute(insert(schema.pyspy_tasks).values(row))
        r["task_id"] = task

    def _keep(self, cap: Capture) -> None:
        """The capture with its alerts (raw_data.stacks), on the stall's training event
        (detail.stacks: the alert made from it later carries it) and on the workload's
        timeline (a stall_stacks event)."""
        if cap.summary is None or not any(r["stack"] for r in cap.summary["ranks"]):
            return
        ae, ev = schema.alert_events, schema.training_events
        with self._lock:
            alerts, cap.alerts = list(cap.alerts), []
            first = not cap.kept
            cap.kept = True
        with self.engine.begin() as conn:
            stalled = conn.execute(
                select(ev.c.id, ev.c.detail)
                .where(
                    ev.c.cluster == self.cluster,
                    ev.c.workload_uid == cap.workload_uid,
                    ev.c.kind == "training_stalled",
                    ev.c.ended_at.is_(None),
                )
                .order_by(ev.c.at.desc())
            ).first()
            if stalled is not None:
                conn.execute(
                    update(ev)
                    .where(ev.c.id == stalled.id)
                    .values(detail={**(stalled.detail or {}), "stacks": cap.summary})
                )
                alerts.append(f"lens-te-{self.cluster}-{stalled.id}")
            for aid in dict.fromkeys(alerts):
                got = conn.execute(select(ae.c.raw_data).where(ae.c.id == aid)).first()
                if got is not None:
                    conn.execute(
                        update(ae)
                        .where(ae.c.id == aid)
                        .values(raw_data={**(got.raw_data or {}), "stacks": cap.summary})
                    )
                else:
                    with self._lock:  # not stored yet: looked for again (_keep_soon)
                        if aid not in cap.alerts:
                            cap.alerts.append(aid)
            if first:
                row = conn.execute(
                    select(ev.c.namespace, ev.c.workload)
                    .where(ev.c.cluster == self.cluster, ev.c.workload_uid == cap.workload_uid)
                    .limit(1)
                ).first()
                conn.execute(
                    insert(ev).values(
                        cluster=self.cluster,
                        workload_uid=cap.workload_uid,
                        namespace=row.namespace if row else "",
                        workload=row.workload if row else "",
                        pod_uid="",
                        pod="",
                        node="",
                        kind="stall_stacks",
                        signal="",
                        at=self.clock(),
                        ended_at=None,
                        iteration=None,
                        value=None,
                        baseline=None,
                        detail=cap.summary,
                    )
                )

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self.agents.close()
