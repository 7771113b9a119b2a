"""HTTP front on aiohttp: /metrics, and the route tables (core/routes.py) mounted on it.

One asyncio loop (api/loop.py, shared with the gRPC servers) holds every connection, so
an idle or slow client costs a coroutine, not a thread. Bounded against abusive clients:
beyond `max_connections` open at once a new connection gets 503 and is closed (counted);
a request head must arrive whole within `request_timeout` of connecting or of the
previous response (aiohttp's keep-alive timer, counted when it cuts); request heads are
capped at `max_header_bytes` (431 beyond); clients that hang up are not tracebacks; and
scrapes that arrive while /metrics renders share that rendering. Routes come only
through mount(): their surface calls them on a worker thread, so a slow one never holds
the loop. POST routes get their body whole, read up to the route's own bound (413
beyond, counted, before the rest is read); with a certificate the server speaks TLS
(mutual TLS with a client CA).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import socket
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lens_ebpf.core.exposition import CONTENT_TYPE, render
from lens_ebpf.core.loop import EventLoopThread
from lens_ebpf.core.routes import (
    WRITES,
    Answer,
    Mounted,
    Request,
    Response,
    Routes,
    RouteTable,
    Surface,
)

log = logging.getLogger(__name__)

__all__ = ["Answer", "HttpServer", "Response", "envelope", "json_response", "tls_context"]

REFUSED = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
             b"Connection: close\r\n\r\n")  # fmt: skip


def json_response(status: int, body: Any) -> Response:
    return status, "application/json", (json.dumps(body, sort_keys=True) + "\n").encode()


def envelope(data: Any) -> Response:
    """The node exporter's REST envelope."""
    return json_response(200, {"code": 0, "data": data, "message": "success"})


def raise_open_files(needed: int) -> int:
    """Raise this process's open-file limit toward needed (up to the hard limit); the
    soft limit in force. Each connection is a descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return soft
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft < needed:
        log.warning("open files limited to %d (hard limit %s): fewer than the %d that "
                    "server.max_connections asks for", soft, hard, needed)  # fmt: skip
    else:
        log.info("open-file limit raised to %d for server.max_connections", soft)
    return soft


class Counters:
    def __init__(self) -> None:
        self.open = 0
        self.refused = 0
        self.cut = 0  # closed for sending no whole request head in time
        self.oversized = 0
        self.bodies_too_large = 0  # POST bodies over their route's bound (413)
        self.scrapes = 0
        self.renders = 0


class _Connection(RequestHandler):
    """aiohttp's protocol, counting what its keep-alive timer cuts (no whole request
    head within the timeout) and holding a connection's head bytes to a budget."""

    def __init__(self, manager: web.Server, counters: Counters, head_budget: int,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(manager, **kwargs)
        self.counters = counters
        self.head_budget = head_budget
        self.head_bytes = 0
        self.head_done = False  # the head's blank line came: what follows is its body
        self.tail = b""  # the head's last bytes (its end may span two reads)
        self.in_request = False

    def data_received(self, data: bytes) -> None:
        if not self.in_request and not self.head_done:  # bytes of a head not yet whole
            seen = self.tail + data
            end = seen.find(b"\r\n\r\n")
            if end >= 0:
                self.head_done = True  # a body after it is its route's to bound
                self.head_bytes += max(0, end + 4 - len(self.tail))
            else:
                self.head_bytes += len(data)
                self.tail = seen[-3:]
            transport = self.transport
            if self.head_bytes > self.head_budget and transport is not None:
                self.counters.oversized += 1
                transport.write(TOO_LARGE)
                self.force_close()
                transport.close()
                return
        super().data_received(data)

    def next_head(self) -> None:
        """A response went: the next bytes are the next request's head."""
        self.in_request, self.head_bytes, self.head_done, self.tail = False, 0, False, b""

    def _process_keepalive(self) -> None:
        open_before = not self._force_close
        super()._process_keepalive()
        if open_before and self._force_close:
            self.counters.cut += 1


class _Server(web.Server):
    """Makes _Connection protocols; refuses connections beyond the cap."""

    def __init__(self, handler: Any, counters: Counters, max_connections: int,
                 head_budget: int, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(handler, **kwargs)
        self.counters, self.max_connections = counters, max_connections
        self.head_budget = head_budget

    def __call__(self) -> RequestHandler:
        return _Connection(self, self.counters, self.head_budget, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.counters.open += 1
        if self.counters.open > self.max_connections:
            self.counters.refused += 1
            transport.write(REFUSED)
            handler.force_close()
            transport.close()

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self.counters.open -= 1
        super().connection_lost(handler, exc)


class HttpServer:
    """aiohttp on the given loop (or one of its own), serving the route tables mounted."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 max_connections: int = 10000, request_timeout: float = 10.0,
                 max_header_bytes: int = 65536,
                 loop: EventLoopThread | None = None,
                 tls: ssl.SSLContext | None = None) -> None:  # fmt: skip
        self.registry = registry
        self._routes = Routes()
        self.in_flight: dict[str, int] = {}  # POSTs in hand, by route
        self.busy: dict[str, int] = {}  # POSTs refused for too many at once (503), by route
        self.tls = tls
        self.counters = Counters()
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.max_header_bytes = max_header_bytes
        self._own_loop = loop is None
        self._loop = loop or EventLoopThread("http")
        self._rendering: asyncio.Future[bytes] | None = None
        self._server: asyncio.AbstractServer | None = None
        raise_open_files(max_connections + 256)
        # bound now: a port in use is the caller's error at once, before anything starts
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
            self._sock.listen(1024)
            self._sock.setblocking(False)
        except OSError:
            self._sock.close()
            if self._own_loop:
                self._loop.close()
            raise

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    @property
    def scrapes(self) -> int:
        return self.counters.scrapes

    @property
    def renders(self) -> int:
        return self.counters.renders

    def mount(self, prefix: str, surface: Surface, *tables: RouteTable) -> None:
        """Serve tables' routes under prefix, called and answered through surface."""
        self._routes.mount(prefix, surface, *tables)

    @staticmethod
    def _path(request: web.BaseRequest) -> str:
        return unquote(request.path.rstrip("/") or "/")

    @staticmethod
    def _request(request: web.BaseRequest, path: str, m: Mounted, params: dict[str, str],
                 body: bytes = b"") -> Request:  # fmt: skip
        transport = request.transport
        cert = transport.get_extra_info("peercert") if transport is not None else None
        return Request(path[len(m.prefix) :].lstrip("/"), params, dict(request.query),
                       {k.lower(): v for k, v in request.headers.items()}, body,
                       request.remote or "", bool(cert))  # fmt: skip

    async def _write(self, request: web.BaseRequest) -> Answer:
        """A POST, PUT, PATCH or DELETE: its body read within its route's bound, its
        handler called on a worker thread."""
        path, method = self._path(request), request.method
        found = self._routes.find(method, path)
        if found is None:
            return self._not_allowed(request, path, method)
        m, params = found
        prefix, most, at_once = "/".join(m.parts), m.surface.max_body(m.route), m.route.at_once
        length = request.content_length
        if length is not None and length > most:
            self.counters.bodies_too_large += 1
            return json_response(413, {"error": f"body of {length} bytes: over {most}"})
        if self.in_flight.get(prefix, 0) >= at_once:
            self.busy[prefix] = self.busy.get(prefix, 0) + 1
            return (*json_response(503, {"error": f"{at_once} requests in hand: retry"}),
                    {"Retry-After": "1", "Connection": "close"})  # fmt: skip
        self.in_flight[prefix] = self.in_flight.get(prefix, 0) + 1
        try:
            body = bytearray()
            async for chunk in request.content.iter_chunked(65536):
                body += chunk
                if len(body) > most:
                    self.counters.bodies_too_large += 1
                    return json_response(413, {"error": f"body over {most} bytes"})
            req = self._request(request, path, m, params, bytes(body))
            return await asyncio.get_running_loop().run_in_executor(None, m.surface.call,
                                                                    m.route, req)  # fmt: skip
        finally:
            self.in_flight[prefix] -= 1

    def _not_allowed(self, request: web.BaseRequest, path: str, method: str) -> Answer:
        """405 for a method no route of the path takes: in the envelope of the surface the
        path is under (its not_allowed()), else plain; Allow names the methods that are."""
        allowed = [m for m in ("GET", *WRITES) if self._routes.find(m, path) is not None]
        below = self._routes.below(path)
        if not allowed and below is not None:
            allowed = ["GET"]
        got: Answer | None = None
        if below is not None:
            prefix, surface = below
            got = surface.not_allowed(Request(path[len(prefix) :].lstrip("/"), {},
                                              dict(request.query)), method, allowed)  # fmt: skip
        if got is None:
            said = ", ".join(allowed) or "nothing"
            got = json_response(405, {"error": f"{method} not allowed here ({said} is)"})
        extra = got[3] if len(got) > 3 else {}
        return got[0], got[1], got[2], {**extra, "Allow": ", ".join(allowed)}

    def _get(self, request: web.BaseRequest) -> Answer | None:
        """The GET route's answer (a surface's for a path under its prefix that no route
        holds); None: no route."""
        path = self._path(request)
        found = self._routes.find("GET", path)
        if found is not None:
            m, params = found
            return m.surface.call(m.route, self._request(request, path, m, params))
        below = self._routes.below(path)
        if below is None:
            return None
        prefix, surface = below
        return surface.missing(Request(path[len(prefix) :].lstrip("/"), {},
                                       dict(request.query)))  # fmt: skip

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        conn = request.protocol
        if isinstance(conn, _Connection):
            conn.in_request = True
        try:
            extra: dict[str, str] = {}
            if request.method in WRITES:
                try:
                    got = await self._write(request)
                    status, ctype, body = got[0], got[1], got[2]
                    extra = got[3] if len(got) > 3 else {}
                except Exception as exc:  # a broken route must not take the server down
                    log.exception("%s %s failed", request.method, request.path)
                    status, ctype, body = json_response(500, {"error": str(exc)})
            elif request.method not in ("GET", "HEAD"):
                got = self._not_allowed(request, self._path(request), request.method)
                status, ctype, body = got[0], got[1], got[2]
                extra = got[3] if len(got) > 3 else {}
            elif (request.path.rstrip("/") or "/") == "/metrics":
                status, ctype, body = 200, CONTENT_TYPE, await self._metrics()
            else:
                try:
                    found = await asyncio.get_running_loop().run_in_executor(
                        None, self._get, request)  # fmt: skip
                    got = found or json_response(404, {"error": f"no route {request.path}"})
                    status, ctype, body = got[0], got[1], got[2]
                    extra = got[3] if len(got) > 3 else {}
                except Exception as exc:  # a broken route must not take the server down
                    log.exception("route %s failed", request.path)
                    status, ctype, body = json_response(500, {"error": str(exc)})
            headers = {"Content-Type": ctype, **extra}
            if status == 413:  # the rest of the body is not read: the connection cannot go on
                headers["Connection"] = "close"
            return web.Response(status=status, body=body, headers=headers)
        finally:
            if isinstance(conn, _Connection):
                conn.next_head()

    async def _metrics(self) -> bytes:
        """Render once for every scrape that arrives while a rendering runs."""
        self.counters.scrapes += 1
        if self._rendering is None:
            self._rendering = asyncio.get_running_loop().run_in_executor(None, self._render)
            self._rendering.add_done_callback(self._rendered)
        return await asyncio.shield(self._rendering)

    def _rendered(self, _: asyncio.Future[bytes]) -> None:
        self._rendering = None

    def _render(self) -> bytes:
        body = render([self.registry])
        self.counters.renders += 1
        return body

    async def _start(self) -> None:
        manager = _Server(
            self._handle, self.counters, self.max_connections, self.max_header_bytes,
            keepalive_timeout=self.request_timeout, max_line_size=self.max_header_bytes,
            max_field_size=self.max_header_bytes, access_log=None,
            # a body comes as sent: a route unpacks it within its own bound (aiohttp's
            # unpacking knows none: a small gzip'd body can unpack to gigabytes)
            auto_decompress=False,
            loop=asyncio.get_running_loop(),
        )  # fmt: skip
        self._server = await asyncio.get_running_loop().create_server(manager, sock=self._sock,
                                                                      ssl=self.tls)  # fmt: skip
        self._manager = manager

    def start(self) -> None:
        self._loop.call(self._start())

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._manager.pre_shutdown()
            await self._server.wait_closed()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._loop.call(self._stop(), timeout=10)
        self._sock.close()
        if self._own_loop:
            self._loop.close()

    def collector(self) -> Collector:
        return _HttpCollector(self.counters)


class _HttpCollector(Collector):
    def __init__(self, counters: Counters) -> None:
        self._c = counters

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        c = self._c
        yield GaugeMetricFamily("lens_agent_http_connections", "HTTP connections open",
                                value=c.open)  # fmt: skip
        yield CounterMetricFamily("lens_agent_http_connections_refused",
                                  "HTTP connections refused (server.max_connections open)",
                                  value=c.refused)  # fmt: skip
        yield CounterMetricFamily("lens_agent_http_connections_timed_out",
                                  "HTTP connections closed: no whole request head in time",
                                  value=c.cut)  # fmt: skip
        yield CounterMetricFamily("lens_agent_http_request_heads_too_large",
                                  "HTTP request heads refused (431): over server.max_header_bytes",
                                  value=c.oversized)  # fmt: skip
        yield CounterMetricFamily("lens_agent_http_request_bodies_too_large",
                                  "POST bodies refused (413): over their route's bound",
                                  value=c.bodies_too_large)  # fmt: skip
        yield CounterMetricFamily("lens_agent_metrics_scrapes", "/metrics requests",
                                  value=c.scrapes)  # fmt: skip
        yield CounterMetricFamily("lens_agent_metrics_renders",
                                  "/metrics renderings (concurrent scrapes share one)",
                                  value=c.renders)  # fmt: skip


def tls_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext | None:
    """A server's TLS when cert and key are set; clients must present a certificate the
    client CA signed when one is set (mutual TLS)."""
    if not cert:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    if client_ca:
        ctx.load_verify_locations(client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
