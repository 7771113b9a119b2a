"""The PyTorch profiler traces of a workload's pods, through their nodes' agents
(lens.v1.ProfilerService, agent/profiler): listed as the agents find them (a row each in
profiler_files), their bytes fetched on request (streamed, size-capped, in chunks of
profiler_file_chunks), served for download, and dropped after the retention.

The recorder calls the agent on the pod's node (nodes.address, recorder.profiler.agent_port)
with its own bearer token (recorder.profiler.token_file). What an agent refuses comes back
as the domain's errors: NotFound (the pod is not on that node, the file is gone),
BadRequest (over the cap), Unavailable (the agent down, or refusing the recorder)."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection, Engine

from lens_ebpf.core.times import aware
from lens_ebpf.recorder.config import ProfilerConfig
from lens_ebpf.recorder.deepdive.channels import AgentChannels
from lens_ebpf.recorder.errors import BadRequest, NotFound, Unavailable
from lens_ebpf.recorder.store import schema

log = logging.getLogger(__name__)
CHUNK = 4 << 20  # bytes a stored chunk holds
CODES = {
    "NOT_FOUND": NotFound,
    "INVALID_ARGUMENT": BadRequest,
    "RESOURCE_EXHAUSTED": BadRequest,
    "FAILED_PRECONDITION": BadRequest,
}


def stamp(t: datetime | None) -> str:
    """RFC 3339 in UTC ("" for none)."""
    t = aware(t)
    return "" if t is None else t.astimezone(UTC).isoformat().replace("+00:00", "Z")


class Agents:
    """ProfilerService calls to the agents."""

    def __init__(self, cfg: ProfilerConfig) -> None:
        self.cfg = cfg
        self.channels = AgentChannels(cfg, "recorder.profiler")

    def stub(self, address: str) -> Any:
        from lens_ebpf.protocol.gen import profiler_pb2_grpc

        return profiler_pb2_grpc.ProfilerServiceStub(self.channels.channel(address))

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return self.channels.metadata()

    @staticmethod
    def error(node: str, exc: Any) -> Exception:
        """The domain's error for an agent's refusal."""
        code, why = exc.code(), exc.details() or ""
        cls = CODES.get(code.name)
        if cls is not None:
            return cls(f"the agent on node {node}: {why}")
        return Unavailable(f"the agent on node {node}: {code.name}: {why}")

    def close(self) -> None:
        self.channels.close()


@dataclass(frozen=True)
class Place:
    uid: str
    name: str
    namespace: str
    node: str
    address: str


def running_pods(conn: Connection, t: Any, workload_uid: str) -> list[Place]:
    """The running pods below the workload (any level), each with its node's address."""
    p, refs, n = t.gpu_pods, t.workload_pod_references, t.nodes
    rows = conn.execute(
        select(p.c.uid, p.c.name, p.c.namespace, p.c.node, n.c.address)
        .join(refs, refs.c.pod_uid == p.c.uid)
        .outerjoin(n, n.c.name == p.c.node)
        .where(refs.c.workload_uid == workload_uid, p.c.running.is_(True), p.c.deleted.is_(False))
        .order_by(p.c.name)
    )
    seen: dict[str, Place] = {}
    for r in rows:
        seen.setdefault(r.uid, Place(r.uid, r.name, r.namespace, r.node, r.address or ""))
    return list(seen.values())


def file_item(r: Any) -> dict[str, Any]:
    """A profiler_files row as the Profiler Files tab reads it (ProfilerFileListItem and
    ours beyond it)."""
    return {
        "id": r.id,
        "file_name": r.file_name,
        "file_type": r.file_type,
        "file_size": r.file_size,
        "workload_uid": r.workload_uid,
        "created_at": stamp(r.created_at),
        "rank": r.rank,
        "pod_name": r.pod_name,
        "pod_namespace": r.pod_namespace,
        "node_name": r.node_name,
        "container": r.container,
        "path": r.path,
        "modified_at": stamp(r.mtime),
        "status": r.status,
        "error": r.error,
        "fetched_at": stamp(r.fetched_at),
    }


class Profiler:
    """The traces of one recorder: listing through the agents, fetching, serving, pruning."""

    def __init__(
        self, cfg: ProfilerConfig, engine: Engine, cluster: str, clock: Callable[[], datetime]
    ) -> None:
        self.cfg, self.engine, self.cluster, self.clock = cfg, engine, cluster, clock
        self.agents = Agents(cfg)
        self._fetching: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()
        from lens_ebpf.recorder.profiler.sessions import Sessions

        self.sessions = Sessions(cfg, engine, self, clock)

    def close(self) -> None:
        self.sessions.join(2.0)
        self.agents.close()

    # -- listing -----------------------------------------------------------------------
    def listing(
        self, cluster: str, tables: Any, workload_uid: str
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """The workload's traces: asked of each running pod's agent now (new ones stored),
        then every one stored for it, newest first; and what could not be asked (an agent
        down is said, not an error; NotFound where every pod's agent says it is not
        there and nothing was found before)."""
        from lens_ebpf.protocol.gen import profiler_pb2 as pb

        with self.engine.connect() as conn:
            w = conn.execute(
                select(tables.gpu_workloads.c.uid).where(tables.gpu_workloads.c.uid == workload_uid)
            ).first()
            if w is None:
                raise NotFound(f"workload not found: {workload_uid!r}")
            pods = running_pods(conn, tables, workload_uid)
        problems: list[str] = []
        missing = 0  # pods their node's agent answered it does not have
        for pod in pods:
            if not pod.address:
                problems.append(
                    f"pod {pod.namespace}/{pod.name}: node {pod.node or '-'} has "
                    "no address known"
                )
                continue
            try:
                got = self.agents.stub(pod.address).ListProfilerFiles(
                    pb.ListProfilerFilesRequest(pod_uid=pod.uid),
                    timeout=self.cfg.timeout_seconds,
                    metadata=self.agents.metadata(),
                )
            except Exception as exc:  # grpc.RpcError: the agent's refusal or its absence
                err = self.agents.error(pod.node, exc) if hasattr(exc, "code") else exc
                problems.append(f"pod {pod.namespace}/{pod.name}: {err}")
                missing += isinstance(err, NotFound)
                continue
            self._store(cluster, workload_uid, pod, got.files)
        t = schema.profiler_files
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(t)
                .where(t.c.cluster == cluster, t.c.workload_uid == workload_uid)
                .order_by(t.c.mtime.desc(), t.c.id.desc())
            ).all()
        if pods and missing == len(pods) and not rows:  # each agent: not on my node
            raise NotFound("; ".join(problems))
        return [file_item(r) for r in rows], problems

    def _store(self, cluster: str, workload_uid: str, pod: Place, files: Any) -> None:
        t = schema.profiler_files
        now = self.clock()
        with self.engine.begin() as conn:
            for f in files:
                mtime = datetime.fromtimestamp(f.mtime, UTC).replace(microsecond=0)
                key = (
                    t.c.cluster == cluster,
                    t.c.pod_uid == pod.uid,
                    t.c.container_id == f.container_id,
                    t.c.path == f.path,
                    t.c.mtime == mtime,
                )
                if conn.execute(select(t.c.id).where(*key)).first() is not None:
                    continue
                conn.execute(
                    insert(t).values(
                        cluster=cluster,
                        workload_uid=workload_uid,
                        pod_uid=pod.uid,
                        pod_name=pod.name,
                        pod_namespace=pod.namespace,
                        node_name=pod.node,
                        container_id=f.container_id,
                        container=f.container,
                        path=f.path,
                        file_name=PurePosixPath(f.path).name[:253],
                        file_type="pytorch_trace",
                        file_size=f.size_bytes,
                        mtime=mtime,
                        rank=f.rank,
                        found_by=f.found_by,
                        status="listed",
                        error="",
                        stored_bytes=0,
                        sha256="",
                        created_at=now,
                    )
                )

    # -- one file ----------------------------------------------------------------------
    def row(self, cluster: str, file_id: int) -> Any:
        t = schema.profiler_files
        with self.engine.connect() as conn:
            r = conn.execute(select(t).where(t.c.cluster == cluster, t.c.id == file_id)).first()
        if r is None:
            raise NotFound(f"profiler file {file_id} not found")
        return r

    def fetch(self, cluster: str, file_id: int) -> Any:
        """The file's row once its bytes are stored (fetched from its agent now if not)."""
        with self._lock:
            lock = self._fetching.setdefault(file_id, threading.Lock())
        with lock:
            r = self.row(cluster, file_id)
            if r.status == "fetched":
                return r
            if r.file_size > self.cfg.max_file_bytes:
                self._failed(
                    file_id,
                    f"{r.file_size} bytes, over recorder.profiler."
                    f"max_file_bytes ({self.cfg.max_file_bytes})",
                )
            with self.engine.connect() as conn:
                n = schema.nodes
                address = (
                    conn.execute(
                        select(n.c.address).where(n.c.cluster == cluster, n.c.name == r.node_name)
                    ).scalar()
                    or ""
                )
            if not address:
                raise Unavailable(f"node {r.node_name} has no address known")
            self._pull(r, address)
            return self.row(cluster, file_id)

    def _failed(self, file_id: int, why: str) -> None:
        t = schema.profiler_files
        with self.engine.begin() as conn:
            conn.execute(update(t).where(t.c.id == file_id).values(status="failed", error=why))
        raise BadRequest(why)

    def _pull(self, r: Any, address: str) -> None:
        """The file's bytes from its agent into chunks, whole or not at all."""
        from lens_ebpf.protocol.gen import profiler_pb2 as pb

        chunks = schema.profiler_file_chunks
        digest, size, index, buf = hashlib.sha256(), 0, 0, bytearray()
        req = pb.FetchProfilerFileRequest(
            pod_uid=r.pod_uid,
            container_id=r.container_id,
            path=r.path,
            max_bytes=self.cfg.max_file_bytes,
        )
        with self.engine.begin() as conn:
            conn.execute(delete(chunks).where(chunks.c.file_id == r.id))
            try:
                stream = self.agents.stub(address).FetchProfilerFile(
                    req, timeout=self.cfg.fetch_timeout_seconds, metadata=self.agents.metadata()
                )
                for c in stream:
                    size += len(c.data)
                    if size > self.cfg.max_file_bytes:
                        stream.cancel()
                        raise BadRequest(
                            f"{r.path}: more than {self.cfg.max_file_bytes} " "bytes came"
                        )
                    digest.update(c.data)
                    buf += c.data
                    while len(buf) >= CHUNK:
                        conn.execute(
                            insert(chunks).values(
                                file_id=r.id, chunk_index=index, content=bytes(buf[:CHUNK])
                            )
                        )
                        del buf[:CHUNK]
                        index += 1
            except BadRequest:
                raise
            except Exception as exc:
                if not hasattr(exc, "code"):
                    raise
                err = self.agents.error(r.node_name, exc)
                if isinstance(err, BadRequest):
                    conn.rollback()
                    self._failed(r.id, str(err))
                raise err from None
            if buf or index == 0:
                conn.execute(
                    insert(chunks).values(file_id=r.id, chunk_index=index, content=bytes(buf))
                )
            t = schema.profiler_files
            conn.execute(
                update(t)
                .where(t.c.id == r.id)
                .values(
                    status="fetched",
                    error="",
                    stored_bytes=size,
                    sha256=digest.hexdigest(),
                    fetched_at=self.clock(),
                )
            )
        log.info(
            "profiler: fetched %s of %s/%s (%d bytes)", r.path, r.pod_namespace, r.pod_name, size
        )

    def content(self, file_id: int) -> Iterator[bytes]:
        """The stored bytes, chunk by chunk."""
        chunks = schema.profiler_file_chunks
        with self.engine.connect() as conn:
            count: Sequence[int] = (
                conn.execute(
                    select(chunks.c.chunk_index)
                    .where(chunks.c.file_id == file_id)
                    .order_by(chunks.c.chunk_index)
                )
                .scalars()
                .all()
            )
        for i in count:
            with self.engine.connect() as conn:
                yield conn.execute(
                    select(chunks.c.content).where(
                        chunks.c.file_id == file_id, chunks.c.chunk_index == i
                    )
                ).scalar_one()

    def read(self, cluster: str, file_id: int) -> tuple[Any, bytes]:
        """The file's row and its bytes whole (fetched first where they are not stored)."""
        r = self.fetch(cluster, file_id)
        return r, b"".join(self.content(file_id))

    def prune(self, now: datetime) -> int:
        """Fetched bytes past the retention dropped (their rows say listed again)."""
        t, chunks = schema.profiler_files, schema.profiler_file_chunks
        before = now - timedelta(hours=self.cfg.retention_hours)
        with self.engine.begin() as conn:
            ids: Sequence[int] = (
                conn.execute(select(t.c.id).where(t.c.status == "fetched", t.c.fetched_at < before))
                .scalars()
                .all()
            )
            if ids:
                conn.execute(delete(chunks).where(chunks.c.file_id.in_(ids)))
                conn.execute(
                    update(t)
                    .where(t.c.id.in_(ids))
                    .values(status="listed", stored_bytes=0, fetched_at=None)
                )
        return len(ids)
