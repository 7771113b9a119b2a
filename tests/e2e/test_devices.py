"""Device collectors through the running agent: this machine's numbers, REST routes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.agentproc import AgentProc
from tests.conftest import wait_for

pytestmark = pytest.mark.e2e
FIX = Path(__file__).parent.parent / "fixtures"


def test_system_metrics_match_this_machine_and_react_to_load(tmp_path: Path) -> None:
    env = {"LENS_COLLECTORS__SYSTEM__INTERVAL_SECONDS": "1", "NODE_NAME": "lens-test-node"}
    agent = AgentProc("--no-collector.tcp", env=env)
    busy: list[subprocess.Popen] = []
    try:
        agent.wait_ready()
        node = {"node": "lens-test-node"}
        meminfo = dict(
            line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines()
        )
        mem_total = int(meminfo["MemTotal"].split()[0]) * 1024
        assert agent.sample("hw_memory_total_bytes", node) == mem_total
        nproc = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
        assert agent.sample("hw_cpu_threads", node) == nproc
        score = wait_for(lambda: agent.sample("node_health_score"), "a health score")
        assert 0 <= score <= 10
        # one busy loop per CPU, under a name of its own: whatever else the machine runs,
        # its CPUs are then busy, and the score (10 * (1 - 0.4 cpu - 0.4 mem - 0.2 PSI))
        # at most 10 * (1 - 0.4 * 0.8)
        name = tmp_path / "lens-busy"
        name.symlink_to("/bin/sh")
        busy = [subprocess.Popen([str(name), "-c", "while :; do :; done"]) for _ in range(nproc)]
        wait_for(lambda: (agent.sample("node_cpu_utilization_ratio") or 0) > 0.8, "busy CPUs")
        loaded = agent.sample("node_health_score")
        assert loaded is not None and loaded <= 6.8, loaded

        def top() -> set[str]:
            return {
                s[1]["pid"]
                for s in parse(agent.metrics_text())
                if s[0] == "cpu_process_cpu_seconds_total" and s[1]["name"] == "lens-busy"
            }

        want = {str(p.pid) for p in busy}
        assert wait_for(lambda: top() == want, lambda: f"busy loops {want} on top ({top()})")
        status, body = agent.json("/node")
        assert status == 200 and body["code"] == 0 and body["message"] == "success"
        assert body["data"]["node_name"] == "lens-test-node"
        assert body["data"]["cpu_threads"] == nproc
        status, sysjson = agent.json("/metrics/json")
        assert status == 200 and sysjson["memory"]["total_bytes"] == mem_total
        assert "lens-busy" in {p["name"] for p in sysjson["top_processes"]}
    finally:
        for p in busy:
            p.kill()
            p.wait()
        assert agent.stop() == 0


def parse(text: str):
    from tests.agentproc import parse_samples

    return parse_samples(text)


def test_rdma_rest_and_metrics_from_a_fixture_sysfs() -> None:
    env = {
        "LENS_DEVICES__SYSFS_ROOT": str(FIX / "rdma" / "sys"),
        "LENS_COLLECTORS__RDMA__TOOL": "lens-no-such-rdma-tool",
    }
    agent = AgentProc("--no-collector.tcp", env=env)
    try:
        agent.wait_ready()
        status, body = agent.json("/rdma")
        assert status == 200 and body["code"] == 0
        rows = {r["if_name"]: r for r in body["data"]}
        assert sorted(rows) == ["iwp1s0f0", "mlx4_0", "mlx5_0", "mlx5_1", "rocep8s0f0"]
        assert rows["rocep8s0f0"]["link_layer"] == "Ethernet"
        mlx = {"device": "mlx5_0", "port": "1"}
        assert agent.sample("lens_rdma_port_transmit_bytes_total", mlx) == 1234567 * 4
        assert agent.sample("lens_rdma_port_up", {"device": "mlx5_1", "port": "1"}) == 0
        assert agent.sample("lens_agent_collector_success", {"collector": "rdma"}) == 1
    finally:
        assert agent.stop() == 0


def test_cpu_only_node_without_rdma_exports_no_rdma_series() -> None:
    agent = AgentProc("--no-collector.tcp")
    try:
        agent.wait_ready()
        text = agent.metrics_text()
        assert "lens_rdma_" not in text and "rdma_stat_" not in text
        assert agent.sample("lens_agent_collector_success", {"collector": "rdma"}) == 1
        assert (
            agent.sample(
                "lens_agent_collector_errors_total", {"collector": "rdma", "reason": "parse"}
            )
            is None
        )
        status, body = agent.json("/rdma")
        assert status == 200 and body["data"] == []
    finally:
        assert agent.stop() == 0
