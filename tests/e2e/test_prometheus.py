"""The agent scraped by a real Prometheus, and its exposition checked by promtool."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agentproc import AgentProc
from tests.netlab import exchange, listener, recv_exact
from tests.promserver import Prometheus, available, promtool_check_metrics

pytestmark = pytest.mark.e2e

# shared/METRICS.md keeps these counter names without _total; promtool's lint says so
SEED_COUNTERS = {
    "primus_lens_network_tcp_flow_egress",
    "primus_lens_network_tcp_flow_ingress",
    "primus_lens_network_k8s_tcp_flow",
    "primus_lens_network_flow_dns",
    "hw_node_uptime_seconds",
}


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProc]:
    policy = tmp_path / "policy.yaml"
    policy.write_text("localhost: [127.0.0.0/8]\nk8sPod: [127.0.5.0/24]\n")
    a = AgentProc("--policy", str(policy))
    a.wait_ready()
    yield a
    assert a.stop() == 0


def traffic(addr: str, seconds: float) -> None:
    """Ping-pong on one connection, so RTT samples arrive between scrapes."""
    srv = listener(addr)
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        cli.sendall(b"p")
        recv_exact(conn, 1)
        conn.sendall(b"q")
        recv_exact(cli, 1)
        time.sleep(0.02)
    cli.close()
    conn.close()
    srv.close()


def test_promtool_accepts_the_exposition_but_for_seed_names(agent: AgentProc) -> None:
    if reason := available():
        pytest.skip(reason)
    traffic("127.0.0.83", 0.5)
    srv = listener("127.0.5.9")  # a k8sPod flow feeds a seed counter
    exchange(srv, "127.0.5.9", 10, 10)
    srv.close()
    time.sleep(1)
    text = agent.metrics_text()
    assert "primus_lens_network_tcp_flow_rtt_bucket" in text
    assert "primus_lens_network_k8s_tcp_flow{" in text
    rc, problems = promtool_check_metrics(text)
    lint = 'counter metrics should have "_total" suffix'
    unexpected = [p for p in problems if not (lint in p and p.split()[0] in SEED_COUNTERS)]
    assert unexpected == [], problems
    if not problems:
        assert rc == 0


def test_real_prometheus_answers_rtt_quantiles(agent: AgentProc) -> None:
    if reason := available():
        pytest.skip(reason)
    prom = Prometheus([f"127.0.0.1:{agent.port}"])
    try:
        t = threading.Thread(target=traffic, args=("127.0.0.84", 8.0))
        t.start()
        up = prom.wait_value('up{job="lens-ebpf"}', lambda r: r and r[0]["value"][1] == "1")
        assert up and up[0]["value"][1] == "1"
        expr = (
            "histogram_quantile(0.5, sum by (le) "
            '(rate(primus_lens_network_tcp_flow_rtt_bucket{raddr="127.0.0.84"}[1m])))'
        )
        result = prom.wait_value(expr, lambda r: r and math.isfinite(float(r[0]["value"][1])))
        t.join()
        assert result, "no result"
        value = float(result[0]["value"][1])
        assert math.isfinite(value) and 0 < value <= 10000  # microseconds, loopback
        lens = "histogram_quantile(0.9, sum by (le) (rate(lens_tcp_rtt_seconds_bucket[1m])))"
        got = prom.wait_value(lens, lambda r: r and math.isfinite(float(r[0]["value"][1])))
        assert got and 0 < float(got[0]["value"][1]) < 10
    finally:
        prom.stop()
