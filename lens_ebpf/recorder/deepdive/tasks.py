"""py-spy tasks as the API reads them: their states and formats, a task in the original's
TaskResponse shape, a page of them, and a task's file."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from lens_ebpf.recorder.errors import NotFound
from lens_ebpf.recorder.store import schema

FORMATS = ("flamegraph", "speedscope", "raw", "dump")  # dump: py-spy dump, each thread's stack
EXT = {"flamegraph": "svg", "speedscope": "json", "raw": "txt", "dump": "dump.json"}
TYPES = {
    "flamegraph": "image/svg+xml",
    "speedscope": "application/json",
    "raw": "text/plain",
    "dump": "application/json",
}
ENDED = ("completed", "failed", "cancelled")
STATUSES = ("pending", "running", *ENDED)


def stamp(t: datetime | None) -> str | None:
    if t is None:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def task_view(row: Any) -> dict[str, Any]:
    """A task in the original's TaskResponse shape (omitempty fields left out when empty)."""
    r = row if isinstance(row, dict) else row._mapping
    o = r["options"]
    out: dict[str, Any] = {
        "task_id": r["task_id"],
        "status": r["status"],
        "pod_uid": r["pod_uid"],
        "pod_name": r["pod_name"],
        "pod_namespace": r["pod_namespace"],
        "node_name": r["node_name"],
        "pid": r["pid"],
        "duration": o["duration"],
        "format": o["format"],
        "created_at": stamp(r["created_at"]),
    }
    if r["output_file"]:
        out["output_file"] = r["output_file"]
    if r["file_size"]:
        out["file_size"] = r["file_size"]
    if r["error"]:
        out["error"] = r["error"]
    for k in ("started_at", "completed_at"):
        if r.get(k) is not None:
            out[k] = stamp(r[k])
    if r["status"] == "completed" and r["output_file"]:
        out["file_path"] = f"/v1/pyspy/file/{r['task_id']}/{r['output_file']}"
    return out


LIST = [c for c in schema.pyspy_tasks.c if c.name != "content"]


def get_task(conn: Connection, tables: Any, task: str) -> dict[str, Any]:
    t = tables.pyspy_tasks
    row = conn.execute(select(*[t.c[c.name] for c in LIST]).where(t.c.task_id == task)).first()
    if row is None:
        raise NotFound(f"task {task} not found")
    return task_view(row)


def list_tasks(
    conn: Connection, tables: Any, filters: dict[str, str], limit: int, offset: int
) -> dict[str, Any]:
    """{tasks, total, limit, offset}, newest first."""
    t = tables.pyspy_tasks
    cond = [t.c[k] == v for k, v in filters.items() if v]
    total = conn.execute(select(func.count()).select_from(t).where(*cond)).scalar_one()
    rows = conn.execute(
        select(*[t.c[c.name] for c in LIST])
        .where(*cond)
        .order_by(t.c.created_at.desc(), t.c.task_id)
        .offset(offset)
        .limit(limit)
    )
    return {
        "tasks": [task_view(r) for r in rows],
        "total": int(total),
        "limit": limit,
        "offset": offset,
    }


def task_file(conn: Connection, tables: Any, task: str, name: str) -> tuple[str, bytes]:
    """(its media type, its bytes); NotFound while there is no such file."""
    t = tables.pyspy_tasks
    row = conn.execute(
        select(t.c.output_file, t.c.options, t.c.content, t.c.status).where(t.c.task_id == task)
    ).first()
    if row is None:
        raise NotFound(f"task {task} not found")
    if row.status != "completed" or row.content is None:
        raise NotFound(f"task {task} has no file ({row.status})")
    if name and name != row.output_file:
        raise NotFound(f"task {task} has no file {name!r} (it has {row.output_file})")
    return TYPES[row.options["format"]], bytes(row.content)


def task_files(conn: Connection, tables: Any, task: str, cluster: str) -> dict[str, Any]:
    """The original's GET pyspy/file/{task_id}: the task's file, where it has one."""
    got = get_task(conn, tables, task)
    files = []
    if got.get("file_path"):
        files.append(
            {
                "task_id": task,
                "file_name": got["output_file"],
                "format": got["format"],
                "file_size": got.get("file_size", 0),
                "storage_type": "database",
                "storage_path": f"pyspy_tasks/{task}",
                "download_url": f"{got['file_path']}?cluster={cluster}",
            }
        )
    return {"task_id": task, "files": files}
