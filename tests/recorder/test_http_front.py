"""The recorder's HTTP front under an attacker on the cluster network (issue 69): a write
judged on its head before its body is read, one budget of writes and body bytes for the
whole service, its memory under the deploy's limit while tokenless and authorised
clients abuse it; health answered while requests wait on a Prometheus and a webhook that
accept and never answer; cross-site and DNS-rebinding writes refused without
credentials; who made a change as the credentials say; the front's counters exported."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from tests.conftest import hang_guard, wait_for
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.test_faults import metric
from tests.recorder.test_reading import BIN, socket_pair

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
DEPLOY_LIMIT = 1 << 30  # deploy/recorder's memory limit (1Gi)


class Silent:
    """A TCP listener that accepts every connection and never answers (a Prometheus or a
    webhook that hangs); the connections are held until stop()."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def stop(self) -> None:
        self.sock.close()
        for s in self.held:
            s.close()


def head(port: int, path: str, length: int, headers: dict[str, str]) -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {length}\r\n"
        f"{lines}\r\n"
    ).encode()


def status_of(s: socket.socket, timeout: float = 5) -> int:
    """The status the server answered on s (0: none before it closed)."""
    s.settimeout(hang_guard(timeout))
    got = b""
    while b"\r\n" not in got:
        more = s.recv(4096)
        if not more:
            return 0
        got += more
    return int(got.split(b" ", 2)[1])


def test_tokenless_drips_hold_nothing_from_authorised_posts(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    """64 tokenless POST /logs sending one byte each (and 32 more over /v1 and /api):
    each 401 at once, on its head; an authorised POST /logs is taken beside them."""
    (tmp_path / "token").write_text(TOKEN + "\n")
    app = recorder_app(f"sqlite:///{tmp_path / 'r.db'}", ingest__token_file=str(tmp_path / "token"))
    port = app.http.port
    paths = ["/logs"] * 64 + ["/v1/logs"] * 16 + ["/api/logs"] * 16
    drips = [socket.create_connection(("127.0.0.1", port)) for _ in paths]
    try:
        for s, path in zip(drips, paths, strict=True):
            s.sendall(head(port, path, 15 << 20, {"Content-Type": "application/json"}) + b"[")
        assert [status_of(s) for s in drips] == [401] * len(paths)
        r = requests.post(
            f"http://127.0.0.1:{port}/logs", data=b"[]", headers=AUTH, timeout=hang_guard(10)
        )
        assert r.status_code == 200, r.text
        for route, n in (("/logs", 64), ("/v1/logs", 0)):  # one route, whatever its prefix
            assert metric(app, f'lens_recorder_post_unauthorized_total{{route="{route}"}}') == (
                n + 32 if n else None
            )
        assert metric(app, "lens_recorder_http_writes_in_hand") == 0
        assert metric(app, "lens_recorder_http_request_body_bytes_in_hand") == 0
        assert metric(app, "lens_recorder_http_connections") >= len(paths)  # type: ignore[operator]
    finally:
        for s in drips:
            s.close()


def test_a_client_gone_mid_body_and_a_body_too_slow(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path, caplog: Any
) -> None:
    app = recorder_app(
        f"sqlite:///{tmp_path / 'r.db'}", top={("server", "body_timeout_seconds"): 1}
    )
    port = app.http.port
    with caplog.at_level(logging.DEBUG):
        gone = socket.create_connection(("127.0.0.1", port))
        gone.sendall(head(port, "/logs", 1000, {"Content-Type": "application/json"}) + b"[")
        eventually(lambda: app.http.counters.writes == 1, timeout=10)
        gone.close()
        eventually(lambda: app.http.counters.bodies_abandoned == 1, timeout=10)
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(head(port, "/v1/logs", 1000, {"Content-Type": "application/json"}) + b"[")
        assert status_of(slow) == 408
        slow.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert metric(app, "lens_recorder_http_request_bodies_abandoned_total") == 1
    assert metric(app, "lens_recorder_http_request_bodies_timed_out_total") == 1
    assert metric(app, 'lens_recorder_post_requests_total{route="/logs",code="408"}') == 1


@contextmanager
def recorder_process(api: FakeApiServer, tmp_path: Path) -> Iterator[tuple[int, int]]:
    """`lens-ebpf recorder` as deployed (a token for the POST routes), its port and pid."""
    (tmp_path / "token").write_text(TOKEN + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LENS_")}
    env.update(
        KUBECONFIG=str(api.kubeconfig(tmp_path / "kubeconfig")),
        LENS_RECORDER__INGEST__TOKEN_FILE=str(tmp_path / "token"),
    )
    with socket_pair() as (port, collect):
        proc = subprocess.Popen(
            [
                str(BIN / "lens-ebpf"),
                "recorder",
                "--database",
                f"sqlite:///{tmp_path / 'r.db'}",
                "--listen",
                f"127.0.0.1:{port}",
                "--collect-listen",
                f"127.0.0.1:{collect}",
            ],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:

        def ready() -> bool:
            try:
                return (
                    requests.get(
                        f"http://127.0.0.1:{port}/readyz", timeout=hang_guard(1)
                    ).status_code
                    == 200
                )
            except requests.ConnectionError:
                return False

        eventually(ready, timeout=30)
        yield port, proc.pid
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=hang_guard(30))
        assert "Traceback" not in err, err


def kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) << 10
    raise AssertionError(field)


def send(port: int, path: str, body_size: int, headers: dict[str, str]) -> int:
    """A POST of body_size bytes (a JSON array of blanks), sent whole unless the server
    hangs up first; its status (0: none)."""
    s = socket.create_connection(("127.0.0.1", port))
    with contextlib.suppress(OSError):  # the server may answer and close before the end
        s.sendall(head(port, path, body_size, headers) + b"[" + b" " * (body_size - 2) + b"]")
    try:
        return status_of(s, 60)
    except OSError:
        return 0
    finally:
        s.close()


def test_abuse_holds_the_recorders_memory_under_the_deploys_limit(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """96 tokenless 15 MiB bodies over /logs, /v1/logs and /api/logs at once took the
    recorder from 138 to 1,583 MB; now each is refused on its head, and 24 authorised
    ones at once take what the service's budget of bodies in hand (64 MiB) lets them."""
    big = 15 << 20
    with recorder_process(api, tmp_path) as (port, pid):
        before = kib(pid, "VmRSS")
        peak = [before]
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.05):
                peak.append(kib(pid, "VmRSS"))

        watcher = threading.Thread(target=watch)
        watcher.start()
        got: dict[str, list[int]] = {"tokenless": [], "authorised": []}

        def abuse(kind: str, path: str, headers: dict[str, str]) -> None:
            got[kind].append(send(port, path, big, headers))

        threads = [
            threading.Thread(
                target=abuse, args=("tokenless", p, {"Content-Type": "application/json"})
            )
            for p in ("/logs", "/v1/logs", "/api/logs")
            for _ in range(32)
        ]
        threads += [
            threading.Thread(target=abuse, args=("authorised", p, AUTH))
            for p in ("/logs", "/v1/logs", "/api/logs")
            for _ in range(8)
        ]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(hang_guard(120))
        finally:
            done.set()
            watcher.join()
        high = kib(pid, "VmHWM")
        after = kib(pid, "VmRSS")
        print(
            f"recorder RSS: {before >> 20} MiB before, {max(peak) >> 20} MiB at most "
            f"(VmHWM {high >> 20} MiB), {after >> 20} MiB after"
        )
        assert set(got["tokenless"]) <= {401, 0} and got["tokenless"].count(401) >= 90
        # taken, or 503 where the bodies in hand would pass the budget (the sender retries)
        assert set(got["authorised"]) <= {200, 503} and 200 in got["authorised"]
        assert high < DEPLOY_LIMIT
        assert high - before < 400 << 20, (before, high)
        # and it serves on
        r = requests.post(
            f"http://127.0.0.1:{port}/logs", data=b"[]", headers=AUTH, timeout=hang_guard(10)
        )
        assert r.status_code == 200, r.text


def timed(url: str) -> tuple[int, float]:
    start = time.monotonic()
    r = requests.get(url, timeout=hang_guard(30))
    return r.status_code, time.monotonic() - start


def test_health_answers_while_requests_wait_on_silent_peers(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    """24 requests waiting on a Prometheus that accepts and never answers, then 24 channel
    tests to such a webhook: /readyz and /healthz answer while every one of them still
    waits (they took 9 and 14 s, queued behind them); each slow request ends at its 5 s
    deadline. How fast they answer is printed, a figure for bench, not a bound here."""
    prom = Silent()
    hook = Silent()
    try:
        app = recorder_app(
            f"sqlite:///{tmp_path / 'r.db'}",
            prometheus__url=prom.url,
            prometheus__timeout_seconds=5,
        )
        base = f"http://127.0.0.1:{app.http.port}"
        channel = requests.post(
            f"{base}/v1/notification-channels",
            json={
                "name": "silent",
                "type": "webhook",
                "enabled": True,
                "config": {"url": hook.url, "timeout": 5},
            },
            timeout=hang_guard(10),
        )
        assert channel.status_code == 200, channel.text
        cid = channel.json()["data"]["id"]
        worst: dict[str, float] = {}
        for what, peer, ask in (
            (
                "prometheus",
                prom,
                lambda: requests.get(f"{base}/v1/nodes/gpuUtilization", timeout=hang_guard(60)),
            ),
            (
                "webhook",
                hook,
                lambda: requests.post(
                    f"{base}/v1/notification-channels/{cid}/test", timeout=hang_guard(60)
                ),
            ),
        ):
            answers: list[requests.Response] = []
            slow = [
                threading.Thread(target=lambda ask=ask, got=answers: got.append(ask()))
                for _ in range(24)
            ]
            for t in slow:
                t.start()
            wait_for(lambda peer=peer: len(peer.held) >= 4, f"requests waiting on {what}")
            times = []
            for _ in range(6):
                for path in ("/readyz", "/healthz"):
                    status, took = timed(base + path)
                    assert status == 200
                    # the first answer came while all 24 waited (queued, it came after
                    # the first of them, at their 5 s deadline)
                    assert times or not answers, f"{path} answered after the slow ones"
                    times.append(took)
                time.sleep(0.2)
            worst[what] = max(times)
            for t in slow:
                t.join(hang_guard(120))
            assert len(answers) == 24
            if what == "prometheus":  # without its figures, saying why: the route answers
                assert all(
                    r.status_code == 200 and "prometheus" in r.json()["meta"]["message"]
                    for r in answers
                ), answers[0].text
            else:
                assert all(
                    r.json()["data"]["success"] is False
                    and "timed out" in r.json()["data"]["message"]
                    for r in answers
                ), answers[0].text
        print(f"/readyz and /healthz at most: {worst}")
    finally:
        prom.stop()
        hook.stop()


def write(
    port: int, path: str, body: bytes, headers: dict[str, str], host: str | None = None
) -> requests.Response:
    """A POST as a browser's page would send it: Host and Origin as given."""
    return requests.post(
        f"http://127.0.0.1:{port}{path}",
        data=body,
        timeout=hang_guard(10),
        headers={"Host": host or f"127.0.0.1:{port}", **headers},
    )


def test_cross_site_and_rebinding_writes_are_refused_without_credentials(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    """On loopback without a token (writes taken anonymously): a text/plain POST with a
    foreign Origin and Host created a channel, and a form-encoded silence alertname=~.*
    silenced everything. Each of those is refused on its head now, counted."""
    app = recorder_app(f"sqlite:///{tmp_path / 'r.db'}")
    port, mine = app.http.port, f"http://127.0.0.1:{app.http.port}"
    channel = json.dumps({"name": "evil", "type": "webhook", "config": {"url": "http://x/"}})
    plain = {"Content-Type": "text/plain"}
    cases = [  # (path, body, headers, Host, status, meta.code, what the message says)
        (
            "/v1/notification-channels",
            channel,
            {**plain, "Origin": "http://evil.example"},
            "evil.example:80",
            403,
            4003,
            "Host 'evil.example:80' is not this service's",
        ),
        (
            "/v1/notification-channels",
            channel,
            {**plain, "Origin": "http://evil.example"},
            None,
            403,
            4003,
            "Origin 'http://evil.example' is not this service's",
        ),
        (
            "/v1/notification-channels",
            channel,
            {"Content-Type": "application/json", "Origin": "null"},
            None,
            403,
            4003,
            "Origin 'null'",
        ),
        (
            "/v1/notification-channels",
            channel,
            plain,
            None,
            415,
            4015,
            "Content-Type text/plain: this route takes application/json",
        ),
        (
            "/v1/alert-silences",
            "matchers=alertname%3D~.*",
            {"Content-Type": "application/x-www-form-urlencoded", "Origin": mine},
            None,
            415,
            4015,
            "Content-Type application/x-www-form-urlencoded",
        ),
        (
            "/v1/alert-silences",
            json.dumps({"matchers": [{"name": "alertname", "value": ".*", "isRegex": True}]}),
            {"Content-Type": "application/json"},
            "rebound.example:" + str(port),
            403,
            4003,
            "is not this service's",
        ),
        (
            "/logs",
            "[]",
            {**plain, "Origin": "http://evil.example"},
            None,
            403,
            4003,
            "Origin 'http://evil.example'",
        ),
        (
            "/alerts/webhook",
            '{"alert_name": "x"}',
            plain,
            None,
            415,
            4015,
            "this route takes application/json",
        ),
    ]
    for path, body, headers, host, status, code, says in cases:
        r = write(port, path, body.encode(), headers, host)
        meta = r.json()["meta"]
        assert (r.status_code, meta["code"]) == (status, code), (path, headers, r.text)
        assert says in meta["message"], (says, meta)
    listed = requests.get(f"{mine}/v1/notification-channels", timeout=hang_guard(5)).json()
    assert listed["data"]["total"] == 0 if isinstance(listed["data"], dict) else not listed["data"]
    silences = requests.get(f"{mine}/v1/alert-silences", timeout=hang_guard(5)).json()["data"]
    assert (silences.get("total", 0) if isinstance(silences, dict) else len(silences)) == 0
    for labels, n in (
        ('route="/notification-channels",code="403"', 3),
        ('route="/notification-channels",code="415"', 1),
        ('route="/alert-silences",code="415"', 1),
        ('route="/alert-silences",code="403"', 1),
    ):
        assert metric(app, f"lens_recorder_api_writes_refused_total{{{labels}}}") == n, labels
    assert metric(app, 'lens_recorder_post_cross_site_total{route="/logs"}') == 1
    # the service's own page (its Origin), and a client that is no browser: taken
    r = write(
        port,
        "/v1/notification-channels",
        channel.encode(),
        {"Content-Type": "application/json; charset=utf-8", "Origin": mine},
    )
    assert r.status_code == 200, r.text
    assert r.json()["data"]["created_by"] == "anonymous"


def test_a_proxys_user_is_believed_only_from_the_proxys_credentials(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    """X-Forwarded-User from any client was recorded as a change's author; now only with
    recorder.api.forwarded_user_from's credentials, else who the credentials say."""
    (tmp_path / "api").write_text(TOKEN + "\n")
    app = recorder_app(f"sqlite:///{tmp_path / 'r.db'}", api__token_file=str(tmp_path / "api"))
    base = f"http://127.0.0.1:{app.http.port}/v1/notification-channels"

    def author(name: str, **kw: Any) -> str:
        r = requests.post(
            base,
            json={"name": name, "type": "webhook", "config": {"url": "http://x/"}},
            timeout=hang_guard(10),
            **kw,
        )
        assert r.status_code == 200, r.text
        return str(r.json()["data"]["created_by"])

    said = {"Authorization": f"Bearer {TOKEN}", "X-Forwarded-User": "mallory"}
    assert author("one", headers=said) == "token"
    app.stop()
    proxied = recorder_app(
        f"sqlite:///{tmp_path / 'r.db'}",
        api__token_file=str(tmp_path / "api"),
        api__forwarded_user_from="token",
    )
    base = f"http://127.0.0.1:{proxied.http.port}/v1/notification-channels"
    assert author("two", headers={**said, "X-Forwarded-User": "alice"}) == "alice"
    assert author("three", headers={"Authorization": f"Bearer {TOKEN}"}) == "token"
