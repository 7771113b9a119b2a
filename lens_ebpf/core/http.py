"""HTTP front on aiohttp: /metrics, and the route tables (core/routes.py) mounted on it.

One asyncio loop (core/loop.py, shared with the gRPC servers) holds every connection, so
an idle or slow client costs a coroutine, not a thread. Bounded against abusive clients:
beyond `max_connections` open at once a new connection gets 503 and is closed (counted);
a request head must arrive whole within `request_timeout` of connecting or of the
previous response (aiohttp's keep-alive timer, counted when it cuts); request heads are
capped at `max_header_bytes` (431 beyond); clients that hang up are not tracebacks; and
scrapes that arrive while /metrics renders share that rendering. Routes come only
through mount(): their surface calls them on a worker thread, so a slow one never holds
the loop; probe routes (health) on threads of their own, so they never queue behind
slow work. A write (POST, PUT, PATCH, DELETE) is judged on its head before a byte of its
body is read (its surface's admit(): credentials, Content-Type), then its body read
within its route's bound (413 beyond), within `body_timeout` (408), while fewer than
`max_writes` are in hand and their bodies fit `max_body_bytes_in_hand` (503 beyond: one
budget for the whole service, whatever prefix a route is served under); each counted.
With a certificate the server speaks TLS (mutual TLS with a client CA).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any
from urllib.parse import unquote

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.core.exposition import CONTENT_TYPE, counter, gauge, render
from lens_ebpf.core.http_connections import Connection, Counters, Server, raise_open_files
from lens_ebpf.core.loop import EventLoopThread
from lens_ebpf.core.routes import (
    WRITES,
    Answer,
    Mounted,
    Request,
    Response,
    Route,
    Routes,
    RouteTable,
    Surface,
)
from lens_ebpf.core.settings import ServerConfig

log = logging.getLogger(__name__)

__all__ = ["Answer", "HttpServer", "Response", "envelope", "json_response", "tls_context"]


def json_response(status: int, body: Any) -> Response:
    return status, "application/json", (json.dumps(body, sort_keys=True) + "\n").encode()


def envelope(data: Any) -> Response:
    """The node exporter's REST envelope."""
    return json_response(200, {"code": 0, "data": data, "message": "success"})


class HttpServer:
    """aiohttp on the given loop (or one of its own), serving the route tables mounted."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        max_connections: int = 10000,
        request_timeout: float = 10.0,
        max_header_bytes: int = 65536,
        loop: EventLoopThread | None = None,
        tls: ssl.SSLContext | None = None,
        *,
        backlog: int = 4096,
        body_timeout: float = 30.0,
        max_writes: int = 64,
        max_body_bytes_in_hand: int = 64 << 20,
    ) -> None:
        self.registry = registry
        self._routes = Routes()
        self.tls = tls
        self.counters = Counters()
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.max_header_bytes = max_header_bytes
        self.backlog = backlog
        self.body_timeout = body_timeout
        self.max_writes = max_writes
        self.max_body_bytes_in_hand = max_body_bytes_in_hand
        self._own_loop = loop is None
        self._loop = loop or EventLoopThread("http")
        # health apart from request work: a pool every slow handler may fill is not theirs
        self._probes = ThreadPoolExecutor(2, thread_name_prefix="http-probe")
        self._rendering: asyncio.Future[bytes] | None = None
        self._server: asyncio.AbstractServer | None = None
        raise_open_files(max_connections + 256)
        # bound now: a port in use is the caller's error at once, before anything starts
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
            self._sock.listen(backlog)  # the kernel caps it at net.core.somaxconn
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
    def _request(
        request: web.BaseRequest, path: str, m: Mounted, params: dict[str, str], body: bytes = b""
    ) -> Request:
        transport = request.transport
        cert = transport.get_extra_info("peercert") if transport is not None else None
        subject = ""
        if cert:
            names = dict(pair for rdn in cert.get("subject", ()) for pair in rdn)
            subject = str(names.get("commonName", ""))
        return Request(
            path[len(m.prefix) :].lstrip("/"),
            params,
            dict(request.query),
            {k.lower(): v for k, v in request.headers.items()},
            body,
            request.remote or "",
            bool(cert),
            subject,
        )

    async def _write(self, request: web.BaseRequest) -> Answer:
        """A POST, PUT, PATCH or DELETE: judged on its head (its surface's admit), its
        body read within its route's bound, the body timeout and the service's budget of
        writes and bytes in hand, its handler called on a worker thread."""
        path, method = self._path(request), request.method
        found = self._routes.find(method, path)
        if found is None:
            return self._not_allowed(request, path, method)
        m, params = found
        route, surface, c = m.route, m.surface, self.counters
        head = self._request(request, path, m, params)
        refused = surface.admit(route, head)  # before a byte of the body is read
        if refused is not None:
            return refused
        most, length = surface.max_body(route), request.content_length
        if length is not None and length > most:
            c.bodies_too_large += 1
            return surface.refuse(route, 413, f"body of {length} bytes: over {most}")
        if c.writes >= self.max_writes:
            c.busy += 1
            return self._retry(
                surface.refuse(route, 503, f"{self.max_writes} writes in " "hand: retry")
            )
        c.writes += 1
        held = [0]  # body bytes this request holds of the service's budget
        try:
            try:
                async with asyncio.timeout(self.body_timeout):
                    body = await self._body(request, route, surface, most, held)
            except TimeoutError:
                c.bodies_timed_out += 1
                return surface.refuse(
                    route, 408, "the body was not whole within " f"{self.body_timeout:g} s"
                )
            except ConnectionError:  # the client hung up mid-body: this answer goes nowhere
                c.bodies_abandoned += 1
                log.debug("%s %s: the client hung up before its body was whole", method, path)
                return surface.refuse(route, 400, "the client hung up mid-body")
            if not isinstance(body, bytes):
                return body
            req = replace(head, body=body)
            del body
            return await asyncio.get_running_loop().run_in_executor(None, surface.call, route, req)
        finally:
            c.writes -= 1
            c.body_bytes -= held[0]

    async def _body(
        self, request: web.BaseRequest, route: Route, surface: Surface, most: int, held: list[int]
    ) -> bytes | Answer:
        """The body whole, or the answer refusing it (413 over most; 503 where the
        service's bodies in hand would pass max_body_bytes_in_hand). What Content-Length
        says is taken from the budget before a byte is read, a chunked body's bytes as
        they come; held says how many were taken."""

        def busy() -> Answer:
            return self._retry(
                surface.refuse(
                    route, 503, "as many body bytes in hand as " "the service holds: retry"
                )
            )

        length = request.content_length or 0
        if length and not self._take(length, held):
            return busy()
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_chunked(65536):
            size += len(chunk)
            if size > most:
                self.counters.bodies_too_large += 1
                return surface.refuse(route, 413, f"body over {most} bytes")
            if size > held[0] and not self._take(size - held[0], held):
                return busy()
            chunks.append(chunk)
        return b"".join(chunks)

    def _take(self, n: int, held: list[int]) -> bool:
        """n more body bytes from the service's budget (one body alone is always taken,
        whatever its size within its route's bound); False, counted, where they do not
        fit."""
        c = self.counters
        if c.body_bytes and c.body_bytes + n > self.max_body_bytes_in_hand:
            c.busy += 1
            return False
        c.body_bytes += n
        held[0] += n
        return True

    @staticmethod
    def _retry(got: Answer) -> Answer:
        """A 503 that says when to come back."""
        extra = got[3] if len(got) > 3 else {}
        return got[0], got[1], got[2], {**extra, "Retry-After": "1"}

    def _not_allowed(self, request: web.BaseRequest, path: str, method: str) -> Answer:
        """405 for a method no route of the path takes: in the envelope of the surface the
        path is under (its not_allowed()), else plain; Allow names the methods that are."""
        allowed = [m for m in ("GET", *WRITES) if self._routes.find(m, path) is not None]
        below = self._routes.below(path)
        if not allowed and below is not None:
            allowed = ["GET"]
        below = below or self._routes.owner(path)  # a route at the root: its surface's
        got: Answer | None = None
        if below is not None:
            prefix, surface = below
            got = surface.not_allowed(
                Request(path[len(prefix) :].lstrip("/"), {}, dict(request.query)), method, allowed
            )
        if got is None:
            said = ", ".join(allowed) or "nothing"
            got = json_response(405, {"error": f"{method} not allowed here ({said} is)"})
        extra = got[3] if len(got) > 3 else {}
        return got[0], got[1], got[2], {**extra, "Allow": ", ".join(allowed)}

    def _get(
        self, request: web.BaseRequest, path: str, found: tuple[Mounted, dict[str, str]] | None
    ) -> Answer | None:
        """The GET route's answer (a surface's for a path under its prefix that no route
        holds, 405 for one only other methods' routes hold); None: no route."""
        if found is not None:
            m, params = found
            return m.surface.call(m.route, self._request(request, path, m, params))
        if self._routes.owner(path) is not None:  # a path some other method's route takes
            return self._not_allowed(request, path, request.method)
        below = self._routes.below(path)
        if below is None:
            return None
        prefix, surface = below
        return surface.missing(Request(path[len(prefix) :].lstrip("/"), {}, dict(request.query)))

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        conn = request.protocol
        if isinstance(conn, Connection):
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
                    path = self._path(request)
                    found = self._routes.find("GET", path)
                    pool = self._probes if found is not None and found[0].route.probe else None
                    answered: Answer | None = await asyncio.get_running_loop().run_in_executor(
                        pool, self._get, request, path, found
                    )
                    got = answered or json_response(404, {"error": f"no route {request.path}"})
                    status, ctype, body = got[0], got[1], got[2]
                    extra = got[3] if len(got) > 3 else {}
                except Exception as exc:  # a broken route must not take the server down
                    log.exception("route %s failed", request.path)
                    status, ctype, body = json_response(500, {"error": str(exc)})
            resp = web.Response(status=status, body=body, headers={"Content-Type": ctype, **extra})
            if not request.content.is_eof() or extra.get("Connection") == "close":
                resp.force_close()  # a body not read: the connection cannot go on
            return resp
        finally:
            # the rest of an unread body is not the next request's head (the connection
            # closes once aiohttp has drained what comes within its lingering time)
            if isinstance(conn, Connection) and request.content.is_eof():
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
        manager = Server(
            self._handle,
            self.counters,
            self.max_connections,
            self.max_header_bytes,
            keepalive_timeout=self.request_timeout,
            max_line_size=self.max_header_bytes,
            max_field_size=self.max_header_bytes,
            access_log=None,
            # a body comes as sent: a route unpacks it within its own bound (aiohttp's
            # unpacking knows none: a small gzip'd body can unpack to gigabytes)
            auto_decompress=False,
            loop=asyncio.get_running_loop(),
        )
        # asyncio listens again on a given socket, with its own backlog (100) unless told
        self._server = await asyncio.get_running_loop().create_server(
            manager, sock=self._sock, ssl=self.tls, backlog=self.backlog
        )
        self._manager = manager

    def start(self) -> None:
        self._loop.call(self._start())

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._manager.pre_shutdown()
            await self._manager.shutdown(1.0)  # what still lingers on a connection ends
            await self._server.wait_closed()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._loop.call(self._stop(), timeout=10)
        self._sock.close()
        self._probes.shutdown(wait=False)
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
        yield gauge("lens_agent_http_connections", "HTTP connections open", c.open)
        yield counter(
            "lens_agent_http_connections_refused",
            "HTTP connections refused (server.max_connections open)",
            c.refused,
        )
        yield counter(
            "lens_agent_http_connections_timed_out",
            "HTTP connections closed: no whole request head in time",
            c.cut,
        )
        yield counter(
            "lens_agent_http_request_heads_too_large",
            "HTTP request heads refused (431): over server.max_header_bytes",
            c.oversized,
        )
        yield counter(
            "lens_agent_http_request_bodies_too_large",
            "POST bodies refused (413): over their route's bound",
            c.bodies_too_large,
        )
        yield counter(
            "lens_agent_http_request_bodies_timed_out",
            "Request bodies not whole within server.body_timeout_seconds " "(408)",
            c.bodies_timed_out,
        )
        yield counter(
            "lens_agent_http_request_bodies_abandoned",
            "Requests whose client hung up before its body was whole",
            c.bodies_abandoned,
        )
        yield counter(
            "lens_agent_http_writes_busy",
            "Writes refused (503): server.max_writes_in_hand in hand, or "
            "server.max_body_bytes_in_hand held",
            c.busy,
        )
        yield gauge(
            "lens_agent_http_writes_in_hand",
            "Writes whose body is being read or handled now",
            c.writes,
        )
        yield gauge(
            "lens_agent_http_request_body_bytes_in_hand",
            "Request body bytes held now (being read or handled)",
            c.body_bytes,
        )
        yield counter("lens_agent_metrics_scrapes", "/metrics requests", c.scrapes)
        yield counter(
            "lens_agent_metrics_renders",
            "/metrics renderings (concurrent scrapes share one)",
            c.renders,
        )


def front(srv: ServerConfig) -> dict[str, Any]:
    """HttpServer's bounds on writes and its listen backlog, from a service's server:."""
    return {
        "backlog": srv.listen_backlog,
        "body_timeout": srv.body_timeout_seconds,
        "max_writes": srv.max_writes_in_hand,
        "max_body_bytes_in_hand": srv.max_body_bytes_in_hand,
    }


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
