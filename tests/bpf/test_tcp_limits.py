"""tcp_flows.c with tiny maps: a full flow map and a full ring buffer lose nothing silently;
closed-flow records only while a consumer wants them, the counts exact either way."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from lens_ebpf.agent import config
from lens_ebpf.agent.bpf.loader import BpfLoader
from lens_ebpf.agent.events import EventBus, EventFilter
from lens_ebpf.agent.metrics.cache import MetricCache
from lens_ebpf.agent.net import proc_tcp
from lens_ebpf.agent.net.identity import NO_IDENTITY
from lens_ebpf.agent.net.policy import parse_policy
from lens_ebpf.agent.tcp.tcp_flows import TcpFlows
from lens_ebpf.agent.tcp.tcp_flows_stats import TcpFlowsCollector
from tests.conftest import wait_for
from tests.netlab import in_netns, sh

pytestmark = pytest.mark.bpf

OPENED = "lens_tcp_connections_opened_total"


@pytest.fixture(scope="module")
def tiny() -> Iterator[TcpFlows]:
    """One load for the module's two tests (a compile is minutes in the 5.10 guest): the
    flow-map test counts keys, the ring-buffer test records, neither the other's."""
    env = {"LENS_BPF__MAX_FLOW_KEYS": "16", "LENS_BPF__RINGBUF_PAGES": "1"}
    cfg = config.load(None, env=env)
    loader = BpfLoader()
    flows = TcpFlows(cfg.bpf, cfg.events, MetricCache(3600, 100000), EventBus(100000), loader)
    # a class of its own, so other traffic on the host cannot reach its overflow slot
    assert flows.start(parse_policy("docker: [127.0.1.0/24]\nlocalhost: [127.0.0.0/8]\n"))
    yield flows
    loader.close()


def connect_each(addrs: list[str]) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 0))
    srv.listen(1024)
    port = srv.getsockname()[1]
    for addr in addrs:
        c = socket.create_connection((addr, port))
        conn, _ = srv.accept()
        c.close()
        conn.close()
    srv.close()


def test_full_flow_map_lands_in_the_other_slot(tiny: TcpFlows) -> None:
    addrs = [f"127.0.1.{i}" for i in range(1, 41)]
    connect_each(addrs)
    tiny.read()
    per_addr = 0.0
    for labels, value in tiny.cache.snapshot_family(OPENED):
        if labels[0] == "egress" and labels[1] == "docker" and labels[2] != "other":
            per_addr += value
    other = tiny.cache.get(OPENED, ("egress", "docker", "other", "other", *NO_IDENTITY)) or 0.0
    assert per_addr < 40 and other > 0
    assert per_addr + other == 40  # aggregated, not lost
    assert tiny.kernel_stats["flow_map_full"] >= other
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in TcpFlowsCollector(tiny).collect()
        for s in m.samples
    }
    full = samples[("lens_agent_bpf_map_full_total", (("map", "flows"), ("program", "tcp_flows")))]
    assert full == tiny.kernel_stats["flow_map_full"] > 0


def test_full_ring_buffer_is_counted(tiny: TcpFlows) -> None:
    # one page holds about 36 records; a consumer wants them but nobody polls, so most
    # of 2 x 100 must be dropped
    tiny.bus.subscribe("t-full")
    connect_each(["127.0.1.200"] * 100)

    def closed() -> bool:  # every socket's CLOSE ran (its last steps can trail close())
        tiny.read()
        return tiny.kernel_stats["events"] + tiny.kernel_stats["ringbuf_full"] >= 200

    wait_for(closed, "200 closes written or counted as dropped")
    full = tiny.kernel_stats["ringbuf_full"]
    submitted = tiny.kernel_stats["events"]
    assert full > 0
    assert submitted < 200
    tiny.poll(0)
    assert tiny.events_received >= submitted  # what went in comes out
    assert submitted + full >= 200


@pytest.fixture
def gated() -> Iterator[TcpFlows]:
    cfg = config.load(None, env={"LENS_EVENTS__FLOW_RECORDS_LINGER_SECONDS": "0"})
    loader = BpfLoader()
    flows = TcpFlows(cfg.bpf, cfg.events, MetricCache(3600, 100000), EventBus(100000), loader)
    assert flows.start(parse_policy("docker: [127.0.1.0/24]\nlocalhost: [127.0.0.0/8]\n"))
    yield flows
    loader.close()


def opened(flows: TcpFlows, addr: str) -> float:
    flows.read()
    series = flows.cache.snapshot_family(OPENED)
    return sum(v for labels, v in series if labels[0] == "egress" and labels[2] == addr)


def test_flow_records_only_while_a_consumer_wants_them(gated: TcpFlows) -> None:
    addr = "127.0.1.201"
    # nobody subscribed: every connection counted, no record written
    assert not gated.records_on
    connect_each([addr] * 20)
    assert opened(gated, addr) == 20
    assert gated.kernel_stats["events"] == 0
    gated.poll(0)
    assert gated.events_received == 0
    # a subscriber for process events only changes nothing
    procs = gated.bus.subscribe("t-procs", accept=EventFilter(kinds=frozenset({"process_exec"})))
    assert not gated.records_on
    # one that takes flows turns them on at once: one record per socket
    sub = gated.bus.subscribe("t-flows", accept=EventFilter(kinds=frozenset({"flow_closed"})))
    assert gated.records_on
    connect_each([addr] * 20)
    got = []

    def records() -> int:
        gated.poll(0)
        while (ev := sub.get(0)) is not None:
            got.append(ev)
        return len([e for e in got if addr in (e.raddr, e.laddr)])

    # both ends are on this host: a record for each
    wait_for(lambda: records() >= 2 * 20, "a record for each end of 20 connections")
    assert records() == 2 * 20
    assert opened(gated, addr) == 40
    # gone (no linger here): off at the next read, and still counted
    gated.bus.unsubscribe(sub)
    gated.bus.unsubscribe(procs)
    gated.read()
    assert not gated.records_on
    before = gated.kernel_stats["events"]
    connect_each([addr] * 20)
    assert opened(gated, addr) == 60
    assert gated.kernel_stats["events"] == before


def test_an_iterator_that_fails_to_load_leaves_a_program_per_message(monkeypatch) -> None:
    """Where the TCP iterator cannot be linked (a BCC or kernel that refuses it), the
    program loads again with a program per message, says why, and counts exactly."""
    from lens_ebpf.agent.bpf import loader as loader_mod
    from lens_ebpf.agent.bpf.spec import ITER

    loader = BpfLoader()
    cfg = config.load(None)
    flows = TcpFlows(cfg.bpf, cfg.events, MetricCache(3600, 100000), EventBus(1000), loader)
    if flows.plan.paths()["bytes"] != ITER:
        pytest.skip(f"no iterator to fail here: {flows.plan.choices['bytes'].reason}")

    def refuse(self, bpf, target: str) -> None:
        raise RuntimeError(f"cannot link the {target} iterator: Operation not permitted")

    monkeypatch.setattr(loader_mod.BpfIterator, "__init__", refuse)
    try:
        assert flows.start(parse_policy("docker: [127.0.1.0/24]\nlocalhost: [127.0.0.0/8]\n"))
        assert flows.plan.paths()["bytes"] != ITER
        assert flows.plan.choices["bytes"].reason.startswith(
            "no iter: BPF iterators (failed to load: cannot link the tcp iterator: "
            "Operation not permitted)"
        )
        assert loader.status["tcp_flows"].state == "attached"
        assert "failed to load" in loader.status["tcp_flows"].detail
        srv = socket.create_server(("127.0.0.91", 0))
        port = srv.getsockname()[1]
        cli = socket.create_connection(("127.0.0.91", port))
        conn, _ = srv.accept()
        cli.sendall(b"f" * 4321)
        got = 0
        while got < 4321:
            got += len(conn.recv(65536))
        flows.read()
        key = ("egress", "localhost", "127.0.0.91", str(port), *NO_IDENTITY)
        assert flows.cache.get("lens_tcp_sent_bytes_total", key) == 4321
        cli.close()
        conn.close()
        srv.close()
    finally:
        loader.close()


def test_a_failed_walk_is_counted_and_the_read_goes_on(tiny: TcpFlows, monkeypatch) -> None:
    """A walk of open sockets that fails (the kernel refuses a new iterator fd) leaves
    the closed flows' counts read as ever, and says how many walks failed."""
    if tiny._walk is None:
        pytest.skip("bytes take a per-message path here: no walk")

    def refused() -> bytes:
        raise OSError("cannot start an iterator walk (errno 24)")

    def opened() -> float:  # the map may be full (the other test): any key, "other" too,
        # of the class this module's tests alone reach (localhost is every process's)
        tiny.read()
        return sum(
            v
            for labels, v in tiny.cache.snapshot_family(OPENED)
            if labels[:2] == ("egress", "docker")
        )

    base = opened()
    monkeypatch.setattr(tiny, "_walk", refused)
    before = tiny.walks_failed
    connect_each(["127.0.1.92"])
    wait_for(lambda: opened() == base + 1, "the connection counted while walks fail")
    assert tiny.walks_failed > before
    got = {s.name: s.value for m in TcpFlowsCollector(tiny).collect() for s in m.samples}
    assert got["lens_agent_tcp_walks_failed_total"] == tiny.walks_failed


def test_a_namespace_without_tcp_sockets_is_not_walked(tiny: TcpFlows) -> None:
    """A walk scans the kernel's whole established hash: a namespace holding no TCP
    socket (sockstat's count, per namespace) is passed over, one with a listener is
    walked, each counted; the exposition says both."""
    if tiny._walk is None:
        pytest.skip("bytes take a per-message path here: no walk")
    ns = "lenst-walk"
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        walked, skipped = tiny.walks, tiny.walks_skipped
        assert in_netns(ns, proc_tcp.tcp_in_use) == 0
        assert in_netns(ns, tiny._walk_one) is True
        assert (tiny.walks, tiny.walks_skipped) == (walked, skipped + 1)

        def listen_and_walk() -> tuple[int | None, bool]:
            with socket.socket(socket.AF_INET6) as srv:
                srv.bind(("::1", 0))
                srv.listen()
                return proc_tcp.tcp_in_use(), tiny._walk_one()

        assert in_netns(ns, listen_and_walk) == (1, True)
        assert (tiny.walks, tiny.walks_skipped) == (walked + 1, skipped + 1)
    finally:
        sh("ip", "netns", "del", ns)
    got = {s.name: s.value for m in TcpFlowsCollector(tiny).collect() for s in m.samples}
    assert got["lens_agent_tcp_walks_total"] == tiny.walks
    assert got["lens_agent_tcp_walks_skipped_total"] == tiny.walks_skipped
