"""Sends the agent's OTLP requests: POST <endpoint>/v1/metrics and /v1/logs, protobuf,
each signal on its own connection and thread, in order.

What waits is bounded and what is lost is counted, as the reporter does. Events wait in
their bus subscription (logs.queue records; when it is full the oldest goes, counted as
dropped) and leave it in batches (logs.batch records, or what came within
logs.linger_seconds of the first). Metric snapshots (one request each, every
metrics.interval_seconds) wait in a queue of metrics.queue; when it is full the oldest
goes, its data points counted as dropped. The batch being sent is held apart from its
queue and sent again, with exponential backoff and jitter (up to backoff_max_seconds, or
what a Retry-After asks), until the endpoint takes it: on a connection that fails, 429,
502, 503 or 504, as the OTLP/HTTP specification says; any other answer rejects it
(counted, logged once per status). A 200 with a partial success counts the items it
rejected.
"""

from __future__ import annotations

import collections
import gzip
import http.client
import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.agent.events import Subscription
from lens_ebpf.agent.otlp import wire
from lens_ebpf.agent.otlp.logs import LogsEncoder
from lens_ebpf.agent.otlp.metrics import Snapshot
from lens_ebpf.core.backoff import Backoff
from lens_ebpf.core.exposition import counter, gauge

log = logging.getLogger(__name__)

METRICS, LOGS = "metrics", "logs"
ITEMS = {METRICS: "data points", LOGS: "log records"}
RETRYABLE = frozenset({429, 502, 503, 504})
OK, RETRY, REJECTED = "ok", "retry", "rejected"
# the answer's message, by signal: partial_success's rejected count field
_RESPONSES = {
    METRICS: (
        "opentelemetry.proto.collector.metrics.v1.metrics_service_pb2",
        "ExportMetricsServiceResponse",
        "rejected_data_points",
    ),
    LOGS: (
        "opentelemetry.proto.collector.logs.v1.logs_service_pb2",
        "ExportLogsServiceResponse",
        "rejected_log_records",
    ),
}


@dataclass
class Batch:
    """One request: its body (compressed when asked) and the items it holds."""

    body: bytes
    items: int


@dataclass
class SignalStats:
    """What happened to one signal's items (log records, data points) and requests."""

    exported: int = 0  # items the endpoint took
    made: int = 0  # batches made: metric snapshots, batches of log records
    dropped: collections.Counter[str] = field(default_factory=collections.Counter)
    batches: collections.Counter[str] = field(default_factory=collections.Counter)
    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    encode_seconds: float = 0.0  # CPU time making requests
    sent_bytes: int = 0
    last_success: float = 0.0  # unix seconds


@dataclass
class Answer:
    """What a POST came to."""

    result: str  # OK, RETRY, REJECTED
    status: int = 0  # 0: no answer (the connection failed)
    rejected: int = 0  # a partial success's rejected items
    retry_after: float = 0.0
    message: str = ""


class HttpClient:
    """One keep-alive connection to the endpoint, opened again after any failure."""

    def __init__(
        self,
        endpoint: str,
        headers: dict[str, str],
        timeout: float,
        tls: ssl.SSLContext | None = None,
        gzip_body: bool = True,
    ) -> None:
        url = urllib.parse.urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"collectors.otlp.endpoint: {endpoint!r} is not an http(s) URL")
        self.https = url.scheme == "https"
        self.host, self.port = url.hostname, url.port or (443 if self.https else 80)
        self.base = url.path.rstrip("/")
        self.timeout = timeout
        self.tls = (
            tls if tls is not None else (ssl.create_default_context() if self.https else None)
        )
        self.headers = {"Content-Type": "application/x-protobuf", **headers}
        if gzip_body:
            self.headers["Content-Encoding"] = "gzip"
        self._conn: http.client.HTTPConnection | None = None

    def url(self, signal: str) -> str:
        return f"{'https' if self.https else 'http'}://{self.host}:{self.port}{self.path(signal)}"

    def path(self, signal: str) -> str:
        return f"{self.base}/v1/{signal}"

    def post(self, signal: str, body: bytes) -> Answer:
        try:
            conn = self._conn
            if conn is None:
                conn = self._conn = self._connect()
            conn.request("POST", self.path(signal), body=body, headers=self.headers)
            resp = conn.getresponse()
            data = resp.read()
            if resp.getheader("Connection", "").lower() == "close":
                self.close()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return Answer(RETRY, message=f"{type(exc).__name__}: {exc}")
        status = resp.status
        if 200 <= status < 300:
            return Answer(OK, status, rejected=_rejected(signal, data))
        if status in RETRYABLE:
            return Answer(
                RETRY,
                status,
                retry_after=_retry_after(resp.getheader("Retry-After")),
                message=_message(data),
            )
        return Answer(REJECTED, status, message=_message(data))

    def _connect(self) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout, context=self.tls
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _response(signal: str) -> tuple[Any, str]:
    import importlib

    module, name, count = _RESPONSES[signal]
    return getattr(importlib.import_module(module), name), count


def _rejected(signal: str, data: bytes) -> int:
    """A 2xx answer's partial_success: the items it rejected (0 for an empty body)."""
    if not data:
        return 0
    cls, count = _response(signal)
    try:
        return int(getattr(cls.FromString(data).partial_success, count))
    except Exception:  # an answer that is not the message: taken as full success
        return 0


def _retry_after(value: str | None) -> float:
    try:
        return min(max(float(value or 0), 0.0), 300.0)
    except ValueError:
        return 0.0


def _message(data: bytes) -> str:
    """A refusal's google.rpc.Status message (field 2), when its body is one."""
    try:
        got = wire.find_string(data, 2)
    except (ValueError, IndexError, UnicodeDecodeError):
        got = None
    return (got if got is not None else data.decode(errors="replace"))[:200]


class Sender:
    """One signal's sending thread: takes a batch, POSTs it until the endpoint takes or
    rejects it, then the next."""

    def __init__(
        self,
        signal: str,
        client: HttpClient,
        take: Callable[[float], Batch | None],
        stats: SignalStats,
        backoff_max: float,
        stop: threading.Event,
    ) -> None:
        self.signal, self.client, self.take, self.stats = signal, client, take, stats
        self.backoff_max, self.stop = backoff_max, stop
        self.held: Batch | None = None  # the batch being sent
        self._warned: object = None  # the last problem logged (once until a success)
        self.thread = threading.Thread(target=self.run, name=f"otlp-{signal}", daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                batch = self.take(0.5)
            except Exception:  # a batch that cannot be made must not end the sending
                log.exception("otlp: making a %s request failed", self.signal)
                continue
            if batch is not None:
                self.held = batch
                self.deliver(batch)
                self.held = None
        self.client.close()

    def deliver(self, batch: Batch) -> bool:
        """Send until taken (True) or rejected; given up on when the agent stops."""
        backoff = Backoff(self.backoff_max, jitter=(0.5, 1.5))
        st = self.stats
        while True:
            answer = self.client.post(self.signal, batch.body)
            st.requests[answer.result] += 1
            st.sent_bytes += len(batch.body)
            if answer.result == OK:
                st.exported += batch.items - answer.rejected
                st.batches["exported"] += 1
                if answer.rejected:
                    st.dropped["rejected"] += answer.rejected
                st.last_success = time.time()
                self._warned = None
                return True
            if answer.result == REJECTED:
                st.dropped["rejected"] += batch.items
                st.batches["rejected"] += 1
                self._warn(
                    answer.status,
                    f"{self.client.url(self.signal)} rejected "
                    f"{batch.items} {ITEMS[self.signal]}: {answer.status} "
                    f"{answer.message}",
                )
                return False
            self._warn(
                RETRY,
                f"{self.client.url(self.signal)}: {answer.status or ''} "
                f"{answer.message}; sending again with backoff",
            )
            if self.stop.wait(max(backoff.next(), answer.retry_after)):
                st.dropped["stopped"] += batch.items
                st.batches["stopped"] += 1
                return False

    def _warn(self, kind: object, problem: str) -> None:
        if kind != self._warned:
            log.warning("otlp: %s", problem)
            self._warned = kind


def compress(body: bytes, gzip_body: bool) -> bytes:
    # level 1: a fraction of the default's CPU for most of its ratio on these bodies
    return gzip.compress(body, compresslevel=1, mtime=0) if gzip_body else body


class SnapshotQueue:
    """Metric snapshots waiting to be sent, the oldest dropped (its data points counted)
    beyond its bound."""

    def __init__(self, size: int, stats: SignalStats) -> None:
        self.size, self.stats = size, stats
        self.dropped = 0  # data points of the snapshots dropped
        self._queue: collections.deque[Batch] = collections.deque()
        self._cond = threading.Condition()

    def put(self, batch: Batch) -> None:
        with self._cond:
            self._queue.append(batch)
            while len(self._queue) > self.size:
                gone = self._queue.popleft()
                self.dropped += gone.items
                self.stats.batches["dropped"] += 1
            self._cond.notify()

    def take(self, timeout: float) -> Batch | None:
        with self._cond:
            if not self._queue:
                self._cond.wait(timeout)
            return self._queue.popleft() if self._queue else None

    def __len__(self) -> int:
        return len(self._queue)


class EventBatches:
    """Events from the bus subscription (the logs' queue: the oldest dropped beyond its
    bound, counted by it) as batches of records: up to batch, or what arrived within
    linger seconds of the first."""

    def __init__(
        self,
        sub: Subscription,
        size: int,
        encoder: LogsEncoder,
        batch: int,
        linger: float,
        gzip_body: bool,
        stats: SignalStats,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sub, self.size, self.encoder = sub, size, encoder  # size: the subscription's
        self.batch, self.linger = batch, linger
        self.gzip, self.stats, self.clock = gzip_body, stats, clock

    @property
    def dropped(self) -> int:
        return self.sub.dropped

    def take(self, timeout: float) -> Batch | None:
        events = self.sub.take(self.batch, timeout=timeout)
        if not events:
            return None
        deadline = self.clock() + self.linger
        while len(events) < self.batch and (left := deadline - self.clock()) > 0:
            events += self.sub.take(self.batch - len(events), timeout=left)
        t0 = time.thread_time()
        snap = self.encoder.encode(events)
        body = compress(snap.body, self.gzip)
        self.stats.encode_seconds += time.thread_time() - t0
        self.stats.made += 1
        return Batch(body, snap.points)

    def __len__(self) -> int:
        return len(self.sub)


def snapshot_batch(snap: Snapshot, gzip_body: bool) -> Batch:
    return Batch(compress(snap.body, gzip_body), snap.points)


class OtlpCollector(Collector):
    """The exporter's own figures, per signal."""

    def __init__(
        self, stats: dict[str, SignalStats], queues: dict[str, SnapshotQueue | EventBatches]
    ) -> None:
        self._stats, self._queues = stats, queues

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        exported = counter(
            "lens_agent_otlp_exported",
            "Items the OTLP endpoint " "took: log records, metric data points",
        )
        dropped = counter(
            "lens_agent_otlp_dropped",
            "Items lost, by reason: queue_full (the oldest, beyond "
            "the queue's bound), rejected (the endpoint refused "
            "them), stopped (held when the agent stopped)",
        )
        batches = counter(
            "lens_agent_otlp_batches",
            "Requests' worth of items "
            "(a metric snapshot, a batch of log records), by what "
            "came of them: exported, dropped, rejected, stopped",
        )
        made = counter(
            "lens_agent_otlp_batches_made",
            "Requests' worth of items " "made: metric snapshots, batches of log records",
        )
        requests = counter(
            "lens_agent_otlp_requests",
            "POSTs to the endpoint, " "by result: ok, retry (failed, sent again), rejected",
        )
        cpu = counter(
            "lens_agent_otlp_encode_cpu_seconds",
            "CPU time making " "requests: reading, encoding, compressing",
        )
        sent = counter("lens_agent_otlp_sent_bytes", "Request bytes POSTed, " "each try")
        last = gauge(
            "lens_agent_otlp_last_success_timestamp_seconds",
            "When the endpoint last took a request",
        )
        queue = gauge(
            "lens_agent_otlp_queue", "Waiting to be sent: log " "records, metric snapshots"
        )
        cap = gauge(
            "lens_agent_otlp_queue_capacity", "The queue's bound: log " "records, metric snapshots"
        )
        for signal, st in self._stats.items():
            exported.add({"signal": signal}, st.exported)
            q = self._queues.get(signal)
            dropped.add(
                {"signal": signal, "reason": "queue_full"}, q.dropped if q is not None else 0
            )
            for reason in ("rejected", "stopped"):
                dropped.add({"signal": signal, "reason": reason}, st.dropped[reason])
            for result in ("exported", "dropped", "rejected", "stopped"):
                batches.add({"signal": signal, "result": result}, st.batches[result])
            made.add({"signal": signal}, st.made)
            for result in (OK, RETRY, REJECTED):
                requests.add({"signal": signal, "result": result}, st.requests[result])
            cpu.add({"signal": signal}, st.encode_seconds)
            sent.add({"signal": signal}, st.sent_bytes)
            last.add({"signal": signal}, st.last_success)
        for signal, q in self._queues.items():
            queue.add({"signal": signal}, len(q))
            cap.add({"signal": signal}, q.size)
        yield from (exported, dropped, batches, made, requests, cpu, sent, last, queue, cap)
