"""The HTTP front's connections (lens_ebpf/core/http.py): aiohttp's server and protocol
with their bounds. Beyond max_connections open at once a new connection gets 503 and is
closed; a request head over its byte budget gets 431; a connection aiohttp's keep-alive
timer cuts (no whole request head in time) is counted. Each connection is a descriptor:
the open-file limit is raised for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger(__name__)

REFUSED = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


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
        log.warning(
            "open files limited to %d (hard limit %s): fewer than the %d that "
            "server.max_connections asks for",
            soft,
            hard,
            needed,
        )
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
        self.bodies_timed_out = 0  # bodies not whole within the body timeout (408)
        self.bodies_abandoned = 0  # clients that hung up before their body was whole
        self.busy = 0  # writes refused (503): too many in hand, or their bodies' bytes
        self.writes = 0  # writes in hand now (body being read, or handler running)
        self.body_bytes = 0  # their bodies' bytes held now
        self.scrapes = 0
        self.renders = 0


class Connection(RequestHandler):
    """aiohttp's protocol, counting what its keep-alive timer cuts (no whole request
    head within the timeout) and holding a connection's head bytes to a budget."""

    def __init__(
        self, manager: web.Server, counters: Counters, head_budget: int, **kwargs: Any
    ) -> None:
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


class Server(web.Server):
    """Makes _Connection protocols; refuses connections beyond the cap."""

    def __init__(
        self,
        handler: Any,
        counters: Counters,
        max_connections: int,
        head_budget: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self.counters, self.max_connections = counters, max_connections
        self.head_budget = head_budget

    def __call__(self) -> RequestHandler:
        return Connection(self, self.counters, self.head_budget, loop=self._loop, **self._kwargs)

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
