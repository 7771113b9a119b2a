"""HTTP front: /metrics, health and readiness, and JSON routes other modules add.

Bounded against abusive clients: at most `max_connections` at once (more get 503 and are
counted), a request head must arrive whole within `request_timeout` of connecting or of
the previous response (idle keep-alive connections and slowloris drips are cut by one
reaper thread), request heads are capped at `max_header_bytes` (431 beyond), clients that
hang up are not tracebacks, and scrapes that arrive while /metrics renders share that
rendering instead of each rendering again.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lens_ebpf.metrics.exposition import CONTENT_TYPE, render

log = logging.getLogger(__name__)

Response = tuple[int, str, bytes]
Route = Callable[[], Response]
# a route under a prefix: (the path below the prefix, the query's last value per key)
QueryRoute = Callable[[str, dict[str, str]], Response]


def json_response(status: int, body: Any) -> Response:
    return status, "application/json", (json.dumps(body, sort_keys=True) + "\n").encode()


def envelope(data: Any) -> Response:
    """The node exporter's REST envelope."""
    return json_response(200, {"code": 0, "data": data, "message": "success"})


class _HeadBudget:
    """The request head's reader: LineTooLong (answered 431) past the byte budget."""

    def __init__(self, raw: Any, budget: int) -> None:
        self.raw, self.left = raw, budget

    def readline(self, size: int = -1) -> bytes:
        line = self.raw.readline(size)
        self.left -= len(line)
        if self.left < 0:
            raise http.client.LineTooLong("request head")
        return bytes(line)

    def read(self, size: int = -1) -> bytes:
        return bytes(self.raw.read(size))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # socketserver's 5 drops SYNs under a burst of clients

    def __init__(self, addr: tuple[str, int], handler: Any, max_connections: int,
                 request_timeout: float) -> None:  # fmt: skip
        super().__init__(addr, handler)
        self.slots = threading.BoundedSemaphore(max_connections)
        self.request_timeout = request_timeout
        self.open = 0
        self.refused = 0
        self.cut = 0  # connections closed for sending no whole request head in time
        self.deadlines: dict[socket.socket, float] = {}
        self.lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.refused += 1
            with contextlib.suppress(OSError):
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                b"Connection: close\r\n\r\n")  # fmt: skip
            self.shutdown_request(request)
            return
        with self.lock:
            self.open += 1
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done(request)

    def _done(self, request: Any) -> None:
        with self.lock:
            self.open -= 1
            self.deadlines.pop(request, None)
        self.slots.release()

    def expect_head(self, conn: socket.socket) -> None:
        with self.lock:
            self.deadlines[conn] = time.monotonic() + self.request_timeout

    def head_read(self, conn: socket.socket) -> None:
        with self.lock:
            self.deadlines.pop(conn, None)

    def reap(self) -> None:
        """Shut the connections whose request head is overdue (one thread for all)."""
        now = time.monotonic()
        with self.lock:
            late = [c for c, t in self.deadlines.items() if t < now]
            for c in late:
                del self.deadlines[c]
        for c in late:
            self.cut += 1
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("http: %s: connection ended with an error", client_address, exc_info=True)


class HttpServer:
    """A threaded HTTP server with a fixed route table, bounded as the module says."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 max_connections: int = 256, request_timeout: float = 10.0,
                 max_header_bytes: int = 65536) -> None:  # fmt: skip
        self.registry = registry
        self.routes: dict[str, Route] = {"/metrics": self._metrics}
        self.query_routes: dict[str, QueryRoute] = {}
        routes, query_routes = self.routes, self.query_routes
        self.renders = 0
        self.scrapes = 0
        self._cond = threading.Condition()
        self._rendering = False
        self._generation = 0
        self._result = b""

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # the reaper cuts an overdue head; the socket timeout is only a backstop
            timeout = 2 * request_timeout + 1

            def handle_one_request(self) -> None:
                server: _Server = self.server  # type: ignore[assignment]
                server.expect_head(self.connection)
                raw, self.rfile = self.rfile, _HeadBudget(self.rfile, max_header_bytes)  # type: ignore[assignment]
                try:
                    super().handle_one_request()
                finally:
                    self.rfile = raw

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self.server.head_read(self.connection)  # type: ignore[attr-defined]
                url = urlsplit(self.path)
                path = url.path.rstrip("/") or "/"
                route = routes.get(path)
                if route is None:
                    for prefix, qroute in query_routes.items():
                        if path == prefix or path.startswith(prefix + "/"):
                            query = dict(parse_qsl(url.query))
                            rest = unquote(path[len(prefix) :].lstrip("/"))
                            route = partial(qroute, rest, query)
                            break
                if route is None:
                    status, ctype, body = json_response(404, {"error": f"no route {path}"})
                else:
                    try:
                        status, ctype, body = route()
                    except Exception as exc:  # a broken route must not take the server down
                        log.exception("route %s failed", path)
                        status, ctype, body = json_response(500, {"error": str(exc)})
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("http: " + format, *args)

        self._server = _Server((host, port), Handler, max_connections, request_timeout)
        self._thread: threading.Thread | None = None
        self._reaper: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def add(self, path: str, route: Route) -> None:
        self.routes[path] = route

    def add_query(self, prefix: str, route: QueryRoute) -> None:
        """A route for prefix and every path below it, given the rest and the query."""
        self.query_routes[prefix.rstrip("/")] = route

    def _metrics(self) -> Response:
        """Render once for every scrape that arrives while a rendering runs."""
        with self._cond:
            self.scrapes += 1
            if self._rendering:
                generation = self._generation
                while self._generation == generation:
                    self._cond.wait()
                return 200, CONTENT_TYPE, self._result
            self._rendering = True
        body = b""
        try:
            body = render([self.registry])
            self.renders += 1
        finally:
            with self._cond:
                self._result = body
                self._rendering = False
                self._generation += 1
                self._cond.notify_all()
        return 200, CONTENT_TYPE, body

    def collector(self) -> Collector:
        return _HttpCollector(self)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)
        self._thread.start()
        self._reaper = threading.Thread(target=self._reap, name="http-reaper", daemon=True)
        self._reaper.start()

    def _reap(self) -> None:
        while not self._stop.wait(min(1.0, self._server.request_timeout / 2)):
            self._server.reap()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:  # shutdown() waits for a serve loop that never ran
            self._server.shutdown()
        self._server.server_close()


class _HttpCollector(Collector):
    def __init__(self, http: HttpServer) -> None:
        self._h = http

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        s = self._h._server
        yield GaugeMetricFamily("lens_agent_http_connections", "HTTP connections open",
                                value=s.open)  # fmt: skip
        yield CounterMetricFamily("lens_agent_http_connections_refused",
                                  "HTTP connections refused (server.max_connections open)",
                                  value=s.refused)  # fmt: skip
        yield CounterMetricFamily("lens_agent_http_connections_timed_out",
                                  "HTTP connections closed: no whole request head in time",
                                  value=s.cut)  # fmt: skip
        yield CounterMetricFamily("lens_agent_metrics_scrapes", "/metrics requests",
                                  value=self._h.scrapes)  # fmt: skip
        yield CounterMetricFamily("lens_agent_metrics_renders",
                                  "/metrics renderings (concurrent scrapes share one)",
                                  value=self._h.renders)  # fmt: skip
