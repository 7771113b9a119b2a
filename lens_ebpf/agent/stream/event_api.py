"""The event side of the agent: gRPC Subscribe/GetNode and, when configured, the reporter."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from lens_ebpf.agent.config import GrpcConfig, KubernetesConfig, NodeConfig, ReporterConfig
from lens_ebpf.agent.events import EventBus
from lens_ebpf.agent.stream.grpc_server import GrpcServer
from lens_ebpf.agent.stream.reporter import Reporter, ReporterCollector
from lens_ebpf.core.loop import EventLoopThread
from lens_ebpf.protocol.stream_auth import Claim, Guard
from lens_ebpf.protocol.tls import channel_credentials, server_credentials

if TYPE_CHECKING:
    from lens_ebpf.k8s.tokenreview import TokenReviewer

log = logging.getLogger(__name__)


class EventApi:
    """node: its name resolved (the agent's Context.node)."""

    def __init__(
        self,
        node: NodeConfig,
        grpc: GrpcConfig,
        reporter: ReporterConfig,
        bus: EventBus,
        features: Callable[[], dict[str, str]],
        loop: EventLoopThread | None = None,
        on_connect: Callable[[], object] = lambda: None,
        kubernetes: KubernetesConfig | None = None,
        services: Callable[[Guard | None], list[Any]] = lambda guard: [],
    ) -> None:
        self.node, self.grpc_cfg, self.reporter_cfg = node, grpc, reporter
        self.services = services  # the features' gRPC services, behind the port's guard
        self.kubernetes = kubernetes or KubernetesConfig()
        self.bus, self.features, self.loop = bus, features, loop
        self.on_connect = on_connect  # the reporter (re)connected
        self.grpc: GrpcServer | None = None
        self.reporter: Reporter | None = None

    def bind(self) -> None:
        """Take the gRPC port (at start, before anything else is done or logged); raises
        OSError or RuntimeError when it cannot be had."""
        g = self.grpc_cfg
        if g.enabled:
            t = g.tls
            self.grpc = GrpcServer(
                g.listen,
                self.bus,
                (self.node.name, self.node.ip),
                self.features,
                g.subscriber_queue,
                server_credentials(t.cert, t.key, t.client_ca),
                g.max_subscribers,
                self.loop,
                self._guard(),
                self.services,
            )

    def _guard(self) -> Guard:
        """Who may subscribe (grpc.auth): TokenReview through the agent's Kubernetes API
        where it has one, for the allowed accounts (a bare name: of its own namespace)."""
        auth = self.grpc_cfg.auth
        reviewer = self._reviewer() if auth.tokenreview else None
        if reviewer is None:
            return Guard(auth, self.grpc_cfg.listen, "gRPC")
        from lens_ebpf.k8s.client import own_namespace

        allowed = auth.accounts(own_namespace())

        def verify(token: str, claim: Claim) -> Any:
            return reviewer.account(token, allowed)

        return Guard(auth, self.grpc_cfg.listen, "gRPC", verify)

    def _reviewer(self) -> TokenReviewer | None:
        """A TokenReviewer of the agent's API; None standalone."""
        from lens_ebpf.k8s.client import NotConfiguredError, api_client
        from lens_ebpf.k8s.tokenreview import TokenReviewer

        k = self.kubernetes
        try:
            client = api_client(k.mode, k.kubeconfig)
        except NotConfiguredError:
            return None
        except Exception as exc:  # a configured API that cannot be used
            log.error("grpc.auth: no TokenReview (%s)", exc)
            return None
        return TokenReviewer(client, self.grpc_cfg.auth.audience, k.request_timeout_seconds)

    def start(self, registry: CollectorRegistry) -> None:
        if self.grpc is not None:
            self.grpc.start()
            registry.register(self.grpc.collector())
            log.info("gRPC on %s (port %d)", self.grpc_cfg.listen, self.grpc.port)
        r, node = self.reporter_cfg, self.node
        if r.target:
            creds = channel_credentials(r.tls.ca, r.tls.cert, r.tls.key)
            self.reporter = Reporter(
                r.target,
                self.bus,
                (node.name, node.ip),
                r.buffer,
                creds,
                r.backoff_max_seconds,
                frozenset(r.kinds),
                node.cluster,
                r.token_file,
            )
            self.reporter.on_connect = self.on_connect
            self.reporter.start()
            registry.register(ReporterCollector(self.reporter))

    def stop(self) -> None:
        if self.reporter is not None:
            self.reporter.stop()
        if self.grpc is not None:
            self.grpc.stop()
