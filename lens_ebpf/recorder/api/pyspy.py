"""The workload page's "Py-Spy Profiler" tab: a pod's process tree, py-spy tasks and their
files, through the agent on the pod's node (recorder/deepdive/), in the original's
shapes (Lens/modules/api/pkg/api/pyspy at dd69b3c)."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder.api.envelope import Ask, bad, integer, param
from lens_ebpf.recorder.deepdive import DeepDive
from lens_ebpf.recorder.deepdive import tasks as stored
from lens_ebpf.recorder.errors import Unavailable

routes = RouteTable()
files = RouteTable()  # the task's file: its own bytes, not the envelope


def dd(ask: Ask) -> DeepDive:
    if ask.app.deepdive is None:
        raise Unavailable("the deep dive is not part of this service")
    return ask.app.deepdive


POD = Param("pod_uid", doc="the pod's uid", required=True, body=True)


@routes.post(
    "workloads/{uid}/process-tree",
    POD,
    Param("pod_name", doc="the pod's name (not needed: the uid says it)", body=True),
    Param("pod_namespace", doc="its namespace (not needed)", body=True),
    Param("include_env", "boolean", "ignored: a process's environment is never read", body=True),
    Param("include_cmdline", "boolean", "ignored: always included", body=True),
    Param("include_resources", "boolean", "ignored: always included", body=True),
    Param("include_gpu", "boolean", "ignored: always included", body=True),
)
def process_tree(ask: Ask) -> Any:
    """A pod's processes, per container as a tree from its init, from the agent on its
    node: host and container pids, command line, state, threads, CPU, RSS, Python or not,
    GPUs held; never the environment."""
    b = ask.body()
    return dd(ask).process_tree(ask.conn, ask.c.tables, str(b["pod_uid"]))


@routes.post(
    "pyspy/sample",
    POD,
    Param("workload_uid", doc="the workload the pod is of (its task history)", body=True),
    Param("pod_name", body=True),
    Param("pod_namespace", body=True),
    Param("node_name", doc="the pod's node (checked)", body=True),
    Param("pid", "integer", "the process's host pid", required=True, body=True),
    Param("duration", "integer", "seconds to sample (default 30)", body=True),
    Param("rate", "integer", "samples a second (default 100)", body=True),
    Param(
        "format",
        doc="flamegraph (default), speedscope, raw, or dump (each " "thread's stack now)",
        body=True,
    ),
    Param("native", "boolean", "native frames too", body=True),
    Param("subprocesses", "boolean", "its subprocesses too", body=True),
    Param("locals", "boolean", "dump: each frame's locals", body=True),
)
def sample(ask: Ask) -> Any:
    """A py-spy task: pending at once, then running on the pod's node, then completed
    (its file at file_path), failed (error says why) or cancelled."""
    b = ask.body()
    pid = b.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise bad("pid: a host pid (a number) is required")
    fmt = str(b.get("format") or "flamegraph")
    if fmt not in stored.FORMATS:
        raise bad(f"format {fmt!r}: one of {', '.join(stored.FORMATS)}")
    return dd(ask).create(
        ask.conn,
        ask.c.tables,
        str(b["pod_uid"]),
        pid,
        str(b.get("node_name") or ""),
        fmt,
        int(b.get("duration") or 30),
        int(b.get("rate") or 100),
        bool(b.get("native")),
        bool(b.get("subprocesses")),
        bool(b.get("locals")),
        str(b.get("workload_uid") or ""),
    )


FILTERS = ("workload_uid", "pod_uid", "pod_namespace", "node_name", "status")
LIST_QUERY = (
    *(Param(f) for f in FILTERS[:-1]),
    Param("status", choices=stored.STATUSES),
    Param("limit", "integer", "tasks a page (default 50, at most 100)", minimum=1, maximum=100),
    Param("offset", "integer", "tasks skipped", minimum=0),
)


@routes.get("pyspy/tasks", *LIST_QUERY)
def tasks(ask: Ask) -> Any:
    """The py-spy tasks, newest first, filtered: {tasks, total, limit, offset}."""
    q = ask.query
    return stored.list_tasks(
        ask.conn,
        ask.c.tables,
        {f: param(q, f) or "" for f in FILTERS},
        integer(q, "limit", 50),
        integer(q, "offset", 0),
    )


@routes.post(
    "pyspy/tasks", *(Param(p.name, p.kind, p.doc, choices=p.choices, body=True) for p in LIST_QUERY)
)
def tasks_post(ask: Ask) -> Any:
    """The same list, its filters in the body (as the web UI asks)."""
    b = ask.body()
    status = str(b.get("status") or "")
    if status and status not in stored.STATUSES:
        raise bad(f"status {status!r}: one of {', '.join(stored.STATUSES)}")
    limit, offset = b.get("limit") or 50, b.get("offset") or 0
    if not isinstance(limit, int) or not isinstance(offset, int) or offset < 0:
        raise bad("limit and offset: whole numbers")
    return stored.list_tasks(
        ask.conn,
        ask.c.tables,
        {f: str(b.get(f) or "") for f in FILTERS},
        min(max(limit, 1), 100),
        offset,
    )


@routes.get("pyspy/task/{id}", Param("id", doc="the task's id", required=True))
def task(ask: Ask) -> Any:
    """One py-spy task: its status, times, error, file."""
    return stored.get_task(ask.conn, ask.c.tables, ask.arg("id"))


@routes.post(
    "pyspy/task/{id}/cancel", Param("id", required=True), Param("reason", doc="why", body=True)
)
def cancel(ask: Ask) -> Any:
    """Cancels a pending or running task (its py-spy is killed on the node)."""
    return dd(ask).cancel(ask.conn, ask.arg("id"), str(ask.body().get("reason") or ""))


@routes.get("pyspy/file/{id}", Param("id", doc="the task's id", required=True))
def task_files(ask: Ask) -> Any:
    """A task's files (one, once it completed): {task_id, files: [{file_name, format,
    file_size, download_url}]}."""
    return stored.task_files(ask.conn, ask.c.tables, ask.arg("id"), ask.c.name)


@files.get(
    "pyspy/file/{id}/{name}", Param("id", required=True), Param("name", required=True), tool=False
)
def task_file(ask: Ask) -> Any:
    """A completed task's file: flamegraph SVG, speedscope JSON, raw text or the dump's
    JSON."""
    ctype, data = stored.task_file(ask.conn, ask.c.tables, ask.arg("id"), ask.arg("name"))
    return 200, ctype, data, {"Content-Disposition": f"attachment; filename={ask.arg('name')}"}
