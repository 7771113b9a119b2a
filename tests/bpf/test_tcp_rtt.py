"""RTT histograms binned in the kernel, checked against the kernel's own srtt (ss -ti), on
both paths: sampled from the socket (BTF) and per segment (tcp_probe)."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from lens_ebpf.agent import config
from lens_ebpf.agent.bpf.loader import BpfLoader
from lens_ebpf.agent.bpf.spec import ITER, TRACEPOINT, Kernel
from lens_ebpf.agent.events import EventBus
from lens_ebpf.agent.metrics.cache import MetricCache
from lens_ebpf.agent.net.identity import NO_IDENTITY
from lens_ebpf.agent.net.policy import load_policy, parse_policy
from lens_ebpf.agent.tcp.tcp_flows import SPEC, TcpFlows
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
    return {"rtt_us": round(float(m.group(1)) * 1000, 3), "segs_in": int(segs.group(1))}


def bucket_of(value_us: float, bounds: tuple[float, ...]) -> int:
    return next((i for i, b in enumerate(bounds) if value_us <= b), len(bounds))


def near(value_us: float, bounds: tuple[float, ...]) -> set[int]:
    """The bucket of value_us and its neighbours."""
    b = bucket_of(value_us, bounds)
    return {max(b - 1, 0), b, min(b + 1, len(bounds))}


def rtt_state(rig_cache: MetricCache, addr: str, cls: str) -> tuple[list[float], float]:
    """The egress lens_tcp_rtt_seconds bins and sum for addr (zeros before any sample)."""
    got = rig_cache.get(LENS, ("egress", cls, addr, *NO_IDENTITY))
    return (list(got[0]), got[1]) if got else ([0] * (len(RTT_BOUNDS_US) + 1), 0.0)


def grew(
    flows: TcpFlows, cache: MetricCache, addr: str, cls: str, before: tuple[list[float], float]
) -> tuple[list[float], float]:
    """Bins and sum added since before."""
    flows.read()
    now = rtt_state(cache, addr, cls)
    return [a - b for a, b in zip(now[0], before[0], strict=True)], now[1] - before[1]


def settled(
    flows: TcpFlows,
    cache: MetricCache,
    addr: str,
    port: int,
    cls: str,
    before: tuple[list[float], float],
) -> tuple[list[float], float, dict[str, float]]:
    """grew() and ss_info() for a read that no segment crossed: the segments the socket
    received stay the same from before the map's read to after it (on a busy machine a
    late ACK or a retransmission can land between the two reads, as counted by one and
    not the other)."""
    for _ in range(50):
        ss = ss_info(addr, port)
        bins, sum_s = grew(flows, cache, addr, cls, before)
        after = ss_info(addr, port)
        if after["segs_in"] == ss["segs_in"]:
            return bins, sum_s, after
        time.sleep(0.1)
    raise AssertionError(f"{addr}:{port} kept receiving segments")


def check_bins(bins: list[float], sum_s: float, ss_rtt_us: float) -> None:
    """ss's srtt sits in a filled bucket or next to one, and the mean lies between the
    lowest and highest non-empty bins (each sample lies in its bin, (bound[i-1],
    bound[i]]: exact; ss's last srtt against the mean would be a timing bet)."""
    assert any(bins[i] for i in near(ss_rtt_us, tuple(RTT_BOUNDS_US))), (ss_rtt_us, bins)
    count = sum(bins)
    # the samples are whole microseconds (srtt_us >> 3); their sum, kept in seconds as a
    # float, is rounded back to them: a sample of exactly a bound (100 us) read as
    # 100.00000000000004 once on 6.1 and fell outside its own bin
    mean_us = round(sum_s * 1e6) / count
    filled = [i for i, n in enumerate(bins) if n]
    edges = (0, *RTT_BOUNDS_US, float("inf"))
    assert edges[filled[0]] < mean_us <= edges[filled[-1] + 1]


@contextlib.contextmanager
def connected(
    flows: TcpFlows,
    ns: str | None,
    addr: str,
) -> Iterator[tuple[socket.socket, socket.socket, socket.socket]]:
    """A listener on addr (in ns) and one connection to it (listener, client, accepted),
    the flows read first (the series may hold earlier tests' flows: a test measures the
    increase) and RTT sampled at every chance."""
    srv = listener(addr, ns=ns)
    flows.read()
    flows.set_rtt_sampling(0)
    try:
        cli = socket.create_connection((addr, srv.getsockname()[1]))
        conn, _ = srv.accept()
        with cli, conn:
            yield srv, cli, conn
    finally:
        srv.close()


def one_per_socket_per_period(
    flows: TcpFlows,
    cache: MetricCache,
    addr: str,
    cls: str,
    one: tuple[socket.socket, socket.socket],
    two: tuple[socket.socket, socket.socket],
) -> tuple[list[float], float]:
    """Periods of an hour, the first starting now: each of two connections takes one
    sample in a period however much it moves, and a period no sample has read adds none
    (a read starts no period); the histograms as they were before, for more checks."""
    flows.set_rtt_sampling(3600)
    before = rtt_state(cache, addr, cls)
    ping_pong(*one, 20)
    ping_pong(*two, 20)
    bins, _ = grew(flows, cache, addr, cls, before)
    assert sum(bins) == 2, bins
    ping_pong(*one, 5)
    bins, _ = grew(flows, cache, addr, cls, before)
    assert sum(bins) == 2, bins
    flows.set_rtt_sampling(3600)  # the next period: one more from the socket that moves
    ping_pong(*one, 5)
    bins, _ = grew(flows, cache, addr, cls, before)
    assert sum(bins) == 3, bins
    return before


@pytest.fixture(scope="module")
def per_message(policy_file) -> Iterator[TcpFlows]:
    """tcp_flows as a kernel without the TCP socket iterator loads it (5.10): bytes from
    a program per message (raw tracepoints on 6.3+, kprobes before), RTT sampled by those
    programs from the socket where BTF places srtt_us."""
    loader = BpfLoader()
    no_iter = dataclasses.replace(Kernel.running((SPEC,)), iterators=False)
    cfg = config.load(None)
    flows = TcpFlows(
        cfg.bpf, cfg.events, MetricCache(3600, 100000), EventBus(1000), loader, kernel=no_iter
    )
    if flows.rtt is None or not flows.rtt.sampled:
        pytest.skip(
            "no BTF tcp_sock.srtt_us on this kernel: RTT comes from tcp_probe "
            "(test_rtt_per_segment_matches_the_kernels_srtt)"
        )
    assert flows.plan.paths()["bytes"] != ITER
    assert flows.start(load_policy(policy_file))
    configured = flows.rtt_sample_seconds
    yield flows
    flows.set_rtt_sampling(configured)
    loader.close()


@pytest.mark.parametrize(
    ("where", "addr", "cls"),
    [
        ("loopback", "127.0.0.81", "localhost"),
        ("veth", "192.168.77.2", "internalHosts"),
    ],
)
def test_rtt_sampled_per_message_is_the_kernels_srtt(
    per_message: TcpFlows, lab, where: str, addr: str, cls: str
) -> None:
    """One sample per send and per receive at sample_seconds 0, each the socket's srtt as
    ss shows it; else one per socket per period, whatever the traffic."""
    sampled, cache = per_message, per_message.cache
    with connected(sampled, lab.ns if where == "veth" else None, addr) as (srv, cli, conn):
        port = srv.getsockname()[1]
        before = rtt_state(cache, addr, cls)
        seed0 = cache.get(SEED, (addr, "egress")) or ([0] * (len(SEED_BOUNDS_US) + 1), 0.0)
        ping_pong(cli, conn, 50)
        bins, sum_s = grew(sampled, cache, addr, cls, before)
        # the client's 50 sends and 50 receives: one sample each (egress: the client's)
        assert sum(bins) == 100, bins
        ss = ss_info(addr, port)
        check_bins(bins, sum_s, ss["rtt_us"])
        seed = cache.get(SEED, (addr, "egress"))
        seed_bins = [a - b for a, b in zip(seed[0], seed0[0], strict=True)]
        assert sum(seed_bins) == 100
        assert seed[1] - seed0[1] == pytest.approx(sum_s * 1e6)
        assert any(seed_bins[i] for i in near(ss["rtt_us"], SEED_BOUNDS_US)), (ss, seed_bins)
        # the client's last receive took "q", which acknowledged its "p": its srtt has not
        # moved since. A receive of data that acknowledges nothing new leaves it so, and
        # samples exactly what ss shows (both microseconds, srtt_us >> 3)
        before = rtt_state(cache, addr, cls)
        conn.sendall(b"r")
        recv_exact(cli, 1)
        bins, sum_s = grew(sampled, cache, addr, cls, before)
        assert sum(bins) == 1 and round(sum_s * 1e6) == ss["rtt_us"], (bins, sum_s, ss)
        # periods of an hour: each socket takes one sample at its first send or receive
        # in the period, however many follow
        cli2 = socket.create_connection((addr, port))
        conn2, _ = srv.accept()
        with cli2, conn2:
            one_per_socket_per_period(sampled, cache, addr, cls, (cli, conn), (cli2, conn2))


@pytest.fixture
def folded(rig: FlowRig) -> Iterator[TcpFlows]:
    """The rig's program where it folds bytes from the socket's counters (no program per
    message): RTT is sampled at each fold; its interval set back afterwards."""
    flows = rig.flows
    if flows.plan.paths()["bytes"] != ITER:
        pytest.skip(
            f"bytes take the {flows.plan.paths()['bytes']} path on this kernel "
            f"({flows.plan.choices['bytes'].reason}): "
            "test_rtt_sampled_per_message_is_the_kernels_srtt covers it"
        )
    if flows.rtt is None or not flows.rtt.sampled:
        pytest.skip("no BTF tcp_sock.srtt_us on this kernel")
    configured = flows.rtt_sample_seconds
    yield flows
    flows.set_rtt_sampling(configured)


@pytest.mark.parametrize(
    ("where", "addr", "cls"),
    [
        ("loopback", "127.0.0.82", "localhost"),
        ("veth", "192.168.77.2", "internalHosts"),
    ],
)
def test_rtt_sampled_at_each_fold_is_the_kernels_srtt(
    rig: FlowRig, folded: TcpFlows, lab, where: str, addr: str, cls: str
) -> None:
    """Where no program runs per message, a socket's srtt is sampled when its bytes are
    folded (each read cycle's iterator walk, and its close) if it moved bytes since the
    last fold: at sample_seconds 0 at every such fold, else once per period."""
    with connected(folded, lab.ns if where == "veth" else None, addr) as (srv, cli, conn):
        port = srv.getsockname()[1]
        before = rtt_state(rig.cache, addr, cls)
        ping_pong(cli, conn, 50)
        bins, sum_s = grew(folded, rig.cache, addr, cls, before)
        assert sum(bins) == 1, bins  # one walk, one socket that moved bytes (egress)
        bins, _ = grew(folded, rig.cache, addr, cls, before)
        assert sum(bins) == 1, bins  # a walk after no traffic takes none
        # a receive of data that acknowledges nothing new leaves srtt as it was: the
        # sample is exactly what ss shows (both microseconds, srtt_us >> 3)
        before = rtt_state(rig.cache, addr, cls)
        conn.sendall(b"r")
        recv_exact(cli, 1)
        ss = ss_info(addr, port)
        bins, sum_s = grew(folded, rig.cache, addr, cls, before)
        assert sum(bins) == 1 and round(sum_s * 1e6) == ss["rtt_us"], (bins, sum_s, ss)
        check_bins(bins, sum_s, ss["rtt_us"])
        # periods of an hour: one sample per socket per period, however many walks
        cli2 = socket.create_connection((addr, port))
        conn2, _ = srv.accept()
        with cli2, conn2:
            before = one_per_socket_per_period(
                folded, rig.cache, addr, cls, (cli, conn), (cli2, conn2)
            )
            # a close folds what moved since the last walk, and samples it
            folded.set_rtt_sampling(0)
            ping_pong(cli2, conn2, 3)
            cli2.close()  # close() itself moves the socket to FIN_WAIT1: that run folds
            bins, _ = grew(folded, rig.cache, addr, cls, before)
            assert sum(bins) == 4, bins


@pytest.fixture(scope="module")
def per_segment() -> Iterator[TcpFlows]:
    """tcp_flows as a kernel without BTF loads it: RTT from tcp:tcp_probe, bytes through
    the classic tracepoints (6.3+) or kprobes; a small RTT map, for the overflow test."""
    # 64 keys: room for the host's other remotes in the first test (make test's other
    # worker's node lab alone has a dozen: its pods, its API server), still far below the
    # overflow test's 1,000
    cfg = config.load(None, env={"LENS_BPF__MAX_RTT_KEYS": "64"})
    loader = BpfLoader()
    no_btf = dataclasses.replace(Kernel.running((SPEC,)), btf=None)
    flows = TcpFlows(
        cfg.bpf, cfg.events, MetricCache(3600, 100000), EventBus(1000), loader, kernel=no_btf
    )
    assert flows.plan.paths()["rtt"] == TRACEPOINT and flows.rtt is not None
    assert not flows.rtt.sampled
    assert flows.start(parse_policy("docker: [127.0.0.0/16]\nlocalhost: [127.0.0.0/8]\n"))
    yield flows
    loader.close()


def test_rtt_per_segment_matches_the_kernels_srtt(per_segment: TcpFlows) -> None:
    addr, cls = "127.0.0.81", "docker"
    srv = listener(addr)
    port = srv.getsockname()[1]
    per_segment.read()
    before = rtt_state(per_segment.cache, addr, cls)
    cli = socket.create_connection((addr, port))
    conn, _ = srv.accept()
    try:
        ping_pong(cli, conn, 50)
        bins, sum_s, ss = settled(per_segment, per_segment.cache, addr, port, cls, before)
        # every segment received after the handshake is one sample
        assert sum(bins) == ss["segs_in"] - 1
        # tcp_probe fires before a segment's ACK updates srtt, so ss sees one EWMA step
        # more than the last sample (an emulated CPU's RTTs jump a bucket)
        check_bins(bins, sum_s, ss["rtt_us"])
        # _count grows with segments received
        before = rtt_state(per_segment.cache, addr, cls)
        ping_pong(cli, conn, 20)
        bins, _, now = settled(per_segment, per_segment.cache, addr, port, cls, before)
        assert sum(bins) == now["segs_in"] - ss["segs_in"] >= 20
    finally:
        cli.close()
        conn.close()
        srv.close()


def test_a_thousand_remotes_stay_within_the_map_and_overflow_is_counted(
    per_segment: TcpFlows,
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
    per_segment.read()
    table = per_segment.bpf[b"rtt"]
    assert len(list(table.keys())) <= 64 + 14
    assert per_segment.kernel_stats["rtt_map_full"] > 0
    other = per_segment.cache.get(LENS, ("egress", "docker", "other", *NO_IDENTITY))
    assert other is not None and sum(other[0]) > 0
    per_addr = sum(
        sum(v[0])
        for labels, v in per_segment.cache.snapshot_family(LENS)
        if labels[:2] == ("egress", "docker") and labels[2] != "other"
    )
    # each connection received 2 responses after its handshake: nothing lost
    assert per_addr + sum(other[0]) >= 2 * len(addrs)
    assert in_netns(None, lambda: True)
