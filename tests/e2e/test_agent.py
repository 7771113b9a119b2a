"""The agent as a process: serves, reports, refuses bad input, reloads, stops cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest

from lens_ebpf.agent import check, tracefs
from lens_ebpf.agent.bpf import btf
from lens_ebpf.agent.check import SPECS
from tests.agentproc import AgentProc, free_port, run_cli
from tests.conftest import EMULATED, wait_for
from tests.netlab import exchange, listener

pytestmark = pytest.mark.e2e

GOOD = "localhost: [127.0.0.0/8]\ninternalHosts: [10.0.0.0/8]\n"


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    p = tmp_path / "policy.yaml"
    p.write_text(GOOD)
    return p


def bytes_paths() -> tuple[str, str]:
    """(tcp_flows' feature path, its bytes need's path) on this kernel."""
    kernel_btf = btf.running()
    if kernel_btf is not None and kernel_btf.struct_id("bpf_tcp_iter_state") is not None:
        return "tracepoint", "iter"  # the socket's counters: no program per message
    if not tracefs.tracepoint_exists("sock:sock_send_length"):
        return "kprobe", "kprobe"
    return "tracepoint", "raw_tracepoint" if kernel_btf is not None else "tracepoint"


def lifecycle_path() -> str:
    """tcp_flows' lifecycle path on this kernel: BTF-typed where BTF types the tracepoint."""
    kernel_btf = btf.running()
    if kernel_btf is not None and kernel_btf.trace_typedef("inet_sock_set_state") is not None:
        return "tp_btf"
    return "tracepoint"


def test_serves_metrics_counts_a_flow_and_stops_cleanly(policy: Path) -> None:
    agent = AgentProc("--policy", str(policy))
    try:
        agent.wait_ready()  # how long start-up takes is bench's figure, not a test's
        status, ready = agent.json("/readyz")
        assert status == 200 and ready["ready"] is True
        # the bytes path this kernel has: the socket's counters where BTF and a locking
        # TCP iterator are (5.15+), else sock_send_length from 6.3 (raw where the kernel
        # has BTF), kprobes before; the feature's path is tracepoint but for kprobes
        path, bytes_path = bytes_paths()
        flows = ready["features"]["tcp_flows"]
        assert (flows["state"], flows["reason"], flows["path"]) == ("attached", "", path)
        assert flows["paths"]["bytes"] == bytes_path
        assert flows["paths"]["lifecycle"] == lifecycle_path()
        for feature in ("tcp_rtt", "processes"):
            got = ready["features"][feature]
            assert (got["state"], got["path"]) == ("attached", "tracepoint"), got
        up = {"feature": "tcp_flows", "path": path}
        assert agent.sample("lens_agent_feature_up", up) == 1
        assert ready["policy"]["path"] == str(policy)
        for alias in ("/ready", "/health", "/healthz"):
            assert agent.json(alias)[0] == 200
        assert agent.sample("lens_agent_bpf_program_attached", {"program": "tcp_flows"}) == 1
        srv = listener("127.0.0.71")
        port, _ = exchange(srv, "127.0.0.71", 300, 700)
        srv.close()
        labels = {
            "direction": "egress",
            "type": "localhost",
            "raddr": "127.0.0.71",
            "port": str(port),
        }
        # each value waits for its own read cycle: one can land between connect and send
        assert agent.wait_sample("lens_tcp_connections_opened_total", labels, 1) == 1
        assert agent.wait_sample("lens_tcp_sent_bytes_total", labels, 300) == 300
        seed = {
            "raddr": "127.0.0.71",
            "rport": str(port),
            "direction": "egress",
            "type": "localhost",
        }
        assert agent.wait_sample("primus_lens_network_tcp_flow_egress", seed, 1000) == 1000
    finally:
        rc = agent.stop()
    assert rc == 0, agent.output()
    assert "all BPF programs detached" in agent.output()


def test_sigint_also_exits_zero(policy: Path) -> None:
    agent = AgentProc("--policy", str(policy))
    agent.wait_ready()
    assert agent.stop(signal.SIGINT) == 0


def test_check_json_reports_tracepoints_and_kprobes() -> None:
    res = run_cli("check", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    if os.environ.get("KMATRIX_OUT"):  # in a matrix guest: the host checks it too
        Path(os.environ["KMATRIX_OUT"], "check.json").write_text(res.stdout)
    for spec in SPECS:  # every tracepoint a spec may use, present or not on this kernel
        for tp in spec.all_tracepoints():
            assert out["tracepoints"][tp] is tracefs.tracepoint_exists(tp), tp
    assert out["checks"]["kprobes"]["ok"] is tracefs.kprobes_available()
    assert out["checks"]["btf"]["ok"] is Path("/sys/kernel/btf/vmlinux").exists()
    assert out["checks"]["kernel_headers"]["ok"] is True
    for feature in ("tcp_flows", "tcp_rtt", "processes"):
        assert out["features"][feature]["supported"] is True, out["features"][feature]
    assert out["features"]["tcp_flows"]["paths"]["bytes"] == bytes_paths()[1]
    # the table for people, with this kernel's reasons; as a process on the host only (a
    # guest starts Python slowly)
    tables = [check.format_table(out)]
    if not EMULATED:
        table = run_cli("check")
        assert table.returncode == 0
        tables.append(table.stdout)
    for text in tables:
        assert all(len(line) <= 80 for line in text.splitlines())
        assert "sock:inet_sock_set_state" in text


def one_line_error(res, *needles: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_unknown_config_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("server:\n  prot: 9\n")
    one_line_error(run_cli("run", "--config", str(cfg)), str(cfg), "server.prot", "unknown key")


def test_wrong_type(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("cache:\n  max_series: lots\n")
    one_line_error(run_cli("run", "--config", str(cfg)), "cache.max_series", "integer")


def test_bad_env_value() -> None:
    one_line_error(run_cli("run", env={"LENS_BPF__MAX_SOCKETS": "-1"}), "bpf.max_sockets")


def test_port_in_use(policy: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = run_cli("run", "--policy", str(policy), "--listen", f"127.0.0.1:{port}")
    one_line_error(res, f"cannot listen on 127.0.0.1:{port}", "Address already in use")


def test_unreadable_policy(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    one_line_error(
        run_cli("run", "--policy", str(missing), "--listen", f"127.0.0.1:{free_port()}"),
        str(missing),
        "cannot read",
    )


def test_bad_cidr_at_start_names_file_key_value(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("k8sPod: [10.244.0.0/16, 10.300.0.0/16]\n")
    one_line_error(
        run_cli("run", "--policy", str(bad), "--listen", f"127.0.0.1:{free_port()}"),
        str(bad),
        "k8sPod",
        "10.300.0.0/16",
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty; write {} for a policy with no classes"),
        (
            "internalHosts:\n" + "".join(f"  - 10.{i >> 8}.{i & 255}.0/24\n" for i in range(5000)),
            "5000 class prefixes; at most 4096",
        ),
    ],
)
def test_empty_or_oversized_policy_at_start_is_one_line(
    tmp_path: Path, text: str, needle: str
) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text(text)
    res = run_cli("run", "--policy", str(bad), "--listen", f"127.0.0.1:{free_port()}")
    one_line_error(res, str(bad), needle)


def test_bad_listen_flag() -> None:
    one_line_error(run_cli("run", "--listen", "localhost"), "--listen", "HOST:PORT")


def test_bad_policy_at_reload_keeps_the_last_good_one(policy: Path) -> None:
    agent = AgentProc("--policy", str(policy))
    try:
        agent.wait_ready()
        policy.write_text("internalHosts: [10.0.0.0/8, 127.0.0.0/33]\n")
        wait_for(lambda: agent.json("/readyz")[1]["policy"]["error"], "the reload's error")
        status, ready = agent.json("/readyz")
        assert status == 200
        assert "internalHosts" in ready["policy"]["error"]
        assert "127.0.0.0/33" in ready["policy"]["error"]
        assert agent.sample("lens_agent_policy_error") == 1
        assert agent.sample("lens_agent_policy_reloads_total", {"result": "failure"}) >= 1
        # flows are still classified by the last good policy
        srv = listener("127.0.0.72")
        port, _ = exchange(srv, "127.0.0.72", 1, 1)
        srv.close()
        labels = {
            "direction": "egress",
            "type": "localhost",
            "raddr": "127.0.0.72",
            "port": str(port),
        }
        assert agent.wait_sample("lens_tcp_connections_opened_total", labels, 1) == 1
        # a fixed file is taken on SIGHUP or on change; the error clears
        policy.write_text("internalHosts: [127.0.0.0/8]\n")
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: not agent.json("/readyz")[1]["policy"]["error"], "the error cleared")
        assert agent.json("/readyz")[1]["policy"]["error"] == ""
        assert agent.sample("lens_agent_policy_error") == 0
        srv = listener("127.0.0.72")
        port, _ = exchange(srv, "127.0.0.72", 1, 1)
        srv.close()
        labels = {
            "direction": "egress",
            "type": "internalHosts",
            "raddr": "127.0.0.72",
            "port": str(port),
        }
        assert agent.wait_sample("lens_tcp_connections_opened_total", labels, 1) == 1
    finally:
        assert agent.stop() == 0


def test_collector_can_be_switched_off(policy: Path) -> None:
    agent = AgentProc("--policy", str(policy), "--no-collector.tcp")
    try:
        agent.wait_ready()
        feat = agent.json("/readyz")[1]["features"]["tcp_flows"]
        assert feat == {"state": "off", "reason": "disabled by config"}
        assert agent.sample("lens_agent_feature_up", {"feature": "tcp_flows"}) == 0
    finally:
        assert agent.stop() == 0
