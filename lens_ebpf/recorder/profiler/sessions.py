"""The TraceLens and trace-viewer pages' sessions over fetched profiler traces, with the
lifecycle the pages poll: pending -> initializing -> ready (or failed), expired once past
their time, deleted when asked.

A TraceLens session analyses its trace and its sibling ranks (the workload's other traces
in the same directory of the same container, as torch.profiler writes one a rank) with
HolisticTraceAnalysis (analysis.py) and is served as a page at its ui_path and as
JSON; a viewer session serves its trace to the viewer (speedscope) at its ui_path."""

from __future__ import annotations

import gzip
import logging
import threading
import uuid
import zlib
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Engine

from lens_ebpf.core.times import aware
from lens_ebpf.recorder.config import ProfilerConfig
from lens_ebpf.recorder.errors import BadRequest, NotFound
from lens_ebpf.recorder.profiler import analysis as trace_analysis
from lens_ebpf.recorder.profiler.files import Profiler, stamp
from lens_ebpf.recorder.store import schema

log = logging.getLogger(__name__)
KINDS = {"tracelens": 60, "perfetto": 30}  # each kind's default minutes to live
MOST_MINUTES = {"tracelens": 120, "perfetto": 60}  # an extension, at most (the original's)
MAX_TTL = 24 * 60
PROFILES = [  # the original's ResourceProfileResponse: what an analysis may take
    {
        "value": "small",
        "label": "Small",
        "description": "one rank, a trace up to 100 MB",
        "memory": "4Gi",
        "memory_bytes": 4 << 30,
        "cpu": 1,
        "is_default": False,
    },
    {
        "value": "medium",
        "label": "Medium",
        "description": "a few ranks, traces up to 500 MB",
        "memory": "8Gi",
        "memory_bytes": 8 << 30,
        "cpu": 2,
        "is_default": True,
    },
    {
        "value": "large",
        "label": "Large",
        "description": "many ranks, or traces over 500 MB",
        "memory": "16Gi",
        "memory_bytes": 16 << 30,
        "cpu": 4,
        "is_default": False,
    },
]
ENDED = ("failed", "expired", "deleted")


def integer(v: Any, name: str, default: int, low: int, high: int) -> int:
    if v is None or v == "":
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or int(v) != v:
        raise BadRequest(f"{name}={v!r}: a whole number")
    if not low <= int(v) <= high:
        raise BadRequest(f"{name}={v}: {low}..{high}")
    return int(v)


def expiry(r: Any) -> datetime:
    got = aware(r.expires_at)
    assert got is not None, "expires_at is NOT NULL"
    return got


def decompressed(data: bytes, most: int) -> bytes:
    """A trace's JSON (a .gz one inflated, at most most bytes)."""
    if data[:2] != b"\x1f\x8b":
        return data
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(data, most)
    if d.unconsumed_tail:
        raise BadRequest(f"the trace inflates to more than {most} bytes")
    return out


def for_viewer(text: bytes) -> bytes:
    """A Kineto trace as speedscope opens it: its GPU streams' and other string pids and
    tids (`"tid": "stream 7"`) numbered (speedscope keys threads by their number and loses
    those), each keeping its name as a thread_name or process_name event."""
    import orjson

    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the trace is not JSON: {exc}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise BadRequest("the trace has no traceEvents list (not a Chrome/Kineto trace)")
    ids: dict[Any, int] = {}
    named: list[dict[str, Any]] = []

    def number(v: Any, pid: Any = None) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        key = (pid, v)
        if key not in ids:
            ids[key] = 1_000_000 + len(ids)
            what = "thread_name" if pid is not None else "process_name"
            named.append(
                {
                    "ph": "M",
                    "name": what,
                    "pid": pid if pid is not None else ids[key],
                    "tid": ids[key],
                    "args": {"name": str(v)},
                }
            )
        return ids[key]

    for e in events:
        if not isinstance(e, dict):
            continue
        if "pid" in e:
            e["pid"] = number(e["pid"])
        if "tid" in e:
            e["tid"] = number(e["tid"], e.get("pid"))
    for n in named:
        if n["name"] == "thread_name":
            n["pid"] = n["pid"] if isinstance(n["pid"], int) else number(n["pid"])
    doc["traceEvents"] = events + named
    return orjson.dumps(doc)


class Sessions:
    def __init__(
        self, cfg: ProfilerConfig, engine: Engine, profiler: Profiler, clock: Callable[[], datetime]
    ) -> None:
        self.cfg, self.engine, self.profiler, self.clock = cfg, engine, profiler, clock
        self._slots = threading.Semaphore(cfg.analysis_workers)
        self._threads: list[threading.Thread] = []

    # -- the answers -------------------------------------------------------------------
    def answer(self, r: Any) -> dict[str, Any]:
        """SessionResponse (tracelens or perfetto) of a row, and ours beyond it."""
        status = r.status
        if status not in ENDED and expiry(r) <= self.clock():
            status = "expired"
        out: dict[str, Any] = {
            "session_id": r.session_id,
            "cluster_name": r.cluster,
            "workload_uid": r.workload_uid,
            "profiler_file_id": r.profiler_file_id,
            "profiler_file_ids": list(r.file_ids),
            "status": status,
            "status_message": r.status_message,
            "ui_path": f"/v1/{r.kind}/sessions/{r.session_id}/ui/" if status == "ready" else "",
            "pod_name": "",
            "pod_ip": "",
            "created_at": stamp(r.created_at),
            "ready_at": stamp(r.ready_at) or None,
            "expires_at": stamp(r.expires_at),
            "last_accessed_at": stamp(r.last_accessed_at) or None,
            "estimated_ready_seconds": 0 if status in ("ready", *ENDED) else 10,
        }
        if r.kind == "tracelens":
            out["resource_profile"] = r.resource_profile
            out["analysis"] = r.result if status == "ready" else None
        else:
            out["viewer_type"] = "speedscope"
        return out

    def _row(self, kind: str, cluster: str, session_id: str) -> Any:
        t = schema.profiler_sessions
        with self.engine.connect() as conn:
            r = conn.execute(
                select(t).where(
                    t.c.cluster == cluster, t.c.kind == kind, t.c.session_id == session_id
                )
            ).first()
        if r is None:
            raise NotFound(f"{kind} session {session_id!r} not found")
        return r

    def get(self, kind: str, cluster: str, session_id: str) -> dict[str, Any]:
        self._row(kind, cluster, session_id)
        t = schema.profiler_sessions
        with self.engine.begin() as conn:
            conn.execute(
                update(t).where(t.c.session_id == session_id).values(last_accessed_at=self.clock())
            )
        return self.answer(self._row(kind, cluster, session_id))

    def listing(self, kind: str, cluster: str, workload_uid: str = "") -> dict[str, Any]:
        t = schema.profiler_sessions
        q = select(t).where(t.c.cluster == cluster, t.c.kind == kind, t.c.status != "deleted")
        if workload_uid:
            q = q.where(t.c.workload_uid == workload_uid)
        with self.engine.connect() as conn:
            rows = conn.execute(q.order_by(t.c.created_at.desc())).all()
        sessions = [self.answer(r) for r in rows]
        return {"sessions": sessions, "total": len(sessions)}

    # -- the lifecycle -----------------------------------------------------------------
    def create(self, kind: str, cluster: str, body: dict[str, Any]) -> dict[str, Any]:
        uid = body.get("workload_uid")
        if not isinstance(uid, str) or not uid:
            raise BadRequest("workload_uid is required")
        file_id = integer(body.get("profiler_file_id"), "profiler_file_id", 0, 1, 2**31 - 1)
        if not file_id:
            raise BadRequest("profiler_file_id is required")
        ttl = integer(body.get("ttl_minutes"), "ttl_minutes", KINDS[kind], 1, MAX_TTL)
        profile = body.get("resource_profile") or "medium"
        if kind == "tracelens" and profile not in [p["value"] for p in PROFILES]:
            raise BadRequest(f"resource_profile={profile!r}: small, medium or large")
        f = self.profiler.row(cluster, file_id)
        if f.workload_uid != uid:
            raise BadRequest(f"profiler file {file_id} is not workload {uid}'s")
        ids = [file_id] + (
            self._ranks(cluster, f, body.get("profiler_file_ids")) if kind == "tracelens" else []
        )
        now = self.clock()
        sid = uuid.uuid4().hex
        t = schema.profiler_sessions
        with self.engine.begin() as conn:
            conn.execute(
                insert(t).values(
                    cluster=cluster,
                    session_id=sid,
                    kind=kind,
                    workload_uid=uid,
                    profiler_file_id=file_id,
                    file_ids=ids,
                    status="pending",
                    status_message="",
                    resource_profile=profile if kind == "tracelens" else "",
                    result=None,
                    created_at=now,
                    expires_at=now + timedelta(minutes=ttl),
                )
            )
        th = threading.Thread(
            target=self._prepare,
            args=(kind, cluster, sid, ids),
            name=f"{kind}-{sid[:8]}",
            daemon=True,
        )
        self._threads = [x for x in self._threads if x.is_alive()] + [th]
        th.start()
        return self.answer(self._row(kind, cluster, sid))

    def _ranks(self, cluster: str, f: Any, asked: Any) -> list[int]:
        """The other traces analysed with f: those asked (profiler_file_ids, the
        workload's), else its siblings."""
        if asked is None:
            return self._siblings(cluster, f)
        if not isinstance(asked, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in asked
        ):
            raise BadRequest(f"profiler_file_ids={asked!r}: a list of file ids")
        more = [i for i in dict.fromkeys(asked) if i != f.id]
        if len(more) >= self.cfg.max_ranks:
            raise BadRequest(f"profiler_file_ids: at most {self.cfg.max_ranks} traces a session")
        for i in more:
            if self.profiler.row(cluster, i).workload_uid != f.workload_uid:
                raise BadRequest(f"profiler file {i} is not workload {f.workload_uid}'s")
        return more

    def _siblings(self, cluster: str, f: Any) -> list[int]:
        """The workload's other traces beside f (its directory, its container): its ranks."""
        t = schema.profiler_files
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(t.c.id, t.c.path)
                .where(
                    t.c.cluster == cluster,
                    t.c.workload_uid == f.workload_uid,
                    t.c.pod_uid == f.pod_uid,
                    t.c.container_id == f.container_id,
                    t.c.id != f.id,
                )
                .order_by(t.c.rank, t.c.id)
            ).all()
        here = PurePosixPath(f.path).parent
        return [r.id for r in rows if PurePosixPath(r.path).parent == here][
            : self.cfg.max_ranks - 1
        ]

    def _set(self, sid: str, **values: Any) -> None:
        t = schema.profiler_sessions
        with self.engine.begin() as conn:
            conn.execute(
                update(t).where(t.c.session_id == sid, t.c.status.not_in(ENDED)).values(**values)
            )

    def _prepare(self, kind: str, cluster: str, sid: str, ids: list[int]) -> None:
        """Fetch the traces and, for TraceLens, analyse them; the row says how it went."""
        try:
            with self._slots:
                self._set(sid, status="initializing")
                traces = []
                for i in ids:
                    row, data = self.profiler.read(cluster, i)
                    traces.append((row.file_name, data))
                result = None
                if kind == "tracelens":
                    result = trace_analysis.run(traces, self.cfg.fetch_timeout_seconds)
                    if len(ids) > 1 and len(result["ranks"]) < len(ids):
                        result["note"] = "several traces named the same rank: HTA read one"
                self._set(sid, status="ready", ready_at=self.clock(), result=result)
        except Exception as exc:  # noqa: BLE001  (the session says why; nothing else waits)
            log.info("%s session %s failed: %s", kind, sid, exc)
            self._set(sid, status="failed", status_message=str(exc)[:2000])

    def extend(self, kind: str, cluster: str, sid: str, body: dict[str, Any]) -> dict[str, Any]:
        minutes = integer(body.get("extend_minutes"), "extend_minutes", 0, 1, MOST_MINUTES[kind])
        if not minutes:
            raise BadRequest("extend_minutes is required")
        r = self._row(kind, cluster, sid)
        if r.status in ENDED:
            raise BadRequest(f"session {sid} is {r.status}")
        t = schema.profiler_sessions
        base = max(expiry(r), self.clock())
        with self.engine.begin() as conn:
            conn.execute(
                update(t)
                .where(t.c.session_id == sid)
                .values(expires_at=base + timedelta(minutes=minutes))
            )
        return self.answer(self._row(kind, cluster, sid))

    def delete(self, kind: str, cluster: str, sid: str) -> dict[str, Any]:
        self._row(kind, cluster, sid)
        t = schema.profiler_sessions
        with self.engine.begin() as conn:
            conn.execute(
                update(t).where(t.c.session_id == sid).values(status="deleted", result=None)
            )
        return {"session_id": sid, "status": "deleted", "message": "session deleted"}

    # -- what the pages' iframes load ------------------------------------------------------
    def ready(self, kind: str, cluster: str, sid: str) -> Any:
        r = self._row(kind, cluster, sid)
        got = self.answer(r)
        if got["status"] != "ready":
            why = f": {r.status_message}" if r.status_message else ""
            raise BadRequest(f"session {sid} is {got['status']}{why}")
        return r

    def page(self, cluster: str, sid: str) -> str:
        r = self.ready("tracelens", cluster, sid)
        f = self.profiler.row(cluster, r.profiler_file_id)
        title = f"TraceLens: {f.pod_namespace}/{f.pod_name} {PurePosixPath(f.path).parent}"
        return trace_analysis.html(r.result, title)

    def trace(self, cluster: str, sid: str) -> bytes:
        """The viewer session's trace as JSON (inflated where it was stored gzipped), as
        the viewer opens it (for_viewer)."""
        r = self.ready("perfetto", cluster, sid)
        _, data = self.profiler.read(cluster, r.profiler_file_id)
        try:
            text = decompressed(data, max(self.cfg.max_file_bytes * 20, 1 << 30))
        except (zlib.error, gzip.BadGzipFile, EOFError) as exc:
            raise BadRequest(f"the trace is not gzip it says it is: {exc}") from None
        return for_viewer(text)

    def join(self, timeout: float = 5.0) -> None:
        for th in self._threads:
            th.join(timeout)
