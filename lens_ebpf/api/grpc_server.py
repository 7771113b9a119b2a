"""gRPC: EventService.Subscribe, NodeService.GetNode and grpc.health.v1, TLS optional."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from lens_ebpf import __version__
from lens_ebpf.api import convert
from lens_ebpf.api.gen import lens_pb2 as pb
from lens_ebpf.api.gen import lens_pb2_grpc
from lens_ebpf.events import EventBus, Gap

log = logging.getLogger(__name__)


def server_credentials(cert: str, key: str, client_ca: str) -> grpc.ServerCredentials | None:
    """TLS when cert and key are set; mutual TLS when a client CA is set too."""
    if not cert:
        return None
    pair = [(Path(key).read_bytes(), Path(cert).read_bytes())]
    if client_ca:
        return grpc.ssl_server_credentials(pair, Path(client_ca).read_bytes(), True)
    return grpc.ssl_server_credentials(pair)


class EventService(lens_pb2_grpc.EventServiceServicer):
    def __init__(self, bus: EventBus, node: tuple[str, str], queue: int) -> None:
        self.bus = bus
        self.node = node
        self.queue = queue

    def Subscribe(self, request: pb.SubscribeRequest, context: Any) -> Iterator[pb.Event]:  # noqa: N802
        problem = convert.validate(request)
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        accept = convert.matcher(request)
        sub = self.bus.subscribe("grpc", accept=accept, maxsize=self.queue)
        try:
            last = 0
            if request.from_seq:
                held, gone = self.bus.since(request.from_seq)
                if gone:
                    yield self._gap(gone, "history")
                for ev in held:
                    if accept(ev):
                        yield convert.to_pb(ev, *self.node)
                    last = ev.seq
            seen_drops = 0
            while context.is_active():
                live = sub.get(timeout=0.5)
                if sub.dropped > seen_drops:  # this subscriber was too slow
                    yield self._gap(sub.dropped - seen_drops, "slow_subscriber")
                    seen_drops = sub.dropped
                if live is not None and live.seq > last:
                    yield convert.to_pb(live, *self.node)
        finally:
            self.bus.unsubscribe(sub)

    def _gap(self, lost: int, reason: str) -> pb.Event:
        return convert.to_pb(Gap(lost=lost, reason=reason), *self.node)


class NodeService(lens_pb2_grpc.NodeServiceServicer):
    def __init__(self, bus: EventBus, node: tuple[str, str],
                 features: Callable[[], dict[str, str]]) -> None:  # fmt: skip
        self.bus, self.node, self.features = bus, node, features

    def GetNode(self, request: pb.GetNodeRequest, context: Any) -> pb.NodeInfo:  # noqa: N802
        return pb.NodeInfo(node_name=self.node[0], node_ip=self.node[1], version=__version__,
                           features=self.features(), last_seq=self.bus.seq)  # fmt: skip


class GrpcServer:
    def __init__(self, listen: str, bus: EventBus, node: tuple[str, str],
                 features: Callable[[], dict[str, str]], queue: int = 10000,
                 credentials: grpc.ServerCredentials | None = None) -> None:  # fmt: skip
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        lens_pb2_grpc.add_EventServiceServicer_to_server(EventService(bus, node, queue),
                                                         self.server)  # fmt: skip
        lens_pb2_grpc.add_NodeServiceServicer_to_server(NodeService(bus, node, features),
                                                        self.server)  # fmt: skip
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        for name in ("", "lens.v1.EventService", "lens.v1.NodeService"):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if credentials is None:
            self.port = self.server.add_insecure_port(listen)
        else:
            self.port = self.server.add_secure_port(listen, credentials)
        if not self.port:
            raise OSError(f"cannot listen on {listen} for gRPC")

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace=2).wait(5)
