"""The recorder's calls to the agents' DeepDiveService (agent/deepdive) and where a pod
runs: its node and the node's address (pod_place, workload_pods), a refusal turned into
the domain's error (CODES), and a container's processes as the web UI's process tree
(tree_of)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from lens_ebpf.recorder.config import DeepDiveConfig
from lens_ebpf.recorder.deepdive.channels import AgentChannels
from lens_ebpf.recorder.errors import BadRequest, Conflict, NotFound, Unavailable

CODES = {
    "NOT_FOUND": NotFound,
    "INVALID_ARGUMENT": BadRequest,
    "FAILED_PRECONDITION": BadRequest,
    "ABORTED": BadRequest,
    "RESOURCE_EXHAUSTED": Conflict,
    "DEADLINE_EXCEEDED": Unavailable,
}


class Agents:
    """DeepDiveService calls to the agents."""

    def __init__(self, cfg: DeepDiveConfig) -> None:
        self.cfg = cfg
        self.channels = AgentChannels(cfg, "recorder.deepdive")

    def _stub(self, address: str) -> Any:
        from lens_ebpf.protocol.gen import deepdive_pb2_grpc

        return deepdive_pb2_grpc.DeepDiveServiceStub(self.channels.channel(address))

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return self.channels.metadata()

    def call(self, node: str, address: str, method: str, request: Any, timeout: float) -> Any:
        """The agent's answer; the domain's error for its refusal."""
        fut = self.start(node, address, method, request, timeout)
        return self.result(node, fut)

    def start(self, node: str, address: str, method: str, request: Any, timeout: float) -> Any:
        if not address:
            raise Unavailable(f"node {node} has no address known (its Node's InternalIP)")
        return getattr(self._stub(address), method).future(
            request, timeout=timeout, metadata=self._metadata()
        )

    @staticmethod
    def result(node: str, fut: Any, wait: float | None = None) -> Any:
        import grpc

        try:
            return fut.result(timeout=wait)
        except grpc.FutureTimeoutError:
            raise
        except grpc.RpcError as exc:
            code, why = exc.code(), exc.details() or ""
            cls = CODES.get(code.name)
            if cls is not None:
                raise cls(why) from None
            raise Unavailable(f"the agent on node {node}: {code.name}: {why}") from None

    def close(self) -> None:
        self.channels.close()


@dataclass(frozen=True)
class PodPlace:
    uid: str
    name: str
    namespace: str
    node: str
    address: str
    workload_uid: str


def pod_place(conn: Connection, tables: Any, pod_uid: str) -> PodPlace:
    """Where a pod runs (its node and the node's address); NotFound for a pod not known."""
    p, n = tables.gpu_pods, tables.nodes
    row = conn.execute(
        select(p.c.name, p.c.namespace, p.c.node, p.c.workload_uid, p.c.deleted).where(
            p.c.uid == pod_uid
        )
    ).first()
    if row is None:
        raise NotFound(f"pod {pod_uid} is not known")
    if row.deleted or not row.node:
        raise BadRequest(f"pod {row.namespace}/{row.name} is not running on a node")
    address = conn.execute(select(n.c.address).where(n.c.name == row.node)).scalar()
    return PodPlace(
        pod_uid, row.name, row.namespace, row.node, address or "", row.workload_uid or ""
    )


def workload_pods(conn: Connection, tables: Any, workload_uid: str) -> list[PodPlace]:
    """The workload's running pods, each with its node's address."""
    p = tables.gpu_pods
    rows = conn.execute(
        select(p.c.uid)
        .where(p.c.workload_uid == workload_uid, p.c.running.is_(True), p.c.deleted.is_(False))
        .order_by(p.c.name)
    )
    return [pod_place(conn, tables, r.uid) for r in rows]


def _process(p: Any) -> dict[str, Any]:
    """One process in the original's ProcessInfo shape (no env: never read)."""
    gpus = sorted({d.index for d in p.devices if d.index >= 0} | set(p.gpu_indexes))
    return {
        "host_pid": p.host_pid,
        "host_ppid": p.host_ppid,
        "container_pid": p.container_pid,
        "container_ppid": p.container_ppid,
        "cmdline": p.cmdline,
        "comm": p.comm,
        "exe": p.exe,
        "args": p.cmdline.split(),
        "env": [],
        "cwd": "",
        "state": p.state,
        "threads": p.threads,
        "cpu_time": int(p.cpu_seconds),
        "memory_rss": p.rss_bytes,
        "memory_virtual": p.vsize_bytes,
        "is_python": p.is_python,
        "is_java": False,
        "gpu_devices": [{"device_index": i, "device_uuid": "", "device_name": ""} for i in gpus],
        "devices": [d.path for d in p.devices],
        "has_gpu": bool(gpus or p.devices),
        "start_time": int(p.start_time),
        "children": [],
    }


def tree_of(processes: list[Any], container: Any, pod: PodPlace) -> dict[str, Any]:
    """A container's processes as one tree from its root (its init); processes whose parent
    is outside the container hang under the root too."""
    nodes = {
        p.host_pid: {
            **_process(p),
            "container_id": container.id,
            "container_name": container.name,
            "pod_uid": pod.uid,
            "pod_name": pod.name,
            "pod_namespace": pod.namespace,
        }
        for p in processes
    }
    root = next((n for n in nodes.values() if n["container_pid"] == 1), None)
    if root is None and nodes:
        root = nodes[min(nodes)]
    for _, n in sorted(nodes.items()):
        if n is root:
            continue
        parent = nodes.get(n["host_ppid"]) or root
        if parent is not None:
            parent["children"].append(n)
    return {
        "container_id": container.id,
        "container_name": container.name,
        "image_name": "",
        "root_process": root,
        "process_count": len(processes),
        "python_count": sum(1 for p in processes if p.is_python),
    }
