"""HTTP front: /metrics, health and readiness, and JSON routes other modules add."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry

from lens_ebpf.metrics.exposition import CONTENT_TYPE, render

log = logging.getLogger(__name__)

Response = tuple[int, str, bytes]
Route = Callable[[], Response]


def json_response(status: int, body: Any) -> Response:
    return status, "application/json", (json.dumps(body, sort_keys=True) + "\n").encode()


def envelope(data: Any) -> Response:
    """The node exporter's REST envelope."""
    return json_response(200, {"code": 0, "data": data, "message": "success"})


class HttpServer:
    """A threaded HTTP server with a fixed route table."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.routes: dict[str, Route] = {"/metrics": self._metrics}
        routes = self.routes

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = urlsplit(self.path).path.rstrip("/") or "/"
                route = routes.get(path)
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

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def add(self, path: str, route: Route) -> None:
        self.routes[path] = route

    def _metrics(self) -> Response:
        return 200, CONTENT_TYPE, render([self.registry])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:  # shutdown() waits for a serve loop that never ran
            self._server.shutdown()
        self._server.server_close()
