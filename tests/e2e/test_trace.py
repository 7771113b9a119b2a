"""`lens-ebpf trace` as a process: known flows and a container exec, exactly."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agentproc import LENS
from tests.containerlab import Containerd, private_containerd
from tests.netlab import exchange, listener

pytestmark = pytest.mark.e2e


def start_trace(*args: str) -> subprocess.Popen:
    p = subprocess.Popen([LENS, "trace", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)  # fmt: skip
    assert p.stderr is not None
    line = p.stderr.readline()  # the ready line, once the programs are attached
    assert "tracing" in line, line + p.stderr.read()
    return p


def finish(p: subprocess.Popen) -> tuple[list[dict], str]:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    return [json.loads(line) for line in out.splitlines() if line.strip()], err


def test_trace_tcp_json_reports_known_flows_exactly() -> None:
    p = start_trace("tcp", "--json", "--duration", "3")
    servers = {addr: listener(addr) for addr in ("127.0.0.94", "127.0.0.95")}
    ports = {a: exchange(s, a, 1111 * (i + 1), 222 * (i + 1))
             for i, (a, s) in enumerate(servers.items())}  # fmt: skip
    for s in servers.values():
        s.close()
    events, err = finish(p)
    for i, (addr, (port, cport)) in enumerate(ports.items()):
        eg = [e for e in events if e["raddr"] == addr and e["direction"] == "egress"]
        assert len(eg) == 1, events
        assert (eg[0]["rport"], eg[0]["lport"]) == (port, cport)
        assert (eg[0]["sent_bytes"], eg[0]["received_bytes"]) == (1111 * (i + 1), 222 * (i + 1))
        assert eg[0]["pid"] == os.getpid() and eg[0]["class"] == "localhost"
        ing = [e for e in events if e["lport"] == port and e["direction"] == "ingress"]
        assert len(ing) == 1 and ing[0]["rport"] == cport
    assert "0 lost" in err


def test_trace_port_filter_is_applied_in_the_kernel() -> None:
    keep, drop = listener("127.0.0.96"), listener("127.0.0.97")
    keep_port = keep.getsockname()[1]
    p = start_trace("tcp", "--json", "--duration", "3", "--port", str(keep_port))
    exchange(keep, "127.0.0.96", 10, 10)
    exchange(drop, "127.0.0.97", 10, 10)
    keep.close()
    drop.close()
    events, err = finish(p)
    assert {e["raddr"] for e in events if e["direction"] == "egress"} == {"127.0.0.96"}
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
    p = start_trace("exec", "--json", "--duration", "4", "--config", str(cfg),
                    "--container", cid)  # fmt: skip
    res = ctd.run(cid, "/bin/sh", "-c", "/bin/echo traced; exit 5",
                  labels={"io.kubernetes.pod.name": "tr-0",
                          "io.kubernetes.pod.namespace": "team-t"})  # fmt: skip
    assert res.returncode == 5
    time.sleep(0.5)
    events, _ = finish(p)
    assert events and all(e["container_id"] == cid for e in events)
    execs = [e["filename"] for e in events if e["kind"] == "process_exec"]
    assert execs == ["/bin/sh", "/bin/echo"]
    sh_exit = next(e for e in events if e["kind"] == "process_exit" and e["comm"] == "sh")
    assert sh_exit["exit_code"] == 5 and sh_exit["pod"] == "tr-0"
    assert sh_exit["namespace"] == "team-t"


def test_sigint_ends_trace_cleanly_with_a_summary() -> None:
    p = start_trace("all")
    time.sleep(0.5)
    p.send_signal(2)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0
    assert "events shown" in err and "lost" in err
