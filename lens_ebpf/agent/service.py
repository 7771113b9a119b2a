"""The agent: builds the shared parts (cache, bus, loader, enrichment, policy, HTTP, gRPC),
starts the registered features in order, reads them each cycle, stops them in reverse.
What a feature does lives in its own module (agent/feature.py)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from lens_ebpf import __version__
from lens_ebpf.agent import kernel_headers, tracefs
from lens_ebpf.agent.bpf.loader import BpfLoader, LoaderCollector
from lens_ebpf.agent.config import Config, policy_path
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.events import EventBus, EventBusCollector
from lens_ebpf.agent.feature import ERROR, OFF, Context, Feature, FeatureCollector, build_features
from lens_ebpf.agent.inventory import DeviceWatch
from lens_ebpf.agent.memory import release_compiler_memory, trim_heap
from lens_ebpf.agent.metrics.cache import CacheCollector, MetricCache
from lens_ebpf.agent.net.policy import PolicyError
from lens_ebpf.agent.net.policy_watch import PolicyCollector, PolicyWatcher
from lens_ebpf.agent.stream.event_api import EventApi
from lens_ebpf.core.collector import CollectorSet
from lens_ebpf.core.http import HttpServer, Response, front, json_response
from lens_ebpf.core.loop import EventLoopThread
from lens_ebpf.core.routes import RouteTable, Whole
from lens_ebpf.core.runner import Job, Runner

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The agent cannot start; the message is one line for the operator."""


class Agent:
    def __init__(self, cfg: Config) -> None:
        self.cfg, self.ready, self.heartbeat = cfg, False, time.monotonic()
        self.stop_event = threading.Event()
        self._threads: list[threading.Thread] = []
        self.runner = Runner(name="agent")  # the read cycle, the policy file, the collectors
        try:
            policy = PolicyWatcher(policy_path(cfg))
        except PolicyError as exc:
            raise StartupError(f"policy: {exc}") from None
        enrich = Enrichment.for_node(
            Path(cfg.devices.procfs_root),
            Path(cfg.devices.sysfs_root),
            Path(cfg.containers.containerd_state),
        )
        bus = EventBus(
            cfg.events.queue_size, history=cfg.grpc.history, node=(cfg.node_name, cfg.node.ip)
        )
        self.registry = CollectorRegistry(auto_describe=False)
        # each feature reads its own sections and these, never the whole config
        self.ctx = Context(
            node=cfg.node.model_copy(update={"name": cfg.node_name}),
            bpf=cfg.bpf,
            events=cfg.events,
            devices=cfg.devices,
            containers=cfg.containers,
            kubernetes=cfg.kubernetes,
            cache=MetricCache(
                cfg.cache.ttl_seconds,
                cfg.cache.max_series,
                cfg.cache.families,
                max_samples=cfg.cache.max_samples,
            ),
            bus=bus,
            loader=BpfLoader(),
            enrich=enrich,
            policy=policy,
            periodic=CollectorSet(runner=self.runner),
            stop=self.stop_event,
            spawn=self._spawn,
            watch=DeviceWatch(bus.publish),
            registry=self.registry,
        )
        self.features: list[Feature] = build_features(self.ctx, cfg.collectors)
        self.http: HttpServer | None = None
        self.loop = EventLoopThread("aio")  # HTTP and gRPC: one loop, no thread per client
        self.events = EventApi(
            self.ctx.node,
            cfg.grpc,
            cfg.reporter,
            self.ctx.bus,
            lambda: {k: v["state"] for k, v in self.views().items()},
            self.loop,
            on_connect=self.ctx.watch.inventory_again,
            kubernetes=cfg.kubernetes,
            services=lambda guard: [h for f in self.features for h in f.grpc_handlers(guard)],
        )
        self.headers: kernel_headers.HeaderTree | None = None

    def rest(self) -> RouteTable:
        """The agent's REST: health, and every feature's routes (Feature.routes()), each
        answering whole in the node exporter's envelope (core.http.envelope) or its own."""
        paths = {"/healthz": self._healthz, "/readyz": self._readyz}
        for f in self.features:
            paths.update(f.routes())
        routes = RouteTable()
        probes = {"/healthz", "/readyz", "/health", "/ready"}  # never queued behind work
        for path, route in {**paths, "/health": self._healthz, "/ready": self._readyz}.items():
            routes.get(path, probe=path in probes)(route)
        return routes

    def views(self) -> dict[str, dict[str, Any]]:
        return {name: v for f in self.features for name, v in f.views().items()}

    def start(self) -> None:
        """Bind the ports (fail fast), start the features, then serve events."""
        ctx, srv = self.ctx, self.cfg.server
        host, port = srv.host, srv.port
        try:  # both ports first: a port in use is one line and exit 2, before any work
            self.events.bind()
        except (OSError, RuntimeError) as exc:
            raise StartupError(f"gRPC: {exc}") from None
        try:
            self.http = HttpServer(
                host,
                port,
                self.registry,
                srv.max_connections,
                srv.request_timeout_seconds,
                srv.max_header_bytes,
                self.loop,
                **front(srv),
            )
        except OSError as exc:
            raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.http.mount("", Whole(), self.rest())
        for c in (
            CacheCollector(ctx.cache),
            LoaderCollector(ctx.loader),
            ctx.periodic,
            EventBusCollector(ctx.bus),
            PolicyCollector(ctx.policy),
            FeatureCollector(self.views),
            self.http.collector(),
        ):
            self.registry.register(c)
        self.http.start()
        log.info("lens-ebpf %s serving on %s:%d", __version__, host, self.http.port)
        tracefs.ensure_mounted()
        self.headers = kernel_headers.for_config(self.cfg.kernel)
        if self.cfg.bpf.run_stats:
            ctx.loader.enable_stats()
        for f in self.features:  # in order: a feature's enabled() may ask an earlier one
            if why := f.enabled():
                f.state = {"state": OFF, "reason": why}
                continue
            try:
                f.start()
            except Exception as exc:  # a broken feature must not stop the others
                log.exception("feature %s failed to start", f.name)
                f.state = {"state": ERROR, "reason": str(exc)}
            for fc in f.collectors():
                self.registry.register(fc)
        ctx.periodic.start()
        # the programs are compiled and loaded: the compiler's pages go back (memory.py)
        freed = release_compiler_memory()
        if freed:
            log.info("gave back %.0f MB of the BPF compiler's pages", freed / 2**20)
        self.events.start(self.registry)
        self.runner.add(
            Job(
                "reader",
                self.cfg.bpf.read_interval_seconds,
                self._read_once,
                leader_only=False,
                at_start=True,
            )
        )
        self.runner.add(
            Job(
                "policy",
                self.cfg.policy.watch_interval_seconds,
                ctx.policy.check,
                leader_only=False,
                at_start=True,
            )
        )
        self.ready = True

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _read_once(self) -> None:
        """One read cycle: every feature, then the cache's expiry (the runner's job)."""
        for f in self.features:
            try:
                f.read()
            except Exception:
                log.exception("reading %s failed", f.name)
        # series past their TTL go now, scraped or not; then the heap's free pages go
        # back to the system (what expired series, scrapes and event bursts freed:
        # 6-10 MB at 1,000-39,000 series; malloc_trim takes ~0.1 ms)
        self.ctx.cache.expire()
        trim_heap()
        self.heartbeat = time.monotonic()

    def _healthz(self) -> Response:
        if time.monotonic() - self.heartbeat > 3 * self.cfg.bpf.read_interval_seconds + 10:
            return json_response(503, {"status": "reader stalled"})
        return json_response(200, {"status": "ok"})

    def _readyz(self) -> Response:
        """Ready: started, and no feature the config asks for failed (an error, not a
        kernel that lacks its probe points: that is off, with the reason)."""
        h, views = self.headers, self.views()
        failed = {k: v["reason"] for k, v in views.items() if v["state"] == ERROR}
        ready = self.ready and not failed
        body = {
            "ready": ready,
            "failed": failed,
            "version": __version__,
            "features": views,
            "policy": self.ctx.policy.status(),
            "kernel_headers": {"source": h.source, "path": h.path} if h else None,
        }
        for f in self.features:
            body.update(f.report())
        return json_response(200 if ready else 503, body)

    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGHUP, lambda *_: self.ctx.policy.reload_requested.set())

    def stop(self) -> None:
        """Stop the features in reverse, detach every program, stop serving."""
        if self.http is None:
            self.events.stop()  # the gRPC port may be held
            self.loop.close()
            return  # nothing else was started
        self.stop_event.set()
        self.runner.stop()
        for t in self._threads:
            t.join(timeout=5)
        for f in reversed(self.features):
            f.stop()
        self.events.stop()
        self.ctx.periodic.stop()
        self.ctx.loader.close()
        self.http.stop()
        self.loop.close()
        log.info("lens-ebpf stopped; all BPF programs detached")
