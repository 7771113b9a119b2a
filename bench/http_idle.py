"""Scrape latency of the HTTP front with 0 and N idle connections held (goal < 100 ms at
5,000), and how long the server takes to cut them after request_timeout.

.venv/bin/python -m bench.http_idle [N]
"""

from __future__ import annotations

import resource
import socket
import statistics
import sys
import time
import urllib.request

from prometheus_client import CollectorRegistry

from lens_ebpf.core.http import HttpServer

# request_timeout_seconds: long enough that all N are held while they are being opened
# (the default is 10 s)
TIMEOUT = 60.0


def scrape_ms(port: int, times: int = 50) -> tuple[float, float]:
    ms = []
    for _ in range(times):
        t = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            r.read()
        ms.append((time.perf_counter() - t) * 1000)
    return statistics.median(ms), max(ms)


def main(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * n + 512  # both ends in this process
    if hard != resource.RLIM_INFINITY and hard < need:
        raise SystemExit(f"needs {need} open files; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    reg = CollectorRegistry(auto_describe=False)
    http = HttpServer("127.0.0.1", 0, reg, max_connections=n + 50, request_timeout=TIMEOUT)
    reg.register(http.collector())
    http.start()
    try:
        med, worst = scrape_ms(http.port)
        print(f"/metrics with 0 idle connections: median {med:.1f} ms, max {worst:.1f} ms")
        t0 = time.monotonic()
        idle = [socket.create_connection(("127.0.0.1", http.port)) for _ in range(n)]
        while http.counters.open < n:
            time.sleep(0.01)
        med, worst = scrape_ms(http.port)
        print(
            f"/metrics with {n} idle connections held: median {med:.1f} ms, "
            f"max {worst:.1f} ms (goal < 100 ms)"
        )
        for s in idle:
            s.settimeout(3 * TIMEOUT)
            s.recv(1)
        print(
            f"all {n} closed by the server {time.monotonic() - t0:.1f} s after they opened "
            f"(request_timeout {TIMEOUT:g} s); counted as cut: {http.counters.cut}"
        )
        for s in idle:
            s.close()
    finally:
        http.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
