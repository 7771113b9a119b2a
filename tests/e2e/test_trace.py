"""`lens-ebpf trace` as a process: known flows and a container exec, exactly."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containerlab import Containerd, private_containerd
from tests.netlab import exchange, listener
from tests.tracelab import Trace

pytestmark = pytest.mark.e2e


def test_trace_tcp_json_reports_known_flows_exactly() -> None:
    trace = Trace("tcp", "--json")
    servers = {addr: listener(addr) for addr in ("127.0.0.94", "127.0.0.95")}
    ports = {
        a: exchange(s, a, 1111 * (i + 1), 222 * (i + 1)) for i, (a, s) in enumerate(servers.items())
    }
    for s in servers.values():
        s.close()
    sports = {port for port, _ in ports.values()}

    def ends(ev: list[dict]) -> int:  # each flow's two ends (the server's address and
        # port: another process's server on 127.0.0.1 may have the same port number)
        return sum(
            (e["direction"] == "egress" and e["raddr"] in servers)
            or (e["direction"] == "ingress" and e["laddr"] in servers and e["lport"] in sports)
            for e in ev
        )

    trace.until(lambda ev: ends(ev) >= 4, "both ends of both flows")
    events, err = trace.finish()
    for i, (addr, (port, cport)) in enumerate(ports.items()):
        eg = [e for e in events if e["raddr"] == addr and e["direction"] == "egress"]
        assert len(eg) == 1, events
        assert (eg[0]["rport"], eg[0]["lport"]) == (port, cport)
        assert (eg[0]["sent_bytes"], eg[0]["received_bytes"]) == (1111 * (i + 1), 222 * (i + 1))
        assert eg[0]["pid"] == os.getpid() and eg[0]["class"] == "localhost"
        ing = [
            e for e in events if (e["laddr"], e["lport"], e["direction"]) == (addr, port, "ingress")
        ]
        assert len(ing) == 1 and ing[0]["rport"] == cport
    assert "0 lost" in err


def test_trace_port_filter_is_applied_in_the_kernel() -> None:
    keep, drop = listener("127.0.0.96"), listener("127.0.0.97")
    keep_port = keep.getsockname()[1]
    trace = Trace("tcp", "--json", "--port", str(keep_port))
    exchange(drop, "127.0.0.97", 10, 10)
    exchange(keep, "127.0.0.96", 10, 10)
    keep.close()
    drop.close()

    # the kept flow's two ends; had the other flow passed, it would have come before them
    # (another process's flow on 127.0.0.1 with the same port number passes the filter
    # too, rightly: what is checked is that the dropped listener's flow never came)
    def kept(ev: list[dict]) -> list[dict]:
        return [e for e in ev if "127.0.0.96" in (e["raddr"], e["laddr"])]

    trace.until(lambda ev: len(kept(ev)) >= 2, "the kept flow's two ends")
    events, err = trace.finish()
    assert {e["direction"] for e in kept(events)} == {"egress", "ingress"}
    assert not [e for e in events if "127.0.0.97" in (e["raddr"], e["laddr"])]
    assert all(keep_port in (e["lport"], e["rport"]) for e in events)
    # filtered in the kernel: the other flows never reached user space
    received = int(err.split(" received")[0].split()[-1])
    assert received == len(events)


@pytest.fixture
def ctd() -> Iterator[Containerd]:
    yield from private_containerd("t")


def test_trace_exec_sees_a_command_in_a_real_container(ctd: Containerd, tmp_path: Path) -> None:
    cfg = tmp_path / "lens.yaml"
    cfg.write_text(f"containers:\n  containerd_state: {ctd.state}\n")
    cid = "trace" + uuid.uuid4().hex[:8]
    trace = Trace("exec", "--json", "--config", str(cfg), "--container", cid)
    res = ctd.run(
        cid,
        "/bin/sh",
        "-c",
        "/bin/echo traced; exit 5",
        labels={"io.kubernetes.pod.name": "tr-0", "io.kubernetes.pod.namespace": "team-t"},
    )
    assert res.returncode == 5
    # the shell's exit comes after its child's
    trace.until(
        lambda ev: any(e["kind"] == "process_exit" and e["comm"] == "sh" for e in ev),
        "the shell's exit",
    )
    events, _ = trace.finish()
    assert events and all(e["container_id"] == cid for e in events)
    execs = [e["filename"] for e in events if e["kind"] == "process_exec"]
    assert execs == ["/bin/sh", "/bin/echo"]
    sh_exit = next(e for e in events if e["kind"] == "process_exit" and e["comm"] == "sh")
    assert sh_exit["exit_code"] == 5 and sh_exit["pod"] == "tr-0"
    assert sh_exit["namespace"] == "team-t"


def test_sigint_ends_trace_cleanly_with_a_summary() -> None:
    _, err = Trace("all").finish()
    assert "events shown" in err and "lost" in err


def test_trace_drop_shows_each_drop_with_the_kernels_reason() -> None:
    """Datagrams to two closed ports, the trace filtered to one in the kernel: exactly
    that port's drops come out, each named as this kernel names it."""
    import socket

    from lens_ebpf.agent.bpf import btf

    kept, other = 40871, 40872
    trace = Trace("drop", "--json", "--port", str(kept))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for port in (other, kept, other, kept, kept):
            s.sendto(b"x", ("127.0.0.93", port))
    trace.until(lambda ev: len(ev) >= 3, "the kept port's three drops")
    events, err = trace.finish()
    # the port filter passes either end's port: another process's packet dropped with
    # port 40871 at its other end would pass too; the datagrams to 127.0.0.93 are ours
    mine = [e for e in events if e["daddr"] == "127.0.0.93"]
    assert len(mine) == 3, events
    assert all(kept in (e["sport"], e["dport"]) for e in events), events
    has_reasons = btf.running() is not None and btf.running().enum_values("skb_drop_reason")
    for e in mine:
        assert (e["daddr"], e["dport"], e["protocol"], e["direction"]) == (
            "127.0.0.93",
            kept,
            "udp",
            "ingress",
        )
        assert e["reason"] == ("NO_SOCKET" if has_reasons else "__udp4_lib_rcv")
    # filtered in the kernel: the other port's drops never reached user space
    assert int(err.split(" received")[0].split()[-1]) == len(events)
