"""The HTTP front (aiohttp) under abusive clients: thousands of idle connections held
while scrapes answer, idle and dripping heads cut after the request timeout, a connection
cap, bounded request heads, and concurrent scrapes sharing one rendering."""

import http.client
import resource
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from lens_ebpf.core.http import HttpServer
from tests.agentproc import parse_samples
from tests.conftest import hang_guard, wait_for

IDLE = 5000


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
def short() -> Iterator[HttpServer]:
    """request_timeout 1 s: what idles or drips longer is cut."""
    h, _ = serve(max_connections=600, request_timeout=1.0)
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


def sample(body: bytes, name: str) -> float:
    return next(v for n, _, v in parse_samples(body.decode()) if n == name)


def test_5000_idle_connections_and_a_slowloris_while_a_scrape_answers() -> None:
    need = 2 * IDLE + 512  # both ends live in this process
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"needs {need} open files; the hard limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    # a timeout long enough that nothing is cut while the test holds them
    http, _ = serve(max_connections=IDLE + 100, request_timeout=hang_guard(30))
    idle = [socket.create_connection(("127.0.0.1", http.port)) for _ in range(IDLE)]
    drip = socket.create_connection(("127.0.0.1", http.port))
    try:
        drip.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        wait_for(lambda: http.counters.open == IDLE + 1, f"{IDLE + 1} connections open")
        status, body = get(http.port)
        assert status == 200
        # every connection counted: the idle ones, the dripping one, the scrape's own
        assert sample(body, "lens_agent_http_connections") == IDLE + 2
        assert sample(body, "lens_agent_http_connections_refused_total") == 0
        assert sample(body, "lens_agent_http_connections_timed_out_total") == 0
    finally:
        for s in (*idle, drip):
            s.close()
        http.stop()


def test_idle_and_dripping_connections_are_cut_after_the_request_timeout(
    short: HttpServer,
) -> None:
    idle = [socket.create_connection(("127.0.0.1", short.port)) for _ in range(50)]
    drip = socket.create_connection(("127.0.0.1", short.port))
    drip.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")

    def cut() -> bool:  # a byte every 0.2 s: the head grows, yet never completes
        try:
            drip.sendall(b"a")
        except OSError:
            return True
        return closed(drip, 0.2)

    try:
        wait_for(cut, "the dripping connection cut", every=0)
        assert all(closed(s, hang_guard(5)) for s in idle)
        assert get(short.port)[0] == 200  # served beside them
        wait_for(lambda: short.counters.cut == 51, "51 connections counted as cut")
    finally:
        for s in (*idle, drip):
            s.close()


@pytest.fixture
def roomy() -> Iterator[HttpServer]:
    """A timeout no slow machine reaches while a test talks to it."""
    h, _ = serve(request_timeout=hang_guard(30))
    yield h
    h.stop()


def test_a_keep_alive_connection_serves_request_after_request(roomy: HttpServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", roomy.port, timeout=hang_guard(5))
    try:
        for _ in range(3):  # each response starts the head's deadline again
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            assert resp.status == 200 and b"lens_test_value 1.0" in resp.read()
    finally:
        conn.close()
    assert roomy.counters.scrapes == 3


def test_oversized_request_heads_are_refused(roomy: HttpServer) -> None:
    s = socket.create_connection(("127.0.0.1", roomy.port))
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(80)) + b"\r\n"  # fmt: skip
    s.sendall(head)  # 80 KB of headers: each line is short, the head is not
    s.settimeout(hang_guard(5))
    assert s.recv(64).startswith(b"HTTP/1.1 431")
    s.close()
    assert roomy.counters.oversized == 1


def test_connections_beyond_the_cap_get_503() -> None:
    http, _ = serve(max_connections=5, request_timeout=hang_guard(30))
    held = [socket.create_connection(("127.0.0.1", http.port)) for _ in range(5)]
    try:
        wait_for(lambda: http.counters.open == 5, "5 open connections")
        assert get(http.port)[0] == 503
        assert http.counters.refused == 1
        held.pop().close()
        wait_for(lambda: http.counters.open < 5, "a connection closed")
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


def test_unknown_paths_and_methods() -> None:
    http, _ = serve()
    try:
        assert get(http.port, "/nope")[0] == 404
        req = urllib.request.Request(f"http://127.0.0.1:{http.port}/metrics", data=b"x")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=hang_guard(5))
        assert err.value.code == 405
    finally:
        http.stop()
