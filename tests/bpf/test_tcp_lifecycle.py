"""The two ways tcp_flows attaches its lifecycle program give the same numbers.

Where the kernel's BTF allows, inet_sock_set_state runs BTF-typed (tp_btf: no trace
record, the socket's fields read with plain loads); elsewhere, or when that fails to load,
the classic tracepoint. The session's rig takes the first; here a second instance takes
the classic one, both attached at once, and every count and closed-flow record of the
same connections must agree, exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from lens_ebpf.agent import config
from lens_ebpf.agent.bpf.loader import BpfLoader, plan_for
from lens_ebpf.agent.bpf.spec import BTF_TRACEPOINT, TRACEPOINT, Kernel
from lens_ebpf.agent.events import EventBus, Subscription
from lens_ebpf.agent.metrics.cache import MetricCache
from lens_ebpf.agent.net.policy import load_policy
from lens_ebpf.agent.tcp.tcp_flows import SPEC, TcpFlows
from tests.conftest import EMULATED, hang_guard
from tests.netlab import exchange, listener, recv_exact

from .conftest import FlowRig, polling
from .test_tcp_flows import CLOSED, FAILED, OPENED, RECV, RESETS, SENT

# what a closed-flow record says of its flow: everything but when and how long
TIMELESS = (
    "family",
    "laddr",
    "raddr",
    "lport",
    "rport",
    "direction",
    "cls",
    "reason",
    "sent_bytes",
    "received_bytes",
    "retransmits",
    "pid",
    "comm",
    "cgroup_id",
)


@pytest.fixture(scope="module")
def classic(rig: FlowRig, policy_file: Path) -> Iterator[FlowRig]:
    if planned_lifecycle() != BTF_TRACEPOINT:
        pytest.skip("the classic tracepoint is this kernel's only lifecycle path: the rig runs it")
    kernel = dataclasses.replace(Kernel.running((SPEC,)), btf_tracepoints=False)
    cfg = config.load(None, env={"LENS_BPF__RECONCILE_GRACE_SECONDS": "0"})
    cache, bus, loader = MetricCache(3600, 200000), EventBus(100000), BpfLoader()
    flows = TcpFlows(cfg.bpf, cfg.events, cache, bus, loader, kernel=kernel)
    assert flows.start(load_policy(policy_file)), loader.status
    assert flows.plan.paths()["lifecycle"] == TRACEPOINT
    with polling(flows, loader):
        yield FlowRig(flows, cache, bus, rig.early)


def planned_lifecycle() -> str:
    """The lifecycle path the running kernel's description chooses, before any load."""
    return plan_for(SPEC, (), Kernel.running((SPEC,))).paths()["lifecycle"]


def test_the_rig_attaches_its_lifecycle_btf_typed_where_btf_allows(rig: FlowRig) -> None:
    st = rig.flows.loader.status["tcp_flows"]
    # what the kernel describes is what loaded: a refusal here would fail, not fall back
    assert st.paths["lifecycle"] == planned_lifecycle()
    if st.paths["lifecycle"] == BTF_TRACEPOINT:
        assert st.btf_tracepoints == ("sock:inet_sock_set_state",)
        assert "sock:inet_sock_set_state" not in st.tracepoints
        assert "tp_btf:inet_sock_set_state" in {p for _, p, _ in rig.flows.loader.probes()}
    else:  # a kernel without BTF, or one whose verifier refused it: the classic tracepoint
        assert st.tracepoints[0] == "sock:inet_sock_set_state" and st.btf_tracepoints == ()


def _records(rigs: list[FlowRig], subs: list[Subscription], want: int) -> list[list[tuple]]:
    out = []
    for r, sub in zip(rigs, subs, strict=True):
        events = r.wait_events(sub, want)
        out.append(sorted(tuple(e.get(k) for k in TIMELESS) for e in events))
    return out


def test_both_attachments_count_the_same_connections_exactly(
    rig: FlowRig, classic: FlowRig
) -> None:
    rigs = [rig, classic]
    ports: dict[str, int] = {}
    # the listeners' (address, port): each flow's remote (egress) or local end (ingress).
    # Both programs see the whole host, whose other processes (make test's other worker)
    # have servers of their own on 127.0.0.1 and may have these port numbers there: the
    # IPv4 clients take source addresses of their own (the accepted sides' remotes)
    mine: set[tuple[str, int]] = set()

    def accept(e: dict) -> bool:
        return (e.get("raddr"), e.get("rport")) in mine or (e.get("laddr"), e.get("lport")) in mine

    subs = [r.bus.subscribe(f"t-lifecycle-{i}", accept=accept) for i, r in enumerate(rigs)]
    try:
        # an exchange each way, IPv4 and IPv6
        srv4 = listener("127.0.0.95")
        ports["v4"] = srv4.getsockname()[1]
        # ::1 is every process's: a port no earlier flow to it had (the rig's counters
        # live for the session; the classic program's began after them)
        for _ in range(20):
            srv6 = listener("::1")
            ports["v6"] = srv6.getsockname()[1]
            if all(
                rig.value(OPENED, d, "localhost", "::1", str(ports["v6"])) == 0
                for d in ("egress", "ingress")
            ):
                break
            srv6.close()
        mine.update({("127.0.0.95", ports["v4"]), ("::1", ports["v6"])})
        with srv4, srv6:
            exchange(srv4, "127.0.0.95", 7000, 5000, bind="127.0.9.95")
            exchange(srv6, "::1", 3000, 1000)
        # a refused connect: a port that was free a moment ago
        probe = socket.socket()
        probe.bind(("127.0.0.96", 0))
        ports["refused"] = probe.getsockname()[1]
        mine.add(("127.0.0.96", ports["refused"]))
        probe.close()
        cli = socket.socket()
        with pytest.raises(ConnectionRefusedError):
            cli.connect(("127.0.0.96", ports["refused"]))
        cli.close()
        # an abortive close (SO_LINGER 0) after 2,000 bytes the server read
        srv = listener("127.0.0.97")
        ports["abort"] = srv.getsockname()[1]
        mine.add(("127.0.0.97", ports["abort"]))
        with (
            srv,
            socket.create_connection(
                ("127.0.0.97", ports["abort"]), source_address=("127.0.9.97", 0)
            ) as cli,
        ):
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(hang_guard(10))
                cli.sendall(b"a" * 2000)
                assert recv_exact(conn, 2000) == 2000
                cli.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                cli.close()
                with contextlib.suppress(ConnectionResetError):
                    conn.recv(10)
        # 2 flows each for the exchanges and the abortive close, 1 for the refused connect
        records = _records(rigs, subs, 7)
    finally:
        for r, sub in zip(rigs, subs, strict=True):
            r.bus.unsubscribe(sub)
    assert records[0] == records[1]
    v4 = ("egress", "localhost", "127.0.0.95", str(ports["v4"]))
    v6 = ("egress", "localhost", "::1", str(ports["v6"]))
    refused = ("egress", "localhost", "127.0.0.96", str(ports["refused"]))
    abort = ("egress", "localhost", "127.0.0.97", str(ports["abort"]))
    want = {
        (SENT, v4): 7000,
        (RECV, v4): 5000,
        (OPENED, v4): 1,
        (CLOSED, v4): 1,
        (SENT, v6): 3000,
        (RECV, v6): 1000,
        (OPENED, v6): 1,
        (CLOSED, v6): 1,
        (FAILED, refused): 1,
        (OPENED, refused): 0,
        (SENT, abort): 2000,
        (CLOSED, abort): 1,
    }
    for r in rigs:
        for (name, key), n in want.items():
            assert r.wait_value(name, *key, want=n) == n, r.explain(*key)
        assert r.value(RESETS, *refused, "received") == 1
        assert r.value(RESETS, *abort, "sent") == 1
    # every series of these flows, ingress included, the same in both: an address of
    # this test's and a port of its listeners' (the remote's, or the accepted side's)
    addrs = {a for a, _ in mine} | {"127.0.9.95", "127.0.9.97"}
    labels = {str(p) for _, p in mine}

    def ours(k: tuple) -> bool:
        return bool(labels & set(k)) and bool(addrs & set(k))

    for name in (SENT, RECV, OPENED, CLOSED, FAILED, RESETS):
        got = [{k: v for k, v in r.cache.snapshot_family(name) if ours(k)} for r in rigs]
        assert got[0] == got[1], name


def test_the_kernel_refuses_a_bad_btf_typed_program_in_its_verifiers_words() -> None:
    """The refusal the agent reads (below): the kernel's errno and its verifier's words."""
    from lens_ebpf.agent.bpf.btf import running
    from lens_ebpf.agent.bpf.syscall import load_btf_tracepoint

    kernel_btf = running()
    if planned_lifecycle() != BTF_TRACEPOINT or kernel_btf is None:
        pytest.skip("no BTF-typed lifecycle on this kernel")
    # the kernel's own refusal: a load from past the three arguments it passes, and no
    # return value (r1 = *(u64 *)(r1 + 256); exit)
    bad = bytes.fromhex("7911000100000000" "9500000000000000")
    type_id = kernel_btf.trace_typedef("inet_sock_set_state")
    assert type_id is not None
    with pytest.raises(OSError) as refused:
        load_btf_tracepoint(bad, b"GPL", type_id, "refused")
    why = str(refused.value)
    assert refused.value.errno in (errno.EACCES, errno.EINVAL) and ": " in why, why


# the agent's choice is user space; the classic program on each kernel of the matrix is
# the `classic` rig's (test_both_attachments_count_the_same_connections_exactly)
@pytest.mark.skipif(EMULATED, reason="the agent's fallback is user space: host only")
def test_a_refused_btf_typed_program_leaves_the_agent_on_the_classic_tracepoint(
    policy_file: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A BTF-typed program the kernel refuses (the verifier's words in the error, as the
    test above has them) and one that fails to load at all both leave the agent on the
    classic tracepoint."""
    from lens_ebpf.agent.bpf import loader as loader_mod

    if planned_lifecycle() != BTF_TRACEPOINT:
        pytest.skip("no BTF-typed lifecycle on this kernel")

    def refuse(*_: object) -> int:
        raise OSError(13, "Permission denied: R1 invalid mem access 'scalar'")

    monkeypatch.setattr(loader_mod, "load_btf_tracepoint", refuse)
    cfg = config.load(None)
    loader = BpfLoader()
    flows = TcpFlows(cfg.bpf, cfg.events, MetricCache(3600, 1000), EventBus(100), loader)
    assert flows.plan.paths()["lifecycle"] == BTF_TRACEPOINT
    bytes_path = flows.plan.paths()["bytes"]
    try:
        with caplog.at_level("WARNING"):
            assert flows.start(load_policy(policy_file))
        st = loader.status["tcp_flows"]
        assert st.state == "attached" and st.paths["lifecycle"] == TRACEPOINT
        assert st.tracepoints[0] == "sock:inet_sock_set_state" and st.btf_tracepoints == ()
        assert "the BTF-typed lifecycle failed to load" in caplog.text
        assert "invalid mem access" in caplog.text
        assert st.paths["bytes"] == bytes_path  # the lifecycle alone went back
    finally:
        loader.close()


def test_an_iterator_that_fails_to_load_leaves_the_btf_typed_lifecycle_alone(
    policy_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first failure is blamed on what it names: the counters path goes, the
    BTF-typed lifecycle stays."""
    from lens_ebpf.agent.bpf import loader as loader_mod

    if planned_lifecycle() != BTF_TRACEPOINT:
        pytest.skip("no BTF-typed lifecycle on this kernel")
    cfg = config.load(None)
    loader = BpfLoader()
    flows = TcpFlows(cfg.bpf, cfg.events, MetricCache(3600, 1000), EventBus(100), loader)
    if not flows.plan.iterators():
        pytest.skip("no TCP socket iterator on this kernel: bytes take a per-message path")

    class Refused:
        def __init__(self, *_: object) -> None:
            raise RuntimeError("cannot link the tcp iterator: Operation not supported")

    monkeypatch.setattr(loader_mod, "BpfIterator", Refused)
    try:
        assert flows.start(load_policy(policy_file))
        st = loader.status["tcp_flows"]
        assert st.paths["lifecycle"] == BTF_TRACEPOINT and st.paths["bytes"] != "iter"
        assert "cannot link the tcp iterator" in flows.plan.choices["bytes"].reason
    finally:
        loader.close()
