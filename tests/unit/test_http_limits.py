"""The HTTP front under abusive clients: idle and dripping connections cut, a connection
cap, bounded request heads, and concurrent scrapes sharing one rendering."""

import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from lens_ebpf.api.http import HttpServer
from tests.conftest import hang_guard, wait_for


class Slow:
    """A collector that takes a while, as a big cache does: until its gate opens."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()

    def describe(self):
        return iter(())

    def collect(self):
        self.calls += 1
        assert self.gate.wait(hang_guard(10)), "hang guard: the gate never opened"
        yield GaugeMetricFamily("lens_test_value", "A value", value=1)


def serve(**kw) -> tuple[HttpServer, Slow]:
    reg = CollectorRegistry(auto_describe=False)
    slow = Slow()
    reg.register(slow)
    http = HttpServer("127.0.0.1", 0, reg, **kw)
    reg.register(http.collector())
    http.start()
    return http, slow


@pytest.fixture
def http() -> Iterator[HttpServer]:
    h, _ = serve(max_connections=600, request_timeout=2.0)
    yield h
    h.stop()


def get(port: int, path: str = "/metrics") -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=hang_guard(10)) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def closed(s: socket.socket, timeout: float) -> bool:
    """True when the server closed the connection within timeout."""
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_500_idle_connections_are_cut_and_scrapes_go_on(http: HttpServer) -> None:
    idle = [socket.create_connection(("127.0.0.1", http.port)) for _ in range(500)]
    try:
        wait_for(lambda: http._server.open == 500, "500 open connections")
        assert get(http.port)[0] == 200  # served beside them
        assert all(closed(s, hang_guard(5)) for s in idle)  # after request_timeout
        assert http._server.cut >= 500
    finally:
        for s in idle:
            s.close()


def test_a_dripping_request_head_is_cut(http: HttpServer) -> None:
    s = socket.create_connection(("127.0.0.1", http.port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")

    def cut() -> bool:  # a byte every 0.2 s keeps each recv under the timeout
        try:
            s.sendall(b"a")
        except OSError:
            return True
        return closed(s, 0.2)

    try:  # the head never completes: cut once request_timeout (2 s) has passed
        wait_for(cut, "the dripping connection cut", every=0)
    finally:
        s.close()


def test_oversized_request_heads_are_refused(http: HttpServer) -> None:
    s = socket.create_connection(("127.0.0.1", http.port))
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(80)) + b"\r\n"  # fmt: skip
    s.sendall(head)  # 80 KB of headers: each line is short, the head is not
    s.settimeout(hang_guard(5))
    assert s.recv(64).startswith(b"HTTP/1.1 431")
    s.close()


def test_connections_beyond_the_cap_get_503() -> None:
    http, _ = serve(max_connections=5, request_timeout=30)
    held = [socket.create_connection(("127.0.0.1", http.port)) for _ in range(5)]
    try:
        wait_for(lambda: http._server.open == 5, "5 open connections")
        assert get(http.port)[0] == 503
        assert http._server.refused == 1
        held.pop().close()
        wait_for(lambda: http._server.open < 5, "a connection closed")
        assert get(http.port)[0] == 200
    finally:
        for s in held:
            s.close()
        http.stop()


def test_concurrent_scrapes_share_one_rendering() -> None:
    http, slow = serve()
    try:
        got: list[bytes] = []
        threads = [threading.Thread(target=lambda: got.append(get(http.port)[1]))
                   for _ in range(10)]  # fmt: skip
        slow.gate.clear()
        threads[0].start()
        wait_for(lambda: slow.calls == 1, "the first scrape rendering")
        for t in threads[1:]:
            t.start()
        wait_for(lambda: http.scrapes == 10, "ten scrapes waiting")
        slow.gate.set()
        for t in threads:
            t.join(hang_guard(10))
        assert len(got) == 10 and all(b"lens_test_value 1.0" in body for body in got)
        assert http.scrapes == 10 and http.renders == slow.calls == 1
    finally:
        http.stop()
