"""OTLP/HTTP out: the metrics /metrics serves and the events the agent streams, sent to an
OpenTelemetry endpoint (an OpenTelemetry Collector's otlphttp receiver, or any backend
that takes OTLP/HTTP protobuf). Off unless asked for (collectors.otlp.enabled and its
endpoint). The work is in agent/otlp/; the page is docs/agent/otlp.md.
"""

from __future__ import annotations

import ssl
import threading
import time
from itertools import chain
from typing import Any, Literal

from prometheus_client.registry import Collector
from pydantic import Field, ValidationInfo, field_validator

from lens_ebpf.agent.feature import RUNNING, Feature, Settings, register
from lens_ebpf.core.runner import Job
from lens_ebpf.core.settings import Section
from lens_ebpf.protocol.tls import ClientTlsConfig

# the flow, process and GPU events
DEFAULT_KINDS = [
    "flow_closed",
    "abnormal_flow",
    "process_exec",
    "process_exit",
    "oom_kill",
    "gpu_fault",
    "device_change",
]


class OtlpMetricsSettings(Section):
    enabled: bool = True
    interval_seconds: float = Field(30.0, gt=0, le=86400)  # a snapshot of /metrics this often
    queue: int = Field(8, ge=1, le=10_000)  # snapshots waiting; the oldest dropped beyond


class OtlpLogsSettings(Section):
    enabled: bool = True
    kinds: list[str] = Field(default_factory=lambda: list(DEFAULT_KINDS))  # empty: every kind
    queue: int = Field(100_000, ge=1, le=10_000_000)  # records waiting; the oldest dropped beyond
    batch: int = Field(1024, ge=1, le=100_000)  # records per request at most
    linger_seconds: float = Field(1.0, ge=0, le=60)  # a batch waits this long for more

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, v: list[str]) -> list[str]:
        from lens_ebpf.agent.events import KINDS

        unknown = [k for k in v if k not in KINDS]
        if unknown:
            raise ValueError(f"unknown event kind(s) {unknown}; known: {', '.join(KINDS)}")
        return v


class OtlpSettings(Settings):
    """collectors.otlp: where to, how, and what (docs/agent/otlp.md)."""

    enabled: bool = False
    # http(s)://host:4318; /v1/metrics and /v1/logs are added to its path
    endpoint: str = Field("", validate_default=True)
    headers: dict[str, str] = Field(default_factory=dict)  # e.g. {authorization: Bearer ...}
    compression: Literal["gzip", "none"] = "gzip"
    timeout_seconds: float = Field(10.0, gt=0, le=600)
    backoff_max_seconds: float = Field(30.0, gt=0, le=3600)
    tls: ClientTlsConfig = Field(default_factory=ClientTlsConfig)  # https: ca, client cert
    resource: dict[str, str] = Field(default_factory=dict)  # attributes added to every resource
    metrics: OtlpMetricsSettings = Field(default_factory=OtlpMetricsSettings)
    logs: OtlpLogsSettings = Field(default_factory=OtlpLogsSettings)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str, info: ValidationInfo) -> str:
        if info.data.get("enabled") and not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r}: an http:// or https:// URL is needed when enabled")
        return v


def tls_context(tls: ClientTlsConfig) -> ssl.SSLContext | None:
    """The client's TLS for an https endpoint: the system's CAs or tls.ca, and a client
    certificate when tls.cert is set; None leaves the default."""
    if not (tls.ca or tls.cert):
        return None
    ctx = ssl.create_default_context(cafile=tls.ca or None)
    if tls.cert:
        ctx.load_cert_chain(tls.cert, tls.key or None)
    return ctx


@register("otlp", order=90, settings={"otlp": OtlpSettings})
class OtlpFeature(Feature):
    """Starts after every other feature: its snapshots read what they registered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stop = threading.Event()
        self._senders: list[Any] = []
        self._collector: Collector | None = None
        self._sub: Any = None

    def enabled(self) -> str:
        return "" if self.ctx.settings("otlp", OtlpSettings).enabled else "disabled by config"

    def start(self) -> None:
        # here, not at import: an agent with the feature off needs no opentelemetry-proto
        from lens_ebpf import __version__
        from lens_ebpf.agent.events import EventFilter
        from lens_ebpf.agent.otlp import exporter, semconv
        from lens_ebpf.agent.otlp.logs import LogsEncoder
        from lens_ebpf.agent.otlp.metrics import MetricsEncoder, from_cache, from_prometheus

        ctx, s = self.ctx, self.ctx.settings("otlp", OtlpSettings)
        gz = s.compression == "gzip"
        node = semconv.node_attributes(ctx.node.name, __version__, ctx.node.cluster, s.resource)
        stats = {
            sig: exporter.SignalStats()
            for sig in (exporter.METRICS, exporter.LOGS)
            if getattr(s, sig).enabled
        }
        queues: dict[str, Any] = {}

        def sender(signal: str, take: Any) -> None:
            client = exporter.HttpClient(
                s.endpoint, s.headers, s.timeout_seconds, tls_context(s.tls), gz
            )
            self._senders.append(
                exporter.Sender(
                    signal, client, take, stats[signal], s.backoff_max_seconds, self._stop
                )
            )

        if s.metrics.enabled:
            mq = queues[exporter.METRICS] = exporter.SnapshotQueue(
                s.metrics.queue, stats[exporter.METRICS]
            )
            encoder = MetricsEncoder(node, __version__, time.time_ns())

            def snapshot() -> None:
                t0 = time.thread_time()
                families = chain(
                    from_cache(ctx.cache.snapshot()), from_prometheus(ctx.registry.collect())
                )
                batch = exporter.snapshot_batch(encoder.encode(families, time.time_ns()), gz)
                stats[exporter.METRICS].encode_seconds += time.thread_time() - t0
                stats[exporter.METRICS].made += 1
                mq.put(batch)

            sender(exporter.METRICS, mq.take)
            ctx.periodic.runner.add(
                Job("otlp-metrics", s.metrics.interval_seconds, snapshot, leader_only=False)
            )
        if s.logs.enabled:
            accept = EventFilter(kinds=frozenset(s.logs.kinds)) if s.logs.kinds else None
            self._sub = ctx.bus.subscribe("otlp", accept=accept, maxsize=s.logs.queue)
            lq = queues[exporter.LOGS] = exporter.EventBatches(
                self._sub,
                s.logs.queue,
                LogsEncoder(node, __version__),
                s.logs.batch,
                s.logs.linger_seconds,
                gz,
                stats[exporter.LOGS],
            )
            sender(exporter.LOGS, lq.take)
        for snd in self._senders:
            snd.thread.start()
        self._collector = exporter.OtlpCollector(stats, queues)
        self.state = {"state": RUNNING, "reason": ""}

    def collectors(self) -> list[Collector]:
        return [self._collector] if self._collector is not None else []

    def stop(self) -> None:
        self._stop.set()
        for snd in self._senders:
            snd.thread.join(timeout=5)
        if self._sub is not None:
            self.ctx.bus.unsubscribe(self._sub)
