"""Scrape latency with N idle HTTP connections held, and when they are closed.

.venv/bin/python -m bench.http_idle [N]
"""

from __future__ import annotations

import socket
import statistics
import sys
import time
import urllib.request

from prometheus_client import CollectorRegistry

from lens_ebpf.api.http import HttpServer


def main(n: int) -> None:
    reg = CollectorRegistry(auto_describe=False)
    http = HttpServer("127.0.0.1", 0, reg, max_connections=n + 50, request_timeout=10)
    reg.register(http.collector())
    http.start()
    try:
        t0 = time.monotonic()
        idle = [socket.create_connection(("127.0.0.1", http.port)) for _ in range(n)]
        while http._server.open < n:
            time.sleep(0.01)
        ms = []
        for _ in range(20):
            t = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{http.port}/metrics", timeout=5) as r:
                r.read()
            ms.append((time.perf_counter() - t) * 1000)
        print(
            f"/metrics with {n} idle connections held: median {statistics.median(ms):.1f} ms, "
            f"max {max(ms):.1f} ms"
        )
        for s in idle:
            s.settimeout(30)
            s.recv(1)
        print(
            f"all {n} closed by the server {time.monotonic() - t0:.1f} s after they opened "
            f"(request_timeout 10 s); cut: {http._server.cut}"
        )
    finally:
        http.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500)
