"""tcp_flows.c on the real kernel: real TCP between namespaces, exact counts."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lens_ebpf.agent import tracefs
from lens_ebpf.agent.bpf.loader import ATTACHED, LoaderCollector
from lens_ebpf.agent.bpf.spec import ITER
from lens_ebpf.agent.bpf.syscall import recursion_misses
from lens_ebpf.agent.events import EventFilter, python_event
from lens_ebpf.agent.net.policy import parse_policy
from lens_ebpf.agent.stream import convert
from lens_ebpf.agent.tcp import decode
from tests.conftest import EMULATED, hang_guard, wait_for
from tests.netlab import exchange, in_netns, listener, recv_exact, sh

from .conftest import FlowRig

pytestmark = pytest.mark.bpf

SENT = "lens_tcp_sent_bytes_total"
RECV = "lens_tcp_received_bytes_total"
OPENED = "lens_tcp_connections_opened_total"
CLOSED = "lens_tcp_connections_closed_total"
FAILED = "lens_tcp_failed_connects_total"
RESETS = "lens_tcp_resets_total"


def test_program_attached_and_reported(rig: FlowRig) -> None:
    st = rig.flows.loader.status["tcp_flows"]
    assert st.state == ATTACHED
    assert "sock:inet_sock_set_state" in st.tracepoints + st.btf_tracepoints
    samples = {
        s.labels["program"]: s.value
        for m in LoaderCollector(rig.flows.loader).collect()
        for s in m.samples
        if s.name == "lens_agent_bpf_program_attached"
    }
    assert samples == {"tcp_flows": 1.0}
    # scripts/setup.sh builds the compiled event path: the tests below run through it
    assert rig.flows.encoder == "compiled"


def test_compiled_events_are_the_python_paths_bytes(rig: FlowRig) -> None:
    """Real records, both ways: what a stream sends (the compiled path's bytes, taken raw
    from the bus) is what the Python path makes of the same record."""
    sub = rig.bus.subscribe(
        "t-wire", accept=EventFilter(kinds=frozenset({"flow_closed"})), raw=True
    )
    try:
        srv = listener("127.0.0.62")
        for sent, received in ((1, 2), (70_000, 3), (0, 0)):
            exchange(srv, "127.0.0.62", sent, received)
        srv.close()
        wanted: list = []
        deadline = time.monotonic() + hang_guard(15)
        while len(wanted) < 6 and time.monotonic() < deadline:
            ev = sub.get(timeout=0.2)
            rec = decode.flow_record(ev.record) if ev is not None else None
            if rec is not None and "127.0.0.62" in (rec.raddr, rec.laddr):  # either end
                wanted.append(ev)
    finally:
        rig.bus.unsubscribe(sub)
    assert len(wanted) == 6
    for packed in wanted:
        want = decode.flow_record(packed.record)
        object.__setattr__(want, "seq", packed.seq)
        object.__setattr__(want, "ts_unix_nano", packed.ts_unix_nano)
        assert packed._wire == convert.encode(want, *rig.bus.node)
    got = sorted((e.sent_bytes, e.received_bytes) for e in map(python_event, wanted))
    assert got == [(0, 0), (0, 0), (1, 2), (2, 1), (3, 70_000), (70_000, 3)]


@pytest.mark.parametrize(
    ("addr", "cls"),
    [
        ("10.244.7.2", "k8sPod"),
        ("10.96.7.2", "k8sSvc"),
        ("10.53.0.53", "dns"),
        ("192.168.77.2", "internalHosts"),
        ("198.51.100.7", "externalHosts"),
        ("fd00:77::2", "internalHosts"),
    ],
)
def test_flow_class_direction_port_and_exact_bytes(rig: FlowRig, lab, addr: str, cls: str) -> None:
    # the accepted side, inside the namespace: the remote is the host end of the veth
    host = lab.host_v6 if ":" in addr else lab.host_v4
    # this exchange's records only: the host's other flows (other tests, other
    # processes) close meanwhile too, and their records come on the same bus
    sub = rig.bus.subscribe(f"t-{addr}", accept=lambda e: addr in (e.get("raddr"), e.get("laddr")))
    try:
        # the rig's counters live for the session: a port an earlier flow to these
        # addresses had (every IPv4 case's accepted side has the same remote) would add
        # this exchange to that flow's key, so the kernel is asked for another
        for _ in range(20):
            srv = listener(addr, ns=lab.ns)
            p = str(srv.getsockname()[1])
            eg, ing = ("egress", cls, addr, p), ("ingress", "internalHosts", host, p)
            if rig.value(OPENED, *eg) == rig.value(OPENED, *ing) == 0:
                break
            srv.close()
        send_n, reply_n = 12345, 6789
        port, cport = exchange(srv, addr, send_n, reply_n)
        srv.close()
        events = rig.wait_events(sub, 2)
    finally:
        rig.bus.unsubscribe(sub)
    assert [rig.value(n, *eg) for n in (SENT, RECV, OPENED, CLOSED)] == [
        send_n,
        reply_n,
        1,
        1,
    ], rig.explain(*eg)
    assert [rig.value(n, *ing) for n in (SENT, RECV, OPENED)] == [reply_n, send_n, 1], rig.explain(
        *ing
    )
    # seed names: pods and services by class only, dns alone, the rest per address
    total = send_n + reply_n
    if cls in ("k8sPod", "k8sSvc"):
        assert rig.value("primus_lens_network_k8s_tcp_flow", cls) >= total
        assert (
            rig.cache.get("primus_lens_network_tcp_flow_egress", (addr, str(port), "egress", cls))
            is None
        )
    elif cls == "dns":
        assert rig.value("primus_lens_network_flow_dns") >= total
    else:
        assert (
            rig.value("primus_lens_network_tcp_flow_egress", addr, str(port), "egress", cls)
            == total
        )
    assert (
        rig.value(
            "primus_lens_network_tcp_flow_ingress", str(port), host, "ingress", "internalHosts"
        )
        == total
    )
    # one closed-flow record per side, with the same numbers
    by_dir = {e["direction"]: e for e in events}
    assert set(by_dir) == {"egress", "ingress"}
    eg_ev = by_dir["egress"]
    assert eg_ev["pid"] == os.getpid()
    assert eg_ev["raddr"] == addr and eg_ev["rport"] == port and eg_ev["lport"] == cport
    assert eg_ev["class"] == cls
    assert (eg_ev["sent_bytes"], eg_ev["received_bytes"]) == (send_n, reply_n)
    assert eg_ev["reason"] == "normal"
    assert eg_ev["duration_ns"] > 0
    ing_ev = by_dir["ingress"]
    assert (ing_ev["sent_bytes"], ing_ev["received_bytes"]) == (reply_n, send_n)
    assert ing_ev["lport"] == port and ing_ev["raddr"] == host
    assert ing_ev["pid"] == os.getpid()


def _cgroup_v2_inode() -> int | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            rel = line[3:].lstrip("/")
            for root in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
                p = Path(root, rel)
                if (Path(root) / "cgroup.controllers").exists() and p.exists():
                    return p.stat().st_ino
    return None


def test_closed_flow_record_names_the_process_and_cgroup(rig: FlowRig) -> None:
    sub = rig.bus.subscribe("t-cgroup", accept=lambda e: e.get("raddr") == "127.0.0.61")
    try:
        srv = listener("127.0.0.61")
        port, _ = exchange(srv, "127.0.0.61", 10, 20)
        srv.close()
        events = rig.wait_events(sub, 1)
    finally:
        rig.bus.unsubscribe(sub)
    eg = next(e for e in events if e["direction"] == "egress")
    assert eg["comm"] == Path("/proc/self/comm").read_text().strip()[:15]
    inode = _cgroup_v2_inode()
    if inode is not None:
        assert eg["cgroup_id"] == inode
    assert eg["rport"] == port


def test_ipv6_loopback_is_localhost(rig: FlowRig) -> None:
    # ::1 is every process's loopback (the rig's counters live for the session and see
    # the whole host): a port no earlier flow to ::1 had, so the counts are this flow's
    for _ in range(20):
        srv = listener("::1")
        key = ("egress", "localhost", "::1", str(srv.getsockname()[1]))
        if rig.value(SENT, *key) == rig.value(OPENED, *key) == 0:
            break
        srv.close()
    port, _ = exchange(srv, "::1", 4000, 1000)
    srv.close()
    assert rig.wait_value(SENT, *key, want=4000) == 4000
    assert rig.value(RECV, *key) == 1000
    assert (
        rig.value("primus_lens_network_tcp_flow_egress", "::1", str(port), "egress", "localhost")
        == 5000
    )


@pytest.mark.parametrize(("where", "addr"), [("host", "127.0.0.62"), ("pod", "127.0.0.93")])
def test_long_lived_flow_bytes_grow_before_close(
    rig: FlowRig, request, where: str, addr: str
) -> None:
    """An open connection's bytes show before it closes, each way, a peek counting
    nothing: on the host, and with both ends in another network namespace (a pod's;
    where bytes come from the socket's counters the agent walks every namespace)."""
    ns = request.getfixturevalue("lab").ns if where == "pod" else None
    # the client's own source address: the accepted side's key names it, where 127.0.0.1
    # is also every other process's clients' (a server of theirs may have this port)
    source = addr.replace("127.0.0.", "127.0.9.")

    def connect() -> tuple[socket.socket, socket.socket, socket.socket]:
        srv = listener(addr)
        cli = socket.create_connection(srv.getsockname(), source_address=(source, 0))
        return srv, cli, srv.accept()[0]

    srv, cli, conn = in_netns(ns, connect)
    port = srv.getsockname()[1]
    key = ("egress", "localhost", addr, str(port))
    ing = ("ingress", "localhost", source, str(port))
    try:
        cli.sendall(b"a" * 1000)
        assert recv_exact(conn, 1000) == 1000
        assert rig.value(SENT, *key) == 1000
        assert rig.value(OPENED, *key) == 1
        assert rig.value(CLOSED, *key) == 0
        cli.sendall(b"b" * 2500)
        assert recv_exact(conn, 2500) == 2500
        assert rig.value(SENT, *key) == 3500
        # a peek reads nothing out of the socket and must not count
        cli.sendall(b"c" * 7)
        conn.recv(7, socket.MSG_PEEK)
        assert conn.recv(7) == b"c" * 7
        assert rig.value(RECV, *ing) == 3507
        conn.sendall(b"d" * 700)
        assert recv_exact(cli, 700) == 700
        assert (rig.value(RECV, *key), rig.value(SENT, *ing)) == (700, 700)
    finally:
        cli.close()
        conn.close()
        srv.close()
    assert rig.wait_value(CLOSED, *key, want=1) == 1
    assert (rig.value(SENT, *key), rig.value(RECV, *key)) == (3507, 700)


def test_sockets_opened_before_the_agent_count_as_untracked_bytes_tcp_only(rig: FlowRig) -> None:
    """A connection older than the program has no flow; its bytes go to the untracked
    counters, and only TCP's: the raw tracepoints see every socket, so a Unix or UDP
    socket's bytes moving in the same window must not count. The counters are the whole
    node's: another process's old connection can add to a window (make test's other
    worker keeps loopback connections it opened before the rig busy), so a window is
    tried again (up to 10), and one must be exact."""
    cli, srv = rig.early

    def counts() -> tuple[int, int]:  # lens_tcp_untracked_bytes_total{way=sent|received}
        rig.flows.read()
        st = rig.flows.kernel_stats
        return st["untracked_sent_bytes"], st["untracked_recv_bytes"]

    def window() -> tuple[int, int]:
        sent0, recv0 = counts()
        a, b = socket.socketpair()
        u1, u2 = (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
        )
        with a, b, u1, u2:
            u2.bind(("127.0.0.64", 0))
            for _ in range(3):
                a.sendall(b"u" * 5000)
                assert recv_exact(b, 5000) == 5000
                u1.sendto(b"d" * 1200, u2.getsockname())
                assert len(u2.recv(2000)) == 1200
                cli.sendall(b"t" * 1111)
                assert recv_exact(srv, 1111) == 1111
            srv.sendall(b"r" * 222)
            assert recv_exact(cli, 222) == 222
        sent1, recv1 = counts()
        return sent1 - sent0, recv1 - recv0

    want = (3 * 1111 + 222, 3 * 1111 + 222)  # each byte sent once and received once
    got = [window()]
    while got[-1] != want and len(got) < 10:
        got.append(window())
    assert got[-1] == want, got


def test_refused_connect_is_a_failed_connect_and_a_reset(rig: FlowRig) -> None:
    # a port that was just free and is closed again: nothing listens there
    probe = socket.socket()
    probe.bind(("127.0.0.63", 0))
    port = probe.getsockname()[1]
    probe.close()
    before_rst = rig.flows.kernel_stats["reset_no_socket"]
    sub = rig.bus.subscribe("t-refused", accept=lambda e: e.get("raddr") == "127.0.0.63")
    try:
        cli = socket.socket()
        with pytest.raises(ConnectionRefusedError):
            cli.connect(("127.0.0.63", port))
        cli.close()
        events = rig.wait_events(sub, 1)
    finally:
        rig.bus.unsubscribe(sub)
    key = ("egress", "localhost", "127.0.0.63", str(port))
    assert rig.value(FAILED, *key) == 1
    assert rig.value(OPENED, *key) == 0
    assert rig.value(CLOSED, *key) == 0
    assert rig.value(RESETS, *key, "received") == 1
    if "saddr_v6" in tracefs.tracepoint_fields("tcp:tcp_send_reset"):
        # the older record (5.10, 6.1) is traced only for resets sent on a socket
        assert rig.flows.kernel_stats["reset_no_socket"] == before_rst
    else:  # the sockaddr record (6.12 on) traces the listener-less reset too
        assert rig.flows.kernel_stats["reset_no_socket"] >= before_rst + 1
    assert [e["reason"] for e in events] == ["failed_connect"]


def test_ten_thousand_short_connections_none_lost(rig: FlowRig) -> None:
    n = 2_000 if EMULATED else 10_000  # the same exact counts; an emulated CPU is slow
    lost_before = rig.flows.kernel_stats["ringbuf_full"]
    full_before = (rig.flows.kernel_stats["sock_map_full"], rig.flows.kernel_stats["flow_map_full"])
    sub = rig.bus.subscribe(
        "t-burst", accept=lambda e: e.get("raddr") in ("127.0.0.64", "127.0.0.65")
    )
    try:
        out = subprocess.run(
            [sys.executable, "-m", "tests.loadgen", "127.0.0.64", "127.0.0.65", str(n)],
            capture_output=True,
            text=True,
            timeout=hang_guard(120),
            check=True,
        )
        port = int(out.stdout)
        # sweeping, as the agent's reader loop does, for sockets whose CLOSE was skipped
        events = rig.wait_events(sub, 2 * n, timeout=15, reconcile=True)
    finally:
        rig.bus.unsubscribe(sub)
    eg = ("egress", "localhost", "127.0.0.64", str(port))
    ing = ("ingress", "localhost", "127.0.0.65", str(port))
    assert rig.value(OPENED, *eg) == n
    assert rig.value(CLOSED, *eg) == n
    assert rig.value(OPENED, *ing) == n
    assert rig.value(CLOSED, *ing) == n
    assert len(events) == 2 * n, (
        rig.flows.kernel_stats,
        rig.flows.events_received,
        sub.dropped,
        rig.flows.repaired,
    )
    assert sub.dropped == 0
    assert rig.flows.kernel_stats["ringbuf_full"] == lost_before == 0
    assert (
        (rig.flows.kernel_stats["sock_map_full"], rig.flows.kernel_stats["flow_map_full"])
        == full_before
        == (0, 0)
    )


@contextlib.contextmanager
def competing_tracer() -> Iterator[None]:
    """tests/bpf/competitor.c attached while the block runs."""
    from bcc import BPF

    bpf = BPF(src_file=str(Path(__file__).with_name("competitor.c")).encode())
    try:
        yield
    finally:
        bpf.cleanup()


def test_exact_bytes_under_split_reads_peeks_and_skipped_runs(rig: FlowRig) -> None:
    """Every byte once, whichever byte path this kernel has: reads that copy part of a
    message, wait and copy the rest (MSG_WAITALL: on the kprobe path each wait reported
    the bytes copied so far, so they were counted again), peeks, eight connections at
    once, and another tracing program on the same CPUs making the kernel skip runs."""
    n = 150 if EMULATED else 600
    send, reply = 700, 1300
    with competing_tracer():
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.loadgen",
                "--split",
                str(send),
                str(reply),
                "127.0.0.76",
                "127.0.0.77",
                str(n),
            ],
            capture_output=True,
            text=True,
            timeout=hang_guard(300),
            check=True,
        )
    port = out.stdout.strip()
    eg = ("egress", "localhost", "127.0.0.76", port)
    ing = ("ingress", "localhost", "127.0.0.77", port)
    got = {name: (rig.value(name, *eg), rig.value(name, *ing)) for name in (SENT, RECV, OPENED)}
    assert got == {SENT: (n * send, n * reply), RECV: (n * reply, n * send), OPENED: (n, n)}, (
        rig.explain(*eg),
        rig.explain(*ing),
        rig.flows.loader.status["tcp_flows"].paths,
    )
    rig.flows.reconcile()  # sockets whose CLOSE run the kernel skipped
    assert rig.wait_value(CLOSED, *eg, want=n) == n and rig.wait_value(CLOSED, *ing, want=n) == n
    # the kprobe path's return probes saw every return (none on the tracepoint path)
    missed = {probe: n for _, probe, n in rig.flows.loader.retprobe_misses()}
    kprobe = rig.flows.loader.status["tcp_flows"].paths["bytes"] == "kprobe"
    want = {"kretprobe:tcp_sendmsg": 0, "kretprobe:tcp_recvmsg": 0} if kprobe else {}
    assert missed == want


def test_policy_swap_reclassifies_new_flows(rig: FlowRig, policy_file: Path) -> None:
    addr = "127.0.0.66"
    srv = listener(addr)
    try:
        rig.flows.set_policy(parse_policy("internalHosts: [127.0.0.66/32]\n"))
        port, _ = exchange(srv, addr, 5, 5)
        assert rig.wait_value(OPENED, "egress", "internalHosts", addr, str(port), want=1) == 1
    finally:
        rig.flows.set_policy(parse_policy(policy_file.read_text()))
        srv.close()
    srv = listener(addr)
    port, _ = exchange(srv, addr, 5, 5)
    srv.close()
    assert rig.wait_value(OPENED, "egress", "localhost", addr, str(port), want=1) == 1


def test_kernel_skips_are_reported_per_probe(rig: FlowRig) -> None:
    misses = {probe: n for program, probe, n in rig.flows.loader.misses() if program == "tcp_flows"}
    fd = next(iter(rig.flows.bpf.funcs.values())).fd
    # bpf_prog_info carries recursion_misses from Linux 5.12: before, nothing to report
    reported = recursion_misses(fd) is not None
    st = rig.flows.loader.status["tcp_flows"]
    raw = {f"raw:{tp.split(':', 1)[1]}" for tp in st.raw_tracepoints}
    raw |= {f"tp_btf:{tp.split(':', 1)[1]}" for tp in st.btf_tracepoints}
    want = set(st.tracepoints) | raw if reported else set()
    assert set(misses) == want
    assert all(n >= 0 for n in misses.values())


def _plant(rig: FlowRig, sk: int, laddr: str, lport: int, raddr: str, rport: int) -> None:
    """A keyed socket entry as the kernel would leave it had its CLOSE run been skipped."""
    import ipaddress

    socks = rig.flows.bpf[b"socks"]
    si = socks.Leaf()
    si.start_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - 10**9
    si.family = 2
    si.direction = 0
    si.keyed = si.pid_known = 1
    si.lport, si.rport = lport, rport
    si.sent, si.recv = 11, 22
    mapped = bytes(10) + b"\xff\xff"
    si.laddr[:] = list(mapped + ipaddress.IPv4Address(laddr).packed)
    si.key.raddr[:] = list(mapped + ipaddress.IPv4Address(raddr).packed)
    si.key.port, si.key.family, si.key.cls = rport, 2, 5
    socks[socks.Key(sk)] = si


def test_sweep_finishes_a_socket_whose_close_went_unseen(rig: FlowRig) -> None:
    sk = 0xFFFF_8888_0000_1000  # no live socket has this address: it is only a key
    _plant(rig, sk, "127.0.0.67", 40000, "127.0.0.68", 8080)
    sub = rig.bus.subscribe("t-sweep", accept=lambda e: e.get("raddr") == "127.0.0.68")
    before = rig.flows.repaired
    try:
        assert rig.flows.reconcile() >= 1
        events = rig.wait_events(sub, 1)
    finally:
        rig.bus.unsubscribe(sub)
    assert rig.flows.repaired >= before + 1
    assert rig.flows.bpf[b"socks"].get(rig.flows.bpf[b"socks"].Key(sk)) is None
    key = ("egress", "localhost", "127.0.0.68", "8080")
    assert rig.value(CLOSED, *key) == 1
    assert events[0]["reason"] == "close_not_seen"
    assert (events[0]["sent_bytes"], events[0]["received_bytes"]) == (11, 22)
    # finished once only: another sweep leaves it (it may finish another process's
    # socket whose namespace it could not read: those are not this test's)
    rig.flows.reconcile()
    assert rig.value(CLOSED, *key) == 1


def test_sweep_leaves_live_sockets_alone(rig: FlowRig) -> None:
    srv = listener("127.0.0.69")
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.69", port))
    conn, _ = srv.accept()
    try:
        key = ("egress", "localhost", "127.0.0.69", str(port))
        assert rig.wait_value(OPENED, *key, want=1) == 1
        rig.flows.reconcile()
        assert rig.value(CLOSED, *key) == 0
        cli.sendall(b"z" * 5)
        assert recv_exact(conn, 5) == 5
        assert rig.value(SENT, *key) == 5
    finally:
        cli.close()
        conn.close()
        srv.close()
    assert rig.wait_value(CLOSED, *key, want=1) == 1


def test_reset_on_close_with_unread_data(rig: FlowRig) -> None:
    srv = listener("127.0.0.73")
    port = srv.getsockname()[1]
    source = "127.0.9.73"  # the accepted side's remote: this test's alone, not 127.0.0.1
    sub = rig.bus.subscribe("t-rst", accept=lambda e: source in (e.get("raddr"), e.get("laddr")))
    try:
        cli = socket.create_connection(("127.0.0.73", port), source_address=(source, 0))
        cli.settimeout(hang_guard(10))
        conn, _ = srv.accept()
        cli.sendall(b"q" * 100)
        wait_for(lambda: unread(conn) == 100, "the 100 bytes queued at the server")
        conn.close()  # 100 bytes unread: the kernel answers with a reset
        with pytest.raises(ConnectionResetError):
            cli.recv(10)
        cli.close()
        events = rig.wait_events(sub, 2)
    finally:
        rig.bus.unsubscribe(sub)
        srv.close()
    eg = ("egress", "localhost", "127.0.0.73", str(port))
    ing = ("ingress", "localhost", source, str(port))
    assert rig.value(RESETS, *eg, "received") == 1
    assert rig.value(RESETS, *ing, "sent") == 1
    assert rig.value(RECV, *ing) == 0
    assert rig.value(CLOSED, *eg) == 1 and rig.value(CLOSED, *ing) == 1
    reasons = {e["direction"]: e["reason"] for e in events}
    # the kernel closes the socket, then sends the reset: the record says aborted
    assert reasons == {"egress": "reset_received", "ingress": "aborted"}


def test_data_read_after_the_peer_closed_the_socket_is_not_lost(rig: FlowRig) -> None:
    """A client that shut its side (shutdown(SHUT_WR)) gets the reply and the server's FIN
    before it reads: its socket goes to CLOSE with 3,000 bytes queued, and it reads them
    after. Where bytes come from the socket's counters they count as read at CLOSE;
    where a program runs per message the late reads find no flow and count as untracked.
    Either way every byte is counted once. The untracked counter is the whole node's
    (another process's connection older than the rig adds to it, as make test's other
    worker's do): where none of ours may land there, a run is tried again (up to 5),
    and one must find it unchanged."""

    def run() -> int:  # this flow's counts checked; what the untracked counter grew
        srv = listener("127.0.0.78")
        port = srv.getsockname()[1]
        eg = ("egress", "localhost", "127.0.0.78", str(port))
        rig.flows.read()
        untracked0 = rig.flows.kernel_stats["untracked_recv_bytes"]
        cli = socket.create_connection(("127.0.0.78", port))
        cli.settimeout(hang_guard(10))
        conn, _ = srv.accept()
        try:
            cli.sendall(b"w" * 500)
            cli.shutdown(socket.SHUT_WR)
            assert recv_exact(conn, 1000) == 500  # and the client's FIN
            conn.sendall(b"x" * 3000)
            conn.close()
            # the FIN arrived in FIN_WAIT2: the client's socket is closed, the data waits
            assert rig.wait_value(CLOSED, *eg, want=1) == 1
            assert unread(cli) == 3000
            assert recv_exact(cli, 4000) == 3000
        finally:
            cli.close()
            srv.close()
        assert rig.value(SENT, *eg) == 500
        late = rig.flows.kernel_stats["untracked_recv_bytes"] - untracked0
        if rig.flows.plan.paths()["bytes"] == ITER:
            assert rig.value(RECV, *eg) == 3000
        else:  # the late reads count as untracked, with the node's other old connections'
            assert rig.value(RECV, *eg) + late >= 3000 and rig.value(RECV, *eg) <= 3000
        return late

    if rig.flows.plan.paths()["bytes"] != ITER:
        run()
        return
    lates = [run()]
    while lates[-1] != 0 and len(lates) < 5:
        lates.append(run())
    assert lates[-1] == 0, lates  # none of the 3,000 bytes read late counted again


def test_an_abortive_close_counts_what_send_accepted(rig: FlowRig) -> None:
    """SO_LINGER 0 with megabytes the peer never read: close() resets the connection
    and throws the queue away; sent is what send() accepted, on every path."""
    srv = listener("127.0.0.79")
    port = srv.getsockname()[1]
    eg = ("egress", "localhost", "127.0.0.79", str(port))
    cli = socket.create_connection(("127.0.0.79", port))
    conn, _ = srv.accept()
    try:
        cli.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        cli.setblocking(False)
        accepted = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                accepted += cli.send(b"y" * 65536)
        assert accepted > 65536
        cli.close()  # a reset, the queue dropped
        assert rig.wait_value(CLOSED, *eg, want=1) == 1
        assert rig.value(SENT, *eg) == accepted
    finally:
        cli.close()
        conn.close()
        srv.close()


def test_fast_open_data_in_the_syn_counts_once(rig: FlowRig, lab) -> None:
    """TCP Fast Open (in the lab's namespace, where tcp_fastopen lets both ends use it
    without a cookie): the client's first bytes ride in its SYN, the server reads them
    before the handshake ends. Every byte once, each way, on every path."""
    sh("ip", "netns", "exec", lab.ns, "sysctl", "-q", "-w", "net.ipv4.tcp_fastopen=1027")
    send_n, reply_n, conns = 700, 300, 3
    # the clients' own source address: the accepted sides' key names it (the rig counts
    # every namespace's flows, and 127.0.0.1 is every other process's clients' too)
    source = "127.0.9.5"

    def run() -> int:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_TCP, socket.TCP_FASTOPEN, 16)
        srv.bind(("127.0.0.5", 0))
        srv.listen(16)
        with srv:
            for _ in range(conns):
                c = socket.socket()
                c.bind((source, 0))
                c.sendto(b"t" * send_n, socket.MSG_FASTOPEN, srv.getsockname())
                conn, _ = srv.accept()
                assert recv_exact(conn, send_n) == send_n
                conn.sendall(b"r" * reply_n)
                assert recv_exact(c, reply_n) == reply_n
                c.close()
                conn.recv(1)  # the client's FIN
                conn.close()
            return int(srv.getsockname()[1])

    port = in_netns(lab.ns, run)
    nstat = ["ip", "netns", "exec", lab.ns, "nstat", "-az", "TcpExtTCPFastOpenPassive"]
    fast = subprocess.run(nstat, capture_output=True, text=True).stdout
    assert re.search(r"TcpExtTCPFastOpenPassive\s+[1-9]", fast), fast  # data rode a SYN
    eg = ("egress", "localhost", "127.0.0.5", str(port))
    ing = ("ingress", "localhost", source, str(port))
    assert rig.wait_value(CLOSED, *eg, want=conns) == conns
    assert rig.wait_value(CLOSED, *ing, want=conns) == conns
    assert (rig.value(SENT, *eg), rig.value(RECV, *eg)) == (conns * send_n, conns * reply_n)
    assert (rig.value(SENT, *ing), rig.value(RECV, *ing)) == (conns * reply_n, conns * send_n)


def unread(conn: socket.socket) -> int:
    """Bytes waiting in conn's receive queue (SIOCINQ), read without reading them."""
    return struct.unpack("i", fcntl.ioctl(conn, termios.FIONREAD, b"\0\0\0\0"))[0]


def _skipped(rig: FlowRig, probe: str) -> int:
    return sum(n for _, p, n in rig.flows.loader.misses() if p == probe)


def _ss_total_retrans(dst: str, dport: int) -> int:
    out = subprocess.run(
        ["ss", "-tinH", "dst", dst, "dport", f"= :{dport}"], capture_output=True, text=True
    ).stdout
    m = re.search(r"retrans:\d+/(\d+)", out)
    return int(m.group(1)) if m else 0


def test_retransmits_match_the_kernels_count(rig: FlowRig, lab) -> None:
    addr = "10.244.7.2"
    srv = listener(addr, ns=lab.ns)
    port = srv.getsockname()[1]
    cli = socket.create_connection((addr, port))
    conn, _ = srv.accept()
    nsx = ("ip", "netns", "exec", lab.ns, "ip", "addr")
    skipped_before = _skipped(rig, "tcp:tcp_retransmit_skb")
    try:
        # Without its address the namespace drops what arrives: no ACK, so the host
        # retransmits (and each retransmit leaves, so the kernel counts it).
        sh(*nsx, "del", f"{addr}/32", "dev", lab.peer_if)
        cli.sendall(b"r" * 1000)
        wait_for(lambda: _ss_total_retrans(addr, port) >= 2, "two retransmits")
        sh(*nsx, "add", f"{addr}/32", "dev", lab.peer_if)
        assert recv_exact(conn, 1000) == 1000
        kernel = _ss_total_retrans(addr, port)
        key = ("egress", "k8sPod", addr, str(port))
        # exact, but for runs the kernel reports it skipped (a timer softirq landing
        # while another BPF program ran on that CPU)
        skipped = _skipped(rig, "tcp:tcp_retransmit_skb") - skipped_before
        assert kernel - skipped <= rig.value("lens_tcp_retransmits_total", *key) <= kernel
    finally:
        cli.close()
        conn.close()
        srv.close()
        subprocess.run([*nsx, "add", f"{addr}/32", "dev", lab.peer_if], capture_output=True)


def test_abnormal_flow_event_from_the_policy_lists(rig: FlowRig, policy_file: Path) -> None:
    text = policy_file.read_text()
    rig.flows.set_policy(
        parse_policy(text + "abnormalBlackList: [127.0.0.74/31]\nabnormalWhiteList: [127.0.0.75]\n")
    )
    sub = rig.bus.subscribe("t-abn", accept=lambda e: e["kind"] == "abnormal_flow")
    try:
        # the whitelisted flow first: an event of its own would come before the other's
        for addr in ("127.0.0.75", "127.0.0.74"):
            srv = listener(addr)
            exchange(srv, addr, 3, 4)
            srv.close()
        events = rig.wait_events(sub, 1)
    finally:
        rig.bus.unsubscribe(sub)
        rig.flows.set_policy(parse_policy(text))
    # the blacklisted remote raises one event; the whitelisted one none
    assert [(e["raddr"], e["direction"]) for e in events] == [("127.0.0.74", "egress")]
    assert events[0]["sent_bytes"] == 3


def test_sweep_leaves_a_dual_stack_listeners_live_ipv4_peers_alone(rig: FlowRig) -> None:
    """The accepted socket of a listener on :: is AF_INET6 with its IPv4 peer as
    ::ffff:a.b.c.d; /proc/net/tcp6 lists it, and the flow's key names it, as a.b.c.d."""
    srv = listener("::")
    port = srv.getsockname()[1]
    cli = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    cli.bind(("127.0.0.86", 0))
    cli.connect(("127.0.0.85", port))
    conn, _ = srv.accept()
    try:
        key = ("ingress", "localhost", "127.0.0.86", str(port))
        assert rig.wait_value(OPENED, *key, want=1) == 1, rig.explain(*key)
        rig.flows.reconcile()
        assert rig.value(CLOSED, *key) == 0
        cli.sendall(b"z" * 5)
        assert recv_exact(conn, 5) == 5
        assert rig.value(RECV, *key) == 5
    finally:
        cli.close()
        conn.close()
        srv.close()
    assert rig.wait_value(CLOSED, *key, want=1) == 1
