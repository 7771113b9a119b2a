"""What the Management pages ask done to a cluster, as tasks: initialize (the agent's
DaemonSet, its RBAC and the rest of deploy/agent installed), deploy and rollback (the same
with a release's image). A task is a row made by the request; the leader runs pending
ones (a job of its runner, recorder.management.task_seconds), each object's outcome a line
of its logs as it goes (the page tails them), then completed or failed with the error."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, select, update

from lens_ebpf.k8s.reflector import describe
from lens_ebpf.recorder.alerts.model import when
from lens_ebpf.recorder.errors import BadRequest, Conflict, NotFound
from lens_ebpf.recorder.management import manifest
from lens_ebpf.recorder.management.clusters import MC, TASKS
from lens_ebpf.recorder.store.writer import Op, Writer
from lens_ebpf.recorder.tracker.clusters import Clusters

log = logging.getLogger(__name__)
ACTIVE = ("pending", "running")
SCOPES = ("infrastructure", "apps", "full")
LOG_TAIL_MAX = 100_000


def task_json(r: Any) -> dict[str, Any]:
    """TaskResponse (started_at and completed_at left out until they are)."""
    out = {
        "id": int(r.id),
        "cluster_name": r.cluster_name,
        "task_type": r.task_type,
        "install_scope": r.install_scope,
        "current_stage": r.current_stage,
        "storage_mode": "external",
        "status": r.status,
        "error_message": r.error_message,
        "retry_count": int(r.retry_count),
        "max_retries": int(r.max_retries),
        "job_name": r.job_name,
        "job_namespace": r.job_namespace,
        "created_at": when(r.created_at) or "",
        "updated_at": when(r.updated_at) or "",
        "started_at": when(r.started_at),
        "completed_at": when(r.completed_at),
        "action": r.action,
        "image": r.image,
    }
    return {k: v for k, v in out.items() if v is not None}


def history_json(r: Any, versions: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """ReleaseHistory: a deploy or rollback task as the Release page's history reads it."""
    vid = int(r.release_version_id or 0)
    out: dict[str, Any] = {
        "id": int(r.id),
        "cluster_name": r.cluster_name,
        "release_version_id": vid,
        "action": r.action,
        "triggered_by": r.triggered_by,
        "values_snapshot": r.values_snapshot or {},
        "previous_version_id": (r.values_snapshot or {}).get("previous_version_id"),
        "status": r.status,
        "error_message": r.error_message,
        "stages_completed": [line for line in (r.logs or "").splitlines() if line][-20:],
        "task_id": int(r.id),
        "created_at": when(r.created_at),
        "started_at": when(r.started_at),
        "completed_at": when(r.completed_at),
    }
    if vid in versions:
        out["release_version"] = versions[vid]
    return out


class Tasks:
    """Tasks made by requests, run by the leader."""

    def __init__(
        self,
        engine: Engine,
        writer: Writer,
        clusters: Clusters,
        timeout: float,
        image: Callable[[], str],
        clock: Callable[[], datetime],
        done: Callable[[str], object] = lambda cluster: None,
    ) -> None:
        self.engine, self.writer, self.clusters, self.timeout = engine, writer, clusters, timeout
        self.image, self.clock, self.done = image, clock, done
        self.taken: set[int] = set()  # run here already (their rows may not be written yet)
        self.runs: dict[str, int] = {"completed": 0, "failed": 0}
        self._lock = threading.Lock()

    # -- made by requests ---------------------------------------------------------------------
    def create(
        self,
        conn: Connection,
        cluster: str,
        scope: str,
        action: str,
        now: datetime,
        who: str,
        image: str = "",
        version_id: int | None = None,
        values: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if self.clusters.get(cluster) is None:
            raise NotFound(f"Cluster not found: {cluster!r}")
        if scope not in SCOPES:
            raise BadRequest(f"scope={scope!r}: one of {', '.join(SCOPES)}")
        active = conn.execute(
            select(TASKS.c.id).where(TASKS.c.cluster_name == cluster, TASKS.c.status.in_(ACTIVE))
        ).first()
        if active is not None:
            raise Conflict(f"cluster {cluster}: task {active.id} is under way already")
        image = image or self.image() or manifest.agent_image()
        row = {
            "cluster_name": cluster,
            "task_type": "install",
            "install_scope": scope,
            "action": action,
            "current_stage": "pending",
            "status": "pending",
            "error_message": "",
            "retry_count": 0,
            "max_retries": 0,
            "job_name": f"lens-ebpf-{action}",
            "job_namespace": self.namespace(),
            "image": image,
            "release_version_id": version_id,
            "values_snapshot": values or {"image": image},
            "triggered_by": who,
            "logs": f"{when(now)} {action} requested by {who or 'api'}: image {image}\n",
            "created_at": now,
            "updated_at": now,
            "started_at": None,
            "completed_at": None,
        }
        ident: int = conn.execute(TASKS.insert().returning(TASKS.c.id), row).scalar_one()
        return {
            "task_id": int(ident),
            "status": "pending",
            "message": "Infrastructure initialization task created"
            if scope == "infrastructure"
            else f"{action} task created",
        }

    @staticmethod
    def namespace() -> str:
        ns = next(d for d in manifest.objects() if d["kind"] == "Namespace")
        return str(ns["metadata"]["name"])

    # -- run by the leader --------------------------------------------------------------------
    def run(self) -> int:
        """Every pending task, one after another; how many ran."""
        with self.engine.connect() as conn:
            pending = list(
                conn.execute(select(TASKS).where(TASKS.c.status == "pending").order_by(TASKS.c.id))
            )
        n = 0
        for task in pending:
            with self._lock:
                if task.id in self.taken:
                    continue
                self.taken.add(task.id)
            self.run_one(task)
            n += 1
        return n

    def _set(self, ident: int, **values: Any) -> None:
        def write(conn: Connection) -> None:
            conn.execute(update(TASKS).where(TASKS.c.id == ident).values(**values))

        self.writer.submit(Op("cluster_tasks", write))

    def run_one(self, task: Any) -> bool:
        logs = [task.logs.rstrip("\n")] if task.logs else []

        def say(line: str) -> None:
            logs.append(f"{when(self.clock())} {line}")
            self._set(
                task.id,
                logs="\n".join(logs)[-LOG_TAIL_MAX:] + "\n",
                current_stage=line[:64],
                updated_at=self.clock(),
            )

        self._set(task.id, status="running", started_at=self.clock(), updated_at=self.clock())
        w = self.clusters.get(task.cluster_name)
        try:
            if w is None or w.client is None:
                raise RuntimeError(
                    f"cluster {task.cluster_name}: "
                    f"{w.error if w is not None else 'not followed any more'}"
                )
            api = manifest.RawApi(w.client, self.timeout)
            say(f"cluster {task.cluster_name}: API {api.version()} at {manifest_server(w)}")
            docs = manifest.objects(task.image)
            say(f"installing {len(docs)} objects of deploy/agent, image {task.image}")
            manifest.apply(api, docs, say)
        except Exception as exc:
            why = describe(exc)
            say(f"failed: {why}")
            self._finish(task, "failed", why, logs)
            return False
        say("done: the agent's DaemonSet and its RBAC are installed")
        self._finish(task, "completed", "", logs)
        return True

    def _finish(self, task: Any, status: str, error: str, logs: list[str]) -> None:
        now = self.clock()
        self._set(
            task.id,
            status=status,
            error_message=error,
            completed_at=now,
            updated_at=now,
            current_stage=status,
            logs="\n".join(logs)[-LOG_TAIL_MAX:] + "\n",
        )
        if status == "completed" and task.release_version_id is not None:
            vid, values = task.release_version_id, task.values_snapshot or {}

            def deployed(conn: Connection) -> None:
                conn.execute(
                    update(MC)
                    .where(MC.c.cluster_name == task.cluster_name)
                    .values(
                        deployed_version_id=vid,
                        deployed_values=values,
                        deployed_at=now,
                        updated_at=now,
                    )
                )

            self.writer.submit(Op("managed_clusters", deployed))
        self.runs[status] += 1
        log.info(
            "recorder: cluster %s: task %d (%s) %s%s",
            task.cluster_name,
            task.id,
            task.action,
            status,
            f": {error}" if error else "",
        )
        try:
            self.done(task.cluster_name)
        except Exception as exc:  # its scan is a reading: the task stands
            log.warning(
                "recorder: cluster %s: after task %d: %s", task.cluster_name, task.id, describe(exc)
            )


def manifest_server(w: Any) -> str:
    return str(getattr(getattr(w.client, "configuration", None), "host", ""))


# -- the page's questions -----------------------------------------------------------------------
def _task(conn: Connection, cluster: str, ident: int) -> Any:
    r = conn.execute(select(TASKS).where(TASKS.c.id == ident)).first()
    if r is None or r.cluster_name != cluster:
        raise NotFound(f"Task not found for this cluster: {ident}")
    return r


def listing(conn: Connection, cluster: str, scope: str, limit: int) -> dict[str, Any]:
    q = select(TASKS).where(TASKS.c.cluster_name == cluster)
    if scope:
        q = q.where(TASKS.c.install_scope == scope)
    rows = conn.execute(q.order_by(TASKS.c.id.desc()).limit(limit))
    return {"data": [task_json(r) for r in rows]}


def one(conn: Connection, cluster: str, ident: int) -> dict[str, Any]:
    return task_json(_task(conn, cluster, ident))


def active(conn: Connection, cluster: str, scope: str) -> dict[str, Any]:
    q = select(TASKS).where(TASKS.c.cluster_name == cluster, TASKS.c.status.in_(ACTIVE))
    if scope:
        q = q.where(TASKS.c.install_scope == scope)
    r = conn.execute(q.order_by(TASKS.c.id.desc()).limit(1)).first()
    if r is None:
        raise NotFound("No active task found")
    return task_json(r)


def logs(conn: Connection, cluster: str, ident: int, tail: int) -> dict[str, Any]:
    r = _task(conn, cluster, ident)
    lines = (r.logs or "").splitlines()[-tail:]
    text = "\n".join(lines) + ("\n" if lines else "")
    return {
        "task_id": int(r.id),
        "job_name": r.job_name,
        "pod_name": "",
        "logs": text,
        "log_lines": len(lines),
        "status": r.status,
    }


def infrastructure(conn: Connection, cluster: str, status: str, message: str) -> dict[str, Any]:
    """GetInfrastructureStatus: whether the agent is installed, the last such task."""
    out: dict[str, Any] = {
        "cluster_name": cluster,
        "initialized": status == "ready",
        "storage_mode": "external",
        "status": status,
        "message": message,
    }
    r = conn.execute(
        select(TASKS)
        .where(TASKS.c.cluster_name == cluster, TASKS.c.install_scope == "infrastructure")
        .order_by(TASKS.c.id.desc())
        .limit(1)
    ).first()
    if r is not None:
        out["infrastructure_time"] = when(r.completed_at or r.created_at)
        last = {
            "id": int(r.id),
            "scope": r.install_scope,
            "status": r.status,
            "current_stage": r.current_stage,
            "error_message": r.error_message,
            "created_at": when(r.created_at),
        }
        if r.completed_at is not None:
            last["completed_at"] = when(r.completed_at)
        out["last_task"] = last
    return out
