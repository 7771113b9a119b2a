"""RTT histograms binned in the kernel, checked against the kernel's own srtt (ss -ti)."""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Iterator

import pytest

from lens_ebpf.agent import config
from lens_ebpf.agent.bpf.loader import BpfLoader
from lens_ebpf.agent.events import EventBus
from lens_ebpf.agent.metrics.cache import MetricCache
from lens_ebpf.agent.net.identity import NO_IDENTITY
from lens_ebpf.agent.net.policy import parse_policy
from lens_ebpf.agent.tcp.tcp_flows import TcpFlows
from lens_ebpf.agent.tcp.tcp_rtt import LENS, RTT_BOUNDS_US, SEED, SEED_BOUNDS_US
from tests.netlab import in_netns, listener, recv_exact

from .conftest import FlowRig

pytestmark = pytest.mark.bpf


def ping_pong(cli: socket.socket, conn: socket.socket, n: int) -> None:
    for _ in range(n):
        cli.sendall(b"p")
        recv_exact(conn, 1)
        conn.sendall(b"q")
        recv_exact(cli, 1)


def ss_info(dst: str, dport: int, ns: str | None = None) -> dict[str, float]:
    cmd = ["ss", "-tinH", "dst", dst, "dport", f"= :{dport}"]
    if ns:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    m = re.search(r"\brtt:([\d.]+)/", out)
    segs = re.search(r"\bsegs_in:(\d+)", out)
    assert m and segs, out
    return {"rtt_us": float(m.group(1)) * 1000, "segs_in": int(segs.group(1))}


def bucket_of(value_us: float, bounds: tuple[float, ...]) -> int:
    return next((i for i, b in enumerate(bounds) if value_us <= b), len(bounds))


def near(value_us: float, bounds: tuple[float, ...]) -> set[int]:
    """The bucket of value_us and its neighbours."""
    b = bucket_of(value_us, bounds)
    return {max(b - 1, 0), b, min(b + 1, len(bounds))}


@pytest.mark.parametrize(("where", "addr", "cls"), [
    ("loopback", "127.0.0.81", "localhost"),
    ("veth", "192.168.77.2", "internalHosts"),
])  # fmt: skip
def test_rtt_histogram_matches_the_kernels_srtt(
    rig: FlowRig, lab, where: str, addr: str, cls: str
) -> None:
    srv = listener(addr, ns=lab.ns if where == "veth" else None)
    port = srv.getsockname()[1]
    rig.flows.read()  # the series may hold earlier tests' flows: measure the increase
    lens0 = rig.cache.get(LENS, ("egress", cls, addr, *NO_IDENTITY)) or (
        [0] * (len(RTT_BOUNDS_US) + 1),
        0.0,
    )
    seed0 = rig.cache.get(SEED, (addr, "egress")) or ([0] * (len(SEED_BOUNDS_US) + 1), 0.0)
    cli = socket.create_connection((addr, port))
    conn, _ = srv.accept()
    try:
        ping_pong(cli, conn, 50)
        rig.flows.read()
        ss = ss_info(addr, port)
        lens = rig.cache.get(LENS, ("egress", cls, addr, *NO_IDENTITY))
        seed = rig.cache.get(SEED, (addr, "egress"))
        bins = [a - b for a, b in zip(lens[0], lens0[0], strict=True)]
        sum_s = lens[1] - lens0[1]
        seed_bins = [a - b for a, b in zip(seed[0], seed0[0], strict=True)]
        count = sum(bins)
        # every segment received after the handshake is one sample
        assert count == ss["segs_in"] - 1
        # the kernel's srtt as ss shows it sits in a filled bucket or next to one:
        # tcp_probe fires before a segment's ACK updates srtt, so ss sees one EWMA
        # step more than the last sample (an emulated CPU's RTTs jump a bucket)
        assert any(bins[i] for i in near(ss["rtt_us"], tuple(RTT_BOUNDS_US))), (ss, bins)
        assert any(seed_bins[i] for i in near(ss["rtt_us"], SEED_BOUNDS_US)), (ss, seed_bins)
        # the sum and the bins count the same samples: each sample lies in its bin,
        # (bound[i-1], bound[i]], so the mean lies between the lowest and the highest
        # non-empty bins (exact; ss's last srtt against the mean would be a timing bet)
        mean_us = sum_s / count * 1e6
        filled = [i for i, n in enumerate(bins) if n]
        edges = (0, *RTT_BOUNDS_US, float("inf"))
        assert edges[filled[0]] < mean_us <= edges[filled[-1] + 1]
        # the two histograms count the same samples; seed sums are in microseconds
        assert sum(seed_bins) == count
        assert seed[1] - seed0[1] == pytest.approx(sum_s * 1e6)
        # _count grows with segments received
        ping_pong(cli, conn, 20)
        rig.flows.read()
        grown = sum(rig.cache.get(LENS, ("egress", cls, addr, *NO_IDENTITY))[0]) - sum(lens[0])
        assert grown == ss_info(addr, port)["segs_in"] - ss["segs_in"] >= 20
    finally:
        cli.close()
        conn.close()
        srv.close()


@pytest.fixture
def tiny_rtt() -> Iterator[TcpFlows]:
    cfg = config.load(None, env={"LENS_BPF__MAX_RTT_KEYS": "16"})
    loader = BpfLoader()
    flows = TcpFlows(cfg, MetricCache(3600, 100000), EventBus(1000), loader)
    assert flows.start(parse_policy("docker: [127.0.0.0/16]\nlocalhost: [127.0.0.0/8]\n"))
    yield flows
    loader.close()


def test_a_thousand_remotes_stay_within_the_map_and_overflow_is_counted(
    tiny_rtt: TcpFlows,
) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 0))
    srv.listen(1024)
    port = srv.getsockname()[1]
    addrs = [f"127.0.{2 + i // 250}.{1 + i % 250}" for i in range(1000)]
    for addr in addrs:
        cli = socket.create_connection((addr, port))
        conn, _ = srv.accept()
        ping_pong(cli, conn, 2)
        cli.close()
        conn.close()
    srv.close()
    tiny_rtt.read()
    table = tiny_rtt.bpf[b"rtt"]
    assert len(list(table.keys())) <= 16 + 14
    assert tiny_rtt.kernel_stats["rtt_map_full"] > 0
    other = tiny_rtt.cache.get(LENS, ("egress", "docker", "other", *NO_IDENTITY))
    assert other is not None and sum(other[0]) > 0
    per_addr = sum(
        sum(v[0])
        for labels, v in tiny_rtt.cache.snapshot_family(LENS)
        if labels[:2] == ("egress", "docker") and labels[2] != "other"
    )
    # each connection received 2 responses after its handshake: nothing lost
    assert per_addr + sum(other[0]) >= 2 * len(addrs)
    assert in_netns(None, lambda: True)
