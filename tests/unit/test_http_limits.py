"""The HTTP front (aiohttp) under abusive clients: thousands of idle connections held
while scrapes answer, idle and dripping heads cut after the request timeout, a connection
cap, bounded request heads, and concurrent scrapes sharing one rendering; writes judged on
their head before their body is read, one budget of writes and body bytes for the whole
service, bodies in time, clients that hang up mid-body, the listen backlog, and probes
answered while every worker waits."""

import http.client
import logging
import resource
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from lens_ebpf.core.http import HttpServer
from lens_ebpf.core.routes import Answer, Request, Route, RouteTable, Surface, Whole
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
    head = (
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(80))
        + b"\r\n"
    )
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
        threads = [
            threading.Thread(target=lambda: got.append(get(http.port)[1])) for _ in range(10)
        ]
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


# -- writes: judged on their head, one budget for the service, bodies in time ----------
class Guarded(Surface):
    """A write needs `Authorization: Bearer t`, judged on its head; handlers wait on gate
    (a slow database), their answer the body's length."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.heads: list[bytes] = []  # what admit() saw of each body: nothing yet

    def admit(self, route: Route, head: Request) -> Answer | None:
        self.heads.append(head.body)
        if head.headers.get("authorization") != "Bearer t":
            return self.refuse(route, 401, "no token")
        return super().admit(route, head)

    def call(self, route: Route, req: Request) -> Answer:
        assert self.gate.wait(hang_guard(10)), "hang guard: the gate never opened"
        return 200, "text/plain", str(len(req.body)).encode()


def guarded(**kw) -> tuple[HttpServer, Guarded]:
    table, surface = RouteTable(), Guarded()

    @table.post("logs", max_body=16 << 20)
    def logs() -> None: ...

    http = HttpServer("127.0.0.1", 0, CollectorRegistry(auto_describe=False), **kw)
    for prefix in ("", "/v1", "/api"):
        http.mount(prefix, surface, table)
    http.start()
    return http, surface


def head(path: str, length: int, token: bool = True, ctype: str = "application/json") -> bytes:
    auth = b"Authorization: Bearer t\r\n" if token else b""
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
        path.encode(),
        ctype.encode(),
        length,
        auth,
    )


def answer(s: socket.socket, timeout: float = 5) -> bytes:
    """The status line of what the server answered on s."""
    s.settimeout(hang_guard(timeout))
    got = b""
    while b"\r\n" not in got:
        more = s.recv(4096)
        if not more:
            break
        got += more
    return got.split(b"\r\n", 1)[0]


def post(port: int, path: str, body: bytes, token: bool = True) -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=body,
        headers={
            "Content-Type": "application/json",
            **({"Authorization": "Bearer t"} if token else {}),
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=hang_guard(10)) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_a_write_without_credentials_is_refused_on_its_head() -> None:
    """15 MiB announced, one byte sent, no token: 401 at once, nothing of it read."""
    http, surface = guarded(request_timeout=hang_guard(30))
    socks = [socket.create_connection(("127.0.0.1", http.port)) for _ in range(3)]
    try:
        for s, path in zip(socks, ("/logs", "/v1/logs", "/api/logs"), strict=True):
            s.sendall(head(path, 15 << 20, token=False) + b"[")
            assert answer(s) == b"HTTP/1.1 401 Unauthorized"
        assert surface.heads == [b"", b"", b""]
        assert http.counters.writes == 0 and http.counters.body_bytes == 0
        assert post(http.port, "/logs", b"[1]") == (200, b"3")  # with its token: taken
    finally:
        for s in socks:
            s.close()
        http.stop()


def test_writes_in_hand_are_one_budget_for_the_service_not_one_per_prefix() -> None:
    http, surface = guarded(max_writes=3)
    surface.gate.clear()
    got: list[tuple[int, bytes]] = []
    threads = [
        threading.Thread(target=lambda p=p: got.append(post(http.port, p, b"[]")))
        for p in ("/logs", "/v1/logs", "/api/logs")
    ]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: http.counters.writes == 3, "three writes in hand")
        for path in ("/logs", "/v1/logs", "/api/logs"):  # whichever prefix: the same budget
            status, _ = post(http.port, path, b"[]")
            assert status == 503
        assert http.counters.busy == 3
        surface.gate.set()
        for t in threads:
            t.join(hang_guard(10))
        assert got == [(200, b"2")] * 3 and http.counters.writes == 0
    finally:
        surface.gate.set()
        http.stop()


def test_bodies_in_hand_are_bounded_in_bytes() -> None:
    http, surface = guarded(max_body_bytes_in_hand=1 << 20)
    surface.gate.clear()
    held: list[tuple[int, bytes]] = []
    first = threading.Thread(target=lambda: held.append(post(http.port, "/logs", b" " * 700_000)))
    try:
        first.start()
        wait_for(lambda: http.counters.body_bytes == 700_000, "700 kB in hand")
        s = socket.create_connection(("127.0.0.1", http.port))
        s.sendall(head("/v1/logs", 700_000))  # its Content-Length does not fit beside it
        assert answer(s) == b"HTTP/1.1 503 Service Unavailable"
        s.close()
        assert http.counters.busy == 1
        surface.gate.set()
        first.join(hang_guard(10))
        assert held == [(200, b"700000")]
        # alone, a body over the budget (within its route's bound) is taken
        assert post(http.port, "/logs", b" " * (3 << 20)) == (200, str(3 << 20).encode())
        assert http.counters.body_bytes == 0
    finally:
        surface.gate.set()
        http.stop()


def test_a_body_not_whole_in_time_gets_408() -> None:
    http, _ = guarded(body_timeout=0.5, request_timeout=hang_guard(30))
    s = socket.create_connection(("127.0.0.1", http.port))
    try:
        s.sendall(head("/logs", 1000) + b"[")  # and nothing more
        assert answer(s) == b"HTTP/1.1 408 Request Timeout"
        assert http.counters.bodies_timed_out == 1
        wait_for(lambda: http.counters.writes == 0, "no write in hand")
        assert http.counters.body_bytes == 0
        assert post(http.port, "/logs", b"[1]") == (200, b"3")
    finally:
        s.close()
        http.stop()


def test_a_client_gone_mid_body_is_counted_not_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    http, _ = guarded(request_timeout=hang_guard(30))
    try:
        with caplog.at_level(logging.DEBUG):
            s = socket.create_connection(("127.0.0.1", http.port))
            s.sendall(head("/logs", 1000) + b"[1,")
            wait_for(lambda: http.counters.body_bytes == 1000, "the body being read")
            s.close()
            wait_for(lambda: http.counters.bodies_abandoned == 1, "the hang-up counted")
            assert post(http.port, "/logs", b"[1]") == (200, b"3")
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        assert "hung up before its body was whole" in caplog.text
    finally:
        http.stop()


def test_the_listen_backlog_is_the_one_asked_for() -> None:
    """asyncio listens again with its own 100 unless told: the kernel's queue of
    connections not yet taken (TCP_INFO's tcpi_sacked on a listener) says which held."""
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    for backlog in (1000, 4096):
        http = HttpServer("127.0.0.1", 0, CollectorRegistry(auto_describe=False), backlog=backlog)
        http.start()
        try:
            info = http._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
            assert struct.unpack_from("I", info, 28)[0] == min(backlog, somaxconn)
        finally:
            http.stop()


def test_probes_answer_while_every_worker_waits() -> None:
    """Slow GETs fill the worker pool (asyncio's default: at most 32 threads); a probe
    route is answered on threads of its own, at once."""
    gate = threading.Event()
    table = RouteTable()

    @table.get("slow")
    def slow() -> Answer:
        gate.wait(hang_guard(20))
        return 200, "text/plain", b"slow"

    @table.get("readyz", probe=True)
    def readyz() -> Answer:
        return 200, "text/plain", b"ready"

    http = HttpServer("127.0.0.1", 0, CollectorRegistry(auto_describe=False))
    http.mount("", Whole(), table)
    http.start()
    waiting = [threading.Thread(target=get, args=(http.port, "/slow")) for _ in range(40)]
    try:
        for t in waiting:
            t.start()
        time.sleep(0.5)
        for _ in range(5):
            start = time.monotonic()
            assert get(http.port, "/readyz") == (200, b"ready")
            assert time.monotonic() - start < 0.5
    finally:
        gate.set()
        for t in waiting:
            t.join(hang_guard(20))
        http.stop()
