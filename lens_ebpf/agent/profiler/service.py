"""lens.v1.ProfilerService on the agent's gRPC port: the PyTorch profiler traces of a pod's
processes on this node (ListProfilerFiles) and one of them streamed (FetchProfilerFile),
for the recorder only: admitted as DeepDiveService admits (the port's guard, then
collectors.profiler.callers), every refusal counted by code."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.agent.containers.runtime import ContainerInfo
from lens_ebpf.agent.deepdive import procs
from lens_ebpf.agent.deepdive.pyspy import RefusalError
from lens_ebpf.agent.deepdive.service import admit, pod_containers
from lens_ebpf.agent.profiler import discovery
from lens_ebpf.core.exposition import counter
from lens_ebpf.protocol.gen import profiler_pb2 as pb
from lens_ebpf.protocol.stream_auth import Guard

log = logging.getLogger(__name__)
SERVICE = "lens.v1.ProfilerService"
CHUNK = 1 << 20


class Profiler:
    """The service's handlers (generic: the request's bytes in, decoded once the caller is
    admitted)."""

    def __init__(
        self,
        node: str,
        procfs: Path,
        containers: Callable[[], dict[str, ContainerInfo]],
        callers: list[str],
        patterns: list[str],
        globs: list[str],
        depth: int,
        max_files: int,
        max_file_bytes: int,
        guard: Guard | None = None,
    ) -> None:
        self.node, self.procfs, self.containers = node, procfs, containers
        self.callers, self.patterns, self.globs = callers, patterns, globs
        self.depth, self.max_files, self.max_file_bytes = depth, max_files, max_file_bytes
        self.guard = guard
        self.refused: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self.sent_bytes = 0

    def handlers(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "ListProfilerFiles": grpc.unary_unary_rpc_method_handler(
                    self.list_raw, response_serializer=pb.ListProfilerFilesReply.SerializeToString
                ),
                "FetchProfilerFile": grpc.unary_stream_rpc_method_handler(
                    self.fetch_raw, response_serializer=pb.FileChunk.SerializeToString
                ),
            },
        )

    async def _admit(self, context: Any, method: str) -> None:
        await admit(
            context,
            method,
            self.guard,
            self.callers,
            self.refused,
            "ProfilerService",
            "collectors.profiler.callers",
        )
        self.calls[method] += 1

    def _pod(self, uid: str) -> list[ContainerInfo]:
        return pod_containers(self.containers(), uid, self.node)

    def _found(self, c: ContainerInfo) -> list[discovery.Found]:
        """The traces of the container's processes (its init first)."""
        if not c.pid:
            return []
        by_init = procs.container_processes(self.procfs, [c.pid])
        pids = [c.pid] + sorted(p.host_pid for p in by_init.get(c.pid, []) if p.host_pid != c.pid)
        return discovery.find(self.procfs, pids, self.patterns, self.globs, self.depth)

    def listing(self, uid: str) -> pb.ListProfilerFilesReply:
        containers = self._pod(uid)
        first = containers[0]
        reply = pb.ListProfilerFilesReply(
            pod_uid=uid,
            pod_name=first.pod_name,
            pod_namespace=first.pod_namespace,
            node_name=self.node,
        )
        files: list[pb.ProfilerFile] = []
        for c in containers:
            files += [
                pb.ProfilerFile(
                    path=f.path,
                    container_id=c.id,
                    container=c.label,
                    size_bytes=f.size,
                    mtime=f.mtime,
                    rank=f.rank,
                    host_pid=f.pid,
                    found_by=f.found_by,
                )
                for f in self._found(c)
            ]
        files.sort(key=lambda f: (-f.mtime, f.container_id, f.path))
        reply.files.extend(files[: self.max_files])
        reply.skipped = max(0, len(files) - self.max_files)
        return reply

    async def list_raw(self, raw: bytes, context: Any) -> pb.ListProfilerFilesReply:
        await self._admit(context, "ListProfilerFiles")
        req = pb.ListProfilerFilesRequest.FromString(raw)
        try:
            return await asyncio.to_thread(self.listing, req.pod_uid)
        except RefusalError as r:
            await context.abort(getattr(grpc.StatusCode, r.code), r.why)
            raise

    def opened(self, req: pb.FetchProfilerFileRequest) -> tuple[int, os.stat_result]:
        """The asked trace open, once the listing holds it and it is within the cap."""
        c = next((c for c in self._pod(req.pod_uid) if c.id == req.container_id), None)
        if c is None:
            raise RefusalError(
                "NOT_FOUND",
                f"container {req.container_id} is not pod " f"{req.pod_uid}'s on node {self.node}",
            )
        known = {f.path: f for f in self._found(c)}
        if req.path not in known:
            raise RefusalError(
                "NOT_FOUND",
                f"{req.path}: not a profiler trace of pod "
                f"{req.pod_uid} (ListProfilerFiles names them)",
            )
        cap = min(req.max_bytes or self.max_file_bytes, self.max_file_bytes)
        root = self.procfs / str(known[req.path].pid) / "root"
        try:
            fd, st = discovery.open_trace(root, req.path)
        except (discovery.UnsafePathError, OSError) as exc:
            raise RefusalError("NOT_FOUND", f"{req.path}: {exc}") from None
        if st.st_size > cap:
            os.close(fd)
            raise RefusalError(
                "RESOURCE_EXHAUSTED", f"{req.path}: {st.st_size} bytes, over the " f"cap of {cap}"
            )
        return fd, st

    async def fetch_raw(self, raw: bytes, context: Any) -> AsyncIterator[pb.FileChunk]:
        await self._admit(context, "FetchProfilerFile")
        req = pb.FetchProfilerFileRequest.FromString(raw)
        try:
            fd, st = await asyncio.to_thread(self.opened, req)
        except RefusalError as r:
            self.refused[r.code.lower()] += 1
            await context.abort(getattr(grpc.StatusCode, r.code), r.why)
            raise
        log.info("profiler: sending %s (%d bytes) of pod %s", req.path, st.st_size, req.pod_uid)
        try:
            offset = 0
            while offset < st.st_size:
                data = await asyncio.to_thread(
                    os.pread, fd, min(CHUNK, st.st_size - offset), offset
                )
                if not data:
                    break
                first = offset == 0
                yield pb.FileChunk(
                    data=data,
                    offset=offset,
                    size_bytes=st.st_size if first else 0,
                    mtime=st.st_mtime if first else 0.0,
                )
                offset += len(data)
                self.sent_bytes += len(data)
            if offset == 0:  # an empty file: one chunk says its size
                yield pb.FileChunk(size_bytes=0, mtime=st.st_mtime)
        finally:
            os.close(fd)


class ProfilerCollector(Collector):
    def __init__(self, p: Profiler) -> None:
        self.p = p

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        refused = counter(
            "lens_agent_profiler_calls_refused",
            "ProfilerService calls refused: "
            "unauthenticated, permission_denied (no token, a caller not in "
            "collectors.profiler.callers), not_found, resource_exhausted (a trace over the "
            "cap)",
        )
        for code in ("unauthenticated", "permission_denied", "not_found", "resource_exhausted"):
            refused.add({"code": code}, self.p.refused.get(code, 0))
        yield refused
        calls = counter("lens_agent_profiler_calls", "ProfilerService calls " "admitted, by method")
        for m in ("ListProfilerFiles", "FetchProfilerFile"):
            calls.add({"method": m}, self.p.calls.get(m, 0))
        yield calls
        yield counter(
            "lens_agent_profiler_sent_bytes",
            "Trace bytes sent to the " "recorder",
            self.p.sent_bytes,
        )
