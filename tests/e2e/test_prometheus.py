"""The agent scraped by a real Prometheus, and its exposition checked by promtool."""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agentproc import AgentProc
from tests.conftest import wait_for
from tests.containerlab import Containerd, private_containerd
from tests.netlab import exchange, listener, recv_exact
from tests.promserver import Prometheus, available, promtool_check_metrics
from tests.tracelab import Trace

pytestmark = pytest.mark.e2e

# docs/reference/metric-conventions.md keeps these counter names without _total; promtool's
# lint says so
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


@contextlib.contextmanager
def traffic(addr: str) -> Iterator[None]:
    """Ping-pong on one connection while the block runs, so RTT samples arrive between
    scrapes however slowly they come."""
    srv = listener(addr)
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            cli.sendall(b"p")
            recv_exact(conn, 1)
            conn.sendall(b"q")
            recv_exact(cli, 1)
            time.sleep(0.02)

    t = threading.Thread(target=run)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        cli.close()
        conn.close()
        srv.close()


def test_promtool_accepts_the_exposition_but_for_seed_names(agent: AgentProc) -> None:
    if reason := available():
        pytest.skip(reason)
    srv = listener("127.0.5.9")  # a k8sPod flow feeds a seed counter
    with traffic("127.0.0.83"):
        exchange(srv, "127.0.5.9", 10, 10)
        srv.close()

        def both() -> str | None:  # once the agent's read cycle has them
            t = agent.metrics_text()
            wanted = (
                "primus_lens_network_tcp_flow_rtt_bucket",
                "primus_lens_network_k8s_tcp_flow{",
            )
            return t if all(w in t for w in wanted) else None

        text = wait_for(both, "the RTT and k8s flow series")
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
        with traffic("127.0.0.84"):  # until Prometheus has two scrapes of it
            up = prom.wait_value('up{job="lens-ebpf"}', lambda r: r and r[0]["value"][1] == "1")
            assert up and up[0]["value"][1] == "1"
            expr = (
                "histogram_quantile(0.5, sum by (le) "
                '(rate(primus_lens_network_tcp_flow_rtt_bucket{raddr="127.0.0.84"}[1m])))'
            )
            result = prom.wait_value(expr, lambda r: r and math.isfinite(float(r[0]["value"][1])))
            value = float(result[0]["value"][1])
            assert math.isfinite(value) and 0 < value <= 10000  # microseconds, loopback
            lens = "histogram_quantile(0.9, sum by (le) (rate(lens_tcp_rtt_seconds_bucket[1m])))"
            got = prom.wait_value(lens, lambda r: r and math.isfinite(float(r[0]["value"][1])))
            assert 0 < float(got[0]["value"][1]) < 10
    finally:
        prom.stop()


def test_every_rule_and_dashboard_expression_is_valid_promql() -> None:
    if reason := available():
        pytest.skip(reason)
    from tests.unit.test_deploy import expressions

    prom = Prometheus([])
    try:
        for expr in expressions():
            prom.query(expr)  # asserts status success
    finally:
        prom.stop()


@pytest.fixture
def ctd() -> Iterator[Containerd]:
    yield from private_containerd("p")


def test_prometheus_sees_the_flows_rtt_and_execs_the_test_caused(
    tmp_path: Path, ctd: Containerd
) -> None:
    if reason := available():
        pytest.skip(reason)
    policy = tmp_path / "policy.yaml"
    policy.write_text("localhost: [127.0.0.0/8]\n")
    cfg = tmp_path / "lens.yaml"
    cfg.write_text(f"containers:\n  containerd_state: {ctd.state}\n")
    agent = AgentProc("--policy", str(policy), "--config", str(cfg))
    prom = None
    try:
        agent.wait_ready()
        prom = Prometheus([f"127.0.0.1:{agent.port}"])
        srv = listener("127.0.0.98")
        port, _ = exchange(srv, "127.0.0.98", 3000, 4000)
        srv.close()
        with traffic("127.0.0.99"):  # RTT samples across scrapes, until the quantile answers
            cid = "prom" + uuid.uuid4().hex[:8]
            # An independent observer: runc's own init may re-exec itself inside the new
            # cgroup (a race with its parent moving it there); that exec is real too.
            observer = Trace("exec", "--json", "--config", str(cfg), "--pod", "p-0")
            res = ctd.run(
                cid,
                "/bin/sh",
                "-c",
                "/bin/echo hi",
                labels={
                    "io.kubernetes.pod.name": "p-0",
                    "io.kubernetes.pod.namespace": "team-p",
                    "io.kubernetes.container.name": "c",
                },
            )
            assert res.returncode == 0, res.stderr
            # sh execs echo in place: the last exec of the container
            observer.until(
                lambda ev: any(e.get("filename") == "/bin/echo" for e in ev), "/bin/echo's exec"
            )
            seen, _ = observer.finish()

            def value(expr: str, want: float) -> float:
                got = prom.wait_value(expr, lambda r: r and float(r[0]["value"][1]) == want)
                return float(got[0]["value"][1])

            egress = (
                f'primus_lens_network_tcp_flow_egress{{raddr="127.0.0.98",rport="{port}",'
                'direction="egress",type="localhost"}'
            )
            assert value(egress, 7000) == 7000
            opened = (
                f'lens_tcp_connections_opened_total{{raddr="127.0.0.98",port="{port}",'
                'direction="egress"}'
            )
            assert value(opened, 1) == 1
            execs = 'lens_container_process_execs_total{namespace="team-p",pod="p-0",container="c"}'
            files = [e["filename"] for e in seen if e["kind"] == "process_exec"]
            ours = [f for f in files if f in ("/bin/sh", "/bin/echo")]
            assert ours == ["/bin/sh", "/bin/echo"]
            assert all(
                "runc" in f or f.startswith(("/proc/self/", "/memfd:"))
                for f in files
                if f not in ours
            ), files
            assert value(execs, len(files)) == len(files)
            q = (
                "histogram_quantile(0.9, sum by (le) "
                "(rate(primus_lens_network_tcp_flow_rtt_bucket[1m])))"
            )
            got = prom.wait_value(q, lambda r: r and math.isfinite(float(r[0]["value"][1])))
            assert 0 < float(got[0]["value"][1]) <= 10000
    finally:
        if prom is not None:
            prom.stop()
        assert agent.stop() == 0
