"""The event side of the agent: gRPC Subscribe/GetNode and, when configured, the reporter."""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from lens_ebpf.agent.config import Config
from lens_ebpf.agent.events import EventBus
from lens_ebpf.agent.stream.grpc_server import GrpcServer
from lens_ebpf.agent.stream.reporter import Reporter, ReporterCollector
from lens_ebpf.core.loop import EventLoopThread
from lens_ebpf.protocol.tls import channel_credentials, server_credentials

log = logging.getLogger(__name__)


class EventApi:
    def __init__(self, cfg: Config, bus: EventBus, features: Callable[[], dict[str, str]],
                 loop: EventLoopThread | None = None,
                 on_connect: Callable[[], object] = lambda: None) -> None:  # fmt: skip
        self.cfg, self.bus, self.features, self.loop = cfg, bus, features, loop
        self.on_connect = on_connect  # the reporter (re)connected
        self.grpc: GrpcServer | None = None
        self.reporter: Reporter | None = None

    def bind(self) -> None:
        """Take the gRPC port (at start, before anything else is done or logged); raises
        OSError or RuntimeError when it cannot be had."""
        cfg, node = self.cfg, (self.cfg.node_name, self.cfg.node.ip)
        if cfg.grpc.enabled:
            t = cfg.grpc.tls
            self.grpc = GrpcServer(cfg.grpc.listen, self.bus, node, self.features,
                                   cfg.grpc.subscriber_queue,
                                   server_credentials(t.cert, t.key, t.client_ca),
                                   cfg.grpc.max_subscribers, self.loop)  # fmt: skip

    def start(self, registry: CollectorRegistry) -> None:
        cfg, node = self.cfg, (self.cfg.node_name, self.cfg.node.ip)
        if self.grpc is not None:
            self.grpc.start()
            registry.register(self.grpc.collector())
            log.info("gRPC on %s (port %d)", cfg.grpc.listen, self.grpc.port)
        r = cfg.reporter
        if r.target:
            creds = channel_credentials(r.tls.ca, r.tls.cert, r.tls.key)
            self.reporter = Reporter(r.target, self.bus, node, r.buffer, creds,
                                     r.backoff_max_seconds, frozenset(r.kinds),
                                     cfg.node.cluster)  # fmt: skip
            self.reporter.on_connect = self.on_connect
            self.reporter.start()
            registry.register(ReporterCollector(self.reporter))

    def stop(self) -> None:
        if self.reporter is not None:
            self.reporter.stop()
        if self.grpc is not None:
            self.grpc.stop()
