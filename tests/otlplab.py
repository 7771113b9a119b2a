"""An OTLP/HTTP receiver for tests: takes POST /v1/metrics and /v1/logs (protobuf, gzip
or not), decodes each with opentelemetry-proto and keeps it with its arrival time. No
OpenTelemetry Collector installs from the registries the tests reach; this stands in for
its otlphttp receiver. stop() closes the port (a client's connect is refused), start()
opens it again on the same port; setting status makes it refuse with that status."""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from prometheus_client.utils import floatToGoString

REQUESTS = {
    "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
    "/v1/logs": (ExportLogsServiceRequest, ExportLogsServiceResponse),
}


class _Server(ThreadingHTTPServer):
    """Keeps the connections it took, to close them when the receiver stops."""

    daemon_threads = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.conns: set[socket.socket] = set()
        self.conns_lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        with self.conns_lock:
            self.conns.add(conn)
        return conn, addr

    def shutdown_request(self, request: Any) -> None:
        with self.conns_lock:
            self.conns.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        with self.conns_lock:
            conns, self.conns = self.conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)


@dataclass
class Received:
    path: str
    at: float  # time.time() on arrival
    message: Any  # the decoded request
    headers: dict[str, str]


class OtlpReceiver:
    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.received: list[Received] = []
        self.status = 200  # what it answers
        self.retry_after = ""
        self.partial: dict[str, int] = {}  # path -> rejected items to answer
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        rx = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                kinds = next((v for k, v in REQUESTS.items() if self.path.endswith(k)), None)
                if kinds is None:
                    self._answer(404, b"")
                    return
                if rx.status != 200:
                    extra = {"Retry-After": rx.retry_after} if rx.retry_after else {}
                    self._answer(rx.status, b"", extra)
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                assert self.headers.get("Content-Type") == "application/x-protobuf"
                msg = kinds[0].FromString(body)
                with rx.lock:
                    rx.received.append(Received(self.path, time.time(), msg, dict(self.headers)))
                    rejected = rx.partial.get(self.path, 0)
                resp = kinds[1]()
                if rejected:
                    field = (
                        "rejected_data_points" if "metrics" in self.path else "rejected_log_records"
                    )
                    setattr(resp.partial_success, field, rejected)
                self._answer(200, resp.SerializeToString())

            def _answer(self, code: int, body: bytes, extra: dict[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

        self._server = _Server(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Close the port and every connection it took (a client's keep-alive one too)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server.drop_connections()
            self._server = None

    def of(self, path: str, since: float = 0.0) -> list[Received]:
        """The requests to a path (or one under the endpoint's own: .../v1/logs)."""
        with self.lock:
            return [r for r in self.received if r.path.endswith(path) and r.at >= since]

    def metrics(self, since: float = 0.0) -> list[Received]:
        return self.of("/v1/metrics", since)

    def logs(self, since: float = 0.0) -> list[Received]:
        return self.of("/v1/logs", since)


def attrs(kvs: Any) -> dict[str, Any]:
    """KeyValues as a dict of plain values (a string, int, bool, double; arrays as lists)."""
    return {kv.key: value(kv.value) for kv in kvs}


def value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return attrs(v.kvlist_value.values)
    return getattr(v, which) if which else None


Sample = tuple[str, frozenset[tuple[str, str]]]


def samples(req: Any) -> dict[Sample, float]:
    """An ExportMetricsServiceRequest as /metrics shows it: sample name and labels (a data
    point's attributes, and those of its resource that came from labels: namespace, pod,
    container ...) -> value; a histogram as its cumulative _bucket, _count and _sum. A
    counter is named as OTLP names it (without _total)."""
    back = {
        "k8s.namespace.name": "namespace",
        "k8s.pod.name": "pod",
        "k8s.container.name": "container",
        "container.id": "container_id",
        "k8s.pod.uid": "pod_uid",
    }
    out: dict[Sample, float] = {}
    for rm in req.resource_metrics:
        res = {back[k]: v for k, v in attrs(rm.resource.attributes).items() if k in back}
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                if kind in ("sum", "gauge"):
                    for p in getattr(m, kind).data_points:
                        lbl = frozenset({**res, **attrs(p.attributes)}.items())
                        out[(m.name, lbl)] = p.as_double
                elif kind == "histogram":
                    for p in m.histogram.data_points:
                        labels = {**res, **attrs(p.attributes)}
                        acc = 0
                        for b, n in zip(
                            [*p.explicit_bounds, float("inf")], p.bucket_counts, strict=True
                        ):
                            acc += n
                            le = frozenset({**labels, "le": floatToGoString(b)}.items())
                            out[(m.name + "_bucket", le)] = acc
                        out[(m.name + "_count", frozenset(labels.items()))] = p.count
                        out[(m.name + "_sum", frozenset(labels.items()))] = p.sum
    return out
