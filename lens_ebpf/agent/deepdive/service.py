"""lens.v1.DeepDiveService on the agent's gRPC port: a pod's processes (ProcessTree) and
py-spy against one of them (PySpy), for the recorder only.

Who may call: the port's guard (grpc.auth: a ServiceAccount token TokenReview admits, or a
line of grpc.auth.tokens_file) and then collectors.deepdive.callers, the identities that
guard may answer (the recorder's ServiceAccount by default); a call without a token is
refused here even where the port takes anonymous calls on loopback. Only pods on this node
(the containers containerd runs here); a pid must be one of the pod's processes. Every
refusal is counted by code (lens_agent_deepdive_calls_refused)."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.agent.containers.runtime import ContainerInfo
from lens_ebpf.agent.deepdive import procs
from lens_ebpf.agent.deepdive.pyspy import PySpy, RefusalError
from lens_ebpf.core.exposition import counter, gauge
from lens_ebpf.protocol.gen import deepdive_pb2 as pb
from lens_ebpf.protocol.stream_auth import Claim, Guard

log = logging.getLogger(__name__)
SERVICE = "lens.v1.DeepDiveService"


def allowed(identity: str, callers: list[str]) -> bool:
    """A caller of the list: namespace/name exactly, or a bare name (a tokens_file line's,
    or a ServiceAccount's of any namespace grpc.auth admits)."""
    if identity == "anonymous":
        return False
    name = identity.rpartition("/")[2]
    return any(c == identity or ("/" not in c and c == name) for c in callers)


async def admit(
    context: Any,
    method: str,
    guard: Guard | None,
    callers: list[str],
    refused: collections.Counter[str],
    service: str,
    setting: str,
) -> None:
    """Let the call through when grpc.auth admits its caller and `setting` (a feature's
    callers list) names it; else abort it, counting why in refused. A port without auth
    (tests of the protocol) is refused too: these services answer the recorder only."""
    if guard is None:
        who = "anonymous"
    else:
        try:
            who = await guard.admit(context, Claim())
        except BaseException:
            refused["unauthenticated"] += 1
            raise
    if not allowed(who, callers):
        refused["permission_denied"] += 1
        named = ", ".join(callers) or "none"
        why = (
            f"no bearer token: {service} answers the recorder only"
            if who == "anonymous"
            else f"{who} may not call {service} ({setting}: {named})"
        )
        log.warning("%s: refused %s from %s: %s", service, method, context.peer(), why)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)


def pod_containers(
    containers: dict[str, ContainerInfo], uid: str, node: str
) -> list[ContainerInfo]:
    """The pod's running containers on this node (its sandbox left out); RefusalError when it
    has none here."""
    if not uid:
        raise RefusalError("INVALID_ARGUMENT", "pod_uid is required")
    mine = [c for c in containers.values() if c.pod_uid == uid and not c.sandbox]
    if not mine:
        raise RefusalError("NOT_FOUND", f"pod {uid} has no running container on node {node}")
    return sorted(mine, key=lambda c: (c.name, c.id))


def process_message(p: procs.Proc) -> pb.Process:
    return pb.Process(
        host_pid=p.host_pid,
        host_ppid=p.host_ppid,
        container_pid=p.container_pid,
        container_ppid=p.container_ppid,
        comm=p.comm,
        cmdline=p.cmdline,
        exe=p.exe,
        state=p.state,
        threads=p.threads,
        cpu_seconds=p.cpu_seconds,
        rss_bytes=p.rss_bytes,
        vsize_bytes=p.vsize_bytes,
        start_time=p.start_time,
        is_python=p.is_python,
        devices=[pb.HeldDevice(path=d.path, index=d.index, vendor=d.vendor) for d in p.devices],
        gpu_indexes=p.gpu_indexes,
    )


class DeepDive:
    """The service's handlers (generic: the request's bytes in, decoded here after the
    caller is admitted)."""

    def __init__(
        self,
        node: str,
        procfs: Path,
        containers: Callable[[], dict[str, ContainerInfo]],
        gpu_pids: Callable[[], dict[int, list[int]]],
        pyspy: PySpy,
        callers: list[str],
        guard: Guard | None = None,
    ) -> None:
        self.node, self.procfs, self.containers = node, procfs, containers
        self.gpu_pids, self.pyspy, self.callers = gpu_pids, pyspy, callers
        self.guard = guard
        self.refused: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()

    def handlers(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "ProcessTree": grpc.unary_unary_rpc_method_handler(
                    self.process_tree_raw, response_serializer=pb.ProcessTreeReply.SerializeToString
                ),
                "PySpy": grpc.unary_unary_rpc_method_handler(
                    self.pyspy_raw, response_serializer=pb.PySpyReply.SerializeToString
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
            "DeepDiveService",
            "collectors.deepdive.callers",
        )
        self.calls[method] += 1

    async def _fail(self, context: Any, r: RefusalError) -> None:
        await context.abort(getattr(grpc.StatusCode, r.code, grpc.StatusCode.UNKNOWN), r.why)

    def _pod(self, uid: str) -> list[ContainerInfo]:
        return pod_containers(self.containers(), uid, self.node)

    def tree(self, uid: str) -> pb.ProcessTreeReply:
        containers = self._pod(uid)
        found = procs.container_processes(
            self.procfs, [c.pid for c in containers if c.pid], self.gpu_pids()
        )
        first = containers[0]
        reply = pb.ProcessTreeReply(
            pod_uid=uid,
            pod_name=first.pod_name,
            node_name=self.node,
            pod_namespace=first.pod_namespace,
        )
        for c in containers:
            reply.containers.append(
                pb.ContainerProcesses(
                    id=c.id,
                    name=c.label,
                    processes=[process_message(p) for p in found.get(c.pid, [])],
                )
            )
        return reply

    async def process_tree_raw(self, raw: bytes, context: Any) -> pb.ProcessTreeReply:
        await self._admit(context, "ProcessTree")
        req = pb.ProcessTreeRequest.FromString(raw)
        try:
            return self.tree(req.pod_uid)
        except RefusalError as r:
            await self._fail(context, r)
            raise

    async def pyspy_raw(self, raw: bytes, context: Any) -> pb.PySpyReply:
        await self._admit(context, "PySpy")
        req = pb.PySpyRequest.FromString(raw)
        try:
            self._of_pod(req.pod_uid, req.pid)
            log.info(
                "deepdive: py-spy %s of pid %d (pod %s, task %s)",
                req.action,
                req.pid,
                req.pod_uid,
                req.task_id or "-",
            )
            got = await self.pyspy.run(
                req.pid,
                req.action,
                req.duration_seconds or 10,
                req.rate or 100,
                req.format or "speedscope",
                req.native,
                req.subprocesses,
                req.locals,
            )
        except RefusalError as r:
            await self._fail(context, r)
            raise
        return pb.PySpyReply(
            output=got.output,
            format=got.format,
            pid=req.pid,
            seconds=got.seconds,
            exited=got.exited,
        )

    def _of_pod(self, uid: str, pid: int) -> None:
        """RefusalError unless pid is one of the pod's processes here."""
        if pid <= 0:
            raise RefusalError("INVALID_ARGUMENT", f"pid {pid}: a host pid is required")
        containers = self._pod(uid)
        inits = [c.pid for c in containers if c.pid]
        mine = {procs.pid_namespace(self.procfs, i) for i in inits} - {""}
        if procs.pid_namespace(self.procfs, pid) not in mine:
            raise RefusalError(
                "NOT_FOUND", f"pid {pid} is not a process of pod {uid} on node " f"{self.node}"
            )
        p = procs.read_process(self.procfs, pid, 0.0)
        if p is not None and not p.is_python:
            raise RefusalError(
                "FAILED_PRECONDITION",
                f"pid {pid} ({p.comm}) is not a Python "
                "process: py-spy reads Python interpreters only",
            )


class DeepDiveCollector(Collector):
    def __init__(self, dd: DeepDive) -> None:
        self.dd = dd

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        refused = counter(
            "lens_agent_deepdive_calls_refused",
            "DeepDiveService calls refused: "
            "unauthenticated (grpc.auth refused the token), permission_denied (no token, or "
            "a caller not in collectors.deepdive.callers)",
        )
        for code in ("unauthenticated", "permission_denied"):
            refused.add({"code": code}, self.dd.refused.get(code, 0))
        yield refused
        calls = counter("lens_agent_deepdive_calls", "DeepDiveService calls " "admitted, by method")
        for m in ("ProcessTree", "PySpy"):
            calls.add({"method": m}, self.dd.calls.get(m, 0))
        yield calls
        runs = counter(
            "lens_agent_pyspy_runs",
            "py-spy runs ended, by outcome " "(ok, cancelled, or the refusal's code in lower case)",
        )
        for outcome, n in sorted(self.dd.pyspy.runs.items()):
            runs.add({"outcome": outcome}, n)
        yield runs
        yield gauge("lens_agent_pyspy_running", "py-spy runs now", len(self.dd.pyspy.busy))
