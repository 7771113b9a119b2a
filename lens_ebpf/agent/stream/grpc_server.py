"""gRPC: EventService.Subscribe, NodeService.GetNode and grpc.health.v1, TLS optional; the
first two for callers the guard admits (grpc.auth, protocol/stream_auth.py), health for
anyone (the kubelet's probes present no token)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf import __version__
from lens_ebpf.agent.events import Event, EventBus, Gap
from lens_ebpf.agent.stream import convert
from lens_ebpf.core.exposition import counter, gauge
from lens_ebpf.core.loop import EventLoopThread
from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from lens_ebpf.protocol.stream_auth import Claim, Guard

log = logging.getLogger(__name__)
# SubscribeBatch: after a batch short of convert.BATCH_EVENTS the stream lets the queue
# fill this long: at a steady 40,000 events/s a message per event, or per few, cost more
# than the events (every one a write and a wake-up of the loop); a batch waits at most
# this much longer
BATCH_LINGER_SECONDS = 0.01


def port_free(listen: str) -> None:
    """OSError naming the port when HOST:PORT is taken: checked with a plain socket first,
    so the operator reads one line of ours rather than gRPC core's log."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) == 0:
        return  # a form gRPC parses itself (unix:, dns:); it reports its own errors
    host = host.strip("[]") or "::"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return  # a name: gRPC resolves it and reports its own errors
    if ip.version == 4:  # gRPC listens on IPv4 through a dual-stack IPv6 socket
        host = "::" if host == "0.0.0.0" else f"::ffff:{host}"
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        # as gRPC binds: TIME_WAIT leftovers of a restart do not count, a listener does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError as exc:
            raise OSError(f"cannot listen on {listen}: {exc.strerror or exc}") from None


async def decode_request(cls: Any, raw: bytes, context: Any) -> Any:
    """A request message from its bytes; INVALID_ARGUMENT with a bounded message when
    they are not one."""
    try:
        return cls.FromString(raw)
    except DecodeError:
        why = f"request is not a {cls.DESCRIPTOR.full_name} ({len(raw)} bytes)"
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)


async def admit(guard: Guard | None, context: Any) -> None:
    """The caller admitted, before its request is read; else the call is aborted."""
    if guard is not None:
        await guard.admit(context, Claim())


class EventService(lens_pb2_grpc.EventServiceServicer):
    """Subscribe on asyncio: an idle stream holds no thread, only a waiting coroutine."""

    def __init__(
        self,
        bus: EventBus,
        node: tuple[str, str],
        queue: int,
        limit: int,
        guard: Guard | None = None,
    ) -> None:
        self.bus, self.node, self.queue, self.limit = bus, node, queue, limit
        self.guard = guard  # None: anyone may subscribe
        self.active = 0
        self.refused = 0

    async def subscribe_raw(self, raw: bytes, context: Any) -> AsyncIterator[bytes]:
        """Subscribe from the request's bytes: what does not decode is the caller's
        error (INVALID_ARGUMENT), not the server's (gRPC's own decoding says INTERNAL).
        Each event goes out as its serialized pb.Event (convert.wire: made once, the
        bytes every stream and the reporter send)."""
        await admit(self.guard, context)
        request = await decode_request(pb.SubscribeRequest, raw, context)
        async for events in self._stream(request, context, 1):
            for ev in events:
                yield convert.wire(ev, *self.node)

    async def subscribe_batch_raw(self, raw: bytes, context: Any) -> AsyncIterator[bytes]:
        """SubscribeBatch: serialized EventBatch messages of events serialized once."""
        await admit(self.guard, context)
        request = await decode_request(pb.SubscribeRequest, raw, context)
        async for events in self._stream(request, context, convert.BATCH_EVENTS):
            for chunk in convert.wire_chunks(events, *self.node):
                yield convert.batch_wire(chunk)

    async def _stream(
        self, request: pb.SubscribeRequest, context: Any, most: int
    ) -> AsyncIterator[list[Event]]:
        """A subscriber's events in order, up to most at a time (gaps where its queue
        overflowed or the history no longer held what it asked for)."""
        problem = convert.validate(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        if self.active >= self.limit:
            self.refused += 1
            why = f"{self.limit} subscribers already (grpc.max_subscribers)"
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
        # which numbering the seqs are of: each agent process numbers from 1, so a client
        # resuming with from_seq across a restart sees another instance here
        await context.send_initial_metadata((("lens-agent-instance", self.bus.instance),))
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        accept = convert.matcher(request)

        def notify() -> None:  # from the publishing thread
            loop.call_soon_threadsafe(wake.set)

        # raw: compiled events stay their wire bytes (native.Packed), sent as they are
        sub = self.bus.subscribe("grpc", accept=accept, maxsize=self.queue, notify=notify, raw=True)
        self.active += 1
        try:
            last = 0
            if request.from_seq:
                held, gone = self.bus.since(request.from_seq)
                if gone:  # numbered as the last event it stands for
                    yield [self._gap(gone, "history", request.from_seq + gone - 1)]
                replay = [ev for ev in held if accept(ev)]
                for i in range(0, len(replay), most):
                    yield replay[i : i + most]
                last = held[-1].seq if held else 0
            seen_drops = 0
            while True:
                wake.clear()
                live = sub.drain(most)
                if sub.dropped > seen_drops:  # this subscriber was too slow
                    yield [
                        self._gap(sub.dropped - seen_drops, "slow_subscriber", sub.last_dropped_seq)
                    ]
                    seen_drops = sub.dropped
                live = [ev for ev in live if ev.seq > last]
                if not live:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), 1.0)
                    continue
                yield live
                if most > 1 and len(live) < most:
                    await asyncio.sleep(BATCH_LINGER_SECONDS)
        finally:
            self.active -= 1
            self.bus.unsubscribe(sub)

    @staticmethod
    def _gap(lost: int, reason: str, seq: int) -> Gap:
        return Gap(lost=lost, reason=reason, seq=seq)


class NodeService(lens_pb2_grpc.NodeServiceServicer):
    def __init__(
        self,
        bus: EventBus,
        node: tuple[str, str],
        features: Callable[[], dict[str, str]],
        guard: Guard | None = None,
    ) -> None:
        self.bus, self.node, self.features, self.guard = bus, node, features, guard

    async def get_node_raw(self, raw: bytes, context: Any) -> pb.NodeInfo:
        await admit(self.guard, context)
        return await self.GetNode(await decode_request(pb.GetNodeRequest, raw, context), context)

    async def GetNode(self, request: pb.GetNodeRequest, context: Any) -> pb.NodeInfo:  # noqa: N802
        return pb.NodeInfo(
            node_name=self.node[0],
            node_ip=self.node[1],
            version=__version__,
            features=self.features(),
            last_seq=self.bus.seq,
        )


class GrpcServer:
    """grpc.aio on the given event loop (the HTTP server's), or one of its own. The port
    is bound without SO_REUSEPORT: a second agent on the same port fails to start instead
    of sharing it silently."""

    def __init__(
        self,
        listen: str,
        bus: EventBus,
        node: tuple[str, str],
        features: Callable[[], dict[str, str]],
        queue: int = 10000,
        credentials: grpc.ServerCredentials | None = None,
        max_subscribers: int = 1000,
        loop: EventLoopThread | None = None,
        guard: Guard | None = None,
        services: Callable[[Guard | None], list[Any]] = lambda guard: [],
    ) -> None:
        self.guard = guard
        self.services = services  # more services behind the guard (a feature's: deepdive)
        self.events = EventService(bus, node, queue, max_subscribers, guard)
        self._nodes = NodeService(bus, node, features, guard)
        self._own_loop = loop is None
        self._loop = loop or EventLoopThread("grpc")
        try:
            self.port = self._call(self._bind(listen, credentials))
        except BaseException:
            self._close_loop()
            raise

    def _call(self, coro: Any) -> Any:
        return self._loop.call(coro, 15)

    async def _bind(self, listen: str, credentials: grpc.ServerCredentials | None) -> int:
        port_free(listen)
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        # requests arrive as bytes and are decoded by the handlers (decode_request)
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "lens.v1.EventService",
                    {
                        "Subscribe": grpc.unary_stream_rpc_method_handler(
                            self.events.subscribe_raw, response_serializer=bytes
                        ),  # serialized already
                        "SubscribeBatch": grpc.unary_stream_rpc_method_handler(
                            self.events.subscribe_batch_raw, response_serializer=bytes
                        ),  # serialized already
                    },
                ),
                grpc.method_handlers_generic_handler(
                    "lens.v1.NodeService",
                    {
                        "GetNode": grpc.unary_unary_rpc_method_handler(
                            self._nodes.get_node_raw,
                            response_serializer=pb.NodeInfo.SerializeToString,
                        ),
                    },
                ),
            )
        )
        self.server.add_generic_rpc_handlers(tuple(self.services(self.guard)))
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        for name in ("", "lens.v1.EventService", "lens.v1.NodeService"):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        try:
            if credentials is None:
                port = self.server.add_insecure_port(listen)
            else:
                port = self.server.add_secure_port(listen, credentials)
        except RuntimeError as exc:  # grpc.aio raises where the sync server returned 0
            raise OSError(f"cannot listen on {listen} for gRPC: {exc}") from None
        if not port:
            raise OSError(f"cannot listen on {listen} for gRPC")
        return int(port)

    def start(self) -> None:
        self._call(self.server.start())
        if self.guard is not None:
            self.guard.announce()

    async def _stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace=2)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self._stop())
        self._close_loop()

    def _close_loop(self) -> None:
        if self._own_loop:
            self._loop.close()

    def collector(self) -> Collector:
        return _GrpcCollector(self.events)


class _GrpcCollector(Collector):
    def __init__(self, events: EventService) -> None:
        self._e = events

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        yield gauge("lens_agent_grpc_streams", "Subscribe streams open", self._e.active)
        yield counter(
            "lens_agent_grpc_streams_refused",
            "Subscribe calls refused: grpc.max_subscribers streams open",
            self._e.refused,
        )
        denied = counter(
            "lens_agent_grpc_calls_refused",
            "EventService and NodeService calls refused by grpc.auth: "
            "unauthenticated (no or an invalid token), "
            "permission_denied (a caller not allowed), unavailable "
            "(the API server did not answer its TokenReview)",
        )
        counts = self._e.guard.refused if self._e.guard is not None else {}
        for code in ("unauthenticated", "permission_denied", "unavailable"):
            denied.add({"code": code}, counts.get(code, 0))
        yield denied
