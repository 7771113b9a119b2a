"""A million distinct flows on loopback: /metrics stays bounded, every connection counted.

The kernel's maps overflow into each (direction, class)'s "other" slot, the cache's
budget of exposition lines holds, and the counts stay exact. The storm's remotes are a
class of their own (docker), so nothing else on the host reaches its "other" slot.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.agentproc import AgentProc, parse_samples
from tests.conftest import EMULATED, flow_flood, hang_guard, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
POLICY = "docker: [127.77.0.0/16, 127.78.0.0/16]\nlocalhost: [127.0.0.0/8]\n"
ADDRS, PORT_LO, PORT_HI = 16, 1000, 63499  # 16 x 62,500 = 1,000,000 (address, port) pairs
CONNECTIONS = 20_000  # completed, each from a remote of its own: bytes and RTT samples


def rss_kb(pid: int, field: str) -> int:
    m = re.search(rf"^{field}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert m, field
    return int(m.group(1))


def storm_total(text: str, name: str) -> float:
    want = (name, "docker", "egress")
    return sum(
        v
        for n, labels, v in parse_samples(text)
        if (n, labels.get("type"), labels.get("direction")) == want
    )


@pytest.mark.skipif(EMULATED, reason="a million connects take minutes under emulation")
def test_million_flow_storm_keeps_metrics_bounded_and_counts_exact(tmp_path: Path) -> None:
    gen = tmp_path / "stormgen"
    subprocess.run(
        ["gcc", "-O2", "-pthread", "-o", str(gen), str(ROOT / "tests" / "stormgen.c")], check=True
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    with flow_flood(exclusive=True):  # no other test's flows counted meanwhile
        storm(gen, policy)


def storm(gen: Path, policy: Path) -> None:
    """The agent, the million refused connects and the accepted ones, counted."""
    agent = AgentProc("--policy", str(policy), "--no-collector.processes")
    try:
        agent.wait_ready()
        before = rss_kb(agent.proc.pid, "VmRSS")
        out = subprocess.run(
            [str(gen), "refused", "127.77.0", str(ADDRS), str(PORT_LO), str(PORT_HI)],
            capture_output=True,
            text=True,
            check=True,
            timeout=hang_guard(600),
        ).stdout
        refused, connected = (int(x) for x in re.findall(r"=(\d+)", out))
        assert refused + connected == ADDRS * (PORT_HI - PORT_LO + 1) == 1_000_000
        out = subprocess.run(
            [str(gen), "accept", "127.78.0", str(CONNECTIONS)],
            capture_output=True,
            text=True,
            check=True,
            timeout=hang_guard(600),
        ).stdout
        assert out.strip() == f"connections={CONNECTIONS}"
        # every attempt counted: per remote while the kernel map had room, the rest in
        # the (egress, docker) "other" slot
        texts: list[str] = []

        def counted() -> tuple[float, float]:
            texts[:] = [agent.metrics_text()]
            return (
                storm_total(texts[0], "lens_tcp_failed_connects_total"),
                storm_total(texts[0], "lens_tcp_connections_opened_total"),
            )

        want = (refused, connected + CONNECTIONS)
        wait_for(lambda: counted() == want, lambda: f"{want} counted (now {counted()})", 60, 1)
        text = texts[0]
        samples = parse_samples(text)
        other = [
            v
            for n, labels, v in samples
            if n == "lens_tcp_failed_connects_total"
            and labels.get("type") == "docker"
            and labels.get("raddr") == "other"
        ]
        assert other and other[0] > 0  # the kernel map overflowed, and said so
        full = {
            labels.get("map"): v for n, labels, v in samples if n == "lens_agent_bpf_map_full_total"
        }
        assert full.get("flows", 0) > 0 and full.get("rtt", 0) > 0
        # bounded: the exposition within its budget and well under 5 MB
        lines = sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))
        assert len(text.encode()) <= 5_000_000, (len(text), lines)
        cached = agent.sample("lens_agent_cache_samples")
        assert cached is not None and cached <= 48_000
        peak = rss_kb(agent.proc.pid, "VmHWM")
        assert peak <= 300 * 1024, f"peak RSS {peak // 1024} MB (from {before // 1024} MB)"
        print(
            f"storm: /metrics {len(text.encode())} bytes, {lines} lines; RSS "
            f"{before // 1024} -> peak {peak // 1024} MB"
        )
    finally:
        agent.stop()
