import argparse
import re

import pytest

from lens_ebpf import cli
from lens_ebpf.agent import tracefs
from lens_ebpf.agent.bpf import btf
from lens_ebpf.agent.trace import event_filter
from lens_ebpf.agent.trace_format import format_flow, format_proc
from tests.golden import check_golden

FLOWS = [
    {
        "kind": "flow_closed",
        "ts_ns": 5_000_000_000,
        "pid": 4242,
        "comm": "curl",
        "direction": "egress",
        "class": "externalHosts",
        "raddr": "93.184.216.34",
        "rport": 443,
        "lport": 51234,
        "sent_bytes": 517,
        "received_bytes": 1_398_101,
        "duration_ns": 45_300_000,
    },
    {
        "kind": "flow_closed",
        "ts_ns": 6_000_000_000,
        "pid": 77,
        "comm": "nginx-worker-long",
        "direction": "ingress",
        "class": "k8sPod",
        "raddr": "10.244.3.17",
        "rport": 40112,
        "lport": 8080,
        "sent_bytes": 2048,
        "received_bytes": 310,
        "duration_ns": 1_200_000,
    },
    {
        "kind": "flow_closed",
        "ts_ns": 7_000_000_000,
        "pid": 9,
        "comm": "python3",
        "direction": "egress",
        "class": "internalHosts",
        "raddr": "fd00:1234:5678:9abc:def0:1234:5678:9abc",
        "rport": 5432,
        "lport": 40000,
        "sent_bytes": 12,
        "received_bytes": 0,
        "duration_ns": 2_000_000_000_000,
    },
]


def test_human_table_layout_is_golden_and_fits_80_columns() -> None:
    from lens_ebpf.agent.trace_format import TCP_HEADER

    lines = [TCP_HEADER] + [format_flow(e, boot_offset=0.0) for e in FLOWS]
    assert all(len(line) <= 80 for line in lines)
    import time

    # times render in the machine's zone; compare the rest of each line
    text = "\n".join(line[9:] for line in lines) + "\n"
    check_golden("trace_tcp.txt", text)
    assert time.strftime("%H:%M:%S", time.localtime(5)) == lines[1][:8]


def test_exec_lines_fit() -> None:
    ev = {
        "kind": "process_exit",
        "ts_ns": 0,
        "pid": 1,
        "ppid": 0,
        "comm": "sh",
        "exit_code": -1,
        "signal": 9,
        "filename": "x" * 200,
    }
    line = format_proc(ev, 0.0)
    assert len(line) <= 80 and " sig9 " in line


def ns(**kw) -> argparse.Namespace:
    base = dict(comm=None, cls=None, container=None, namespace=None, pod=None)
    return argparse.Namespace(**{**base, **kw})


def test_user_space_filters() -> None:
    ev = {
        "comm": "curl",
        "class": "k8sPod",
        "container": "app",
        "container_id": "abc123",
        "namespace": "team-a",
        "pod": "web-0",
    }
    assert event_filter(ns(comm="curl", pod="web-0", container="abc"))(ev)
    assert not event_filter(ns(cls="dns"))(ev)
    assert not event_filter(ns(namespace="team-b"))(ev)


@pytest.mark.usefixtures("tracefs_readable")
def test_missing_tracepoint_is_one_line_and_exit_2(monkeypatch, capsys) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr(tracefs, "ensure_mounted", lambda *a: "/sys/kernel/tracing")
    monkeypatch.setattr(tracefs, "tracepoint_exists", lambda tp, events=None: tp != "tcp:tcp_probe")
    # and no BTF, whose srtt_us would sample RTT without tcp_probe
    monkeypatch.setattr(btf, "running", lambda *a: None)
    assert cli.main(["trace", "rtt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "lens-ebpf: error: trace: rtt: no btf: BTF (/sys/kernel/btf/vmlinux absent or "
        "unreadable) missing; no tracepoint: tcp:tcp_probe missing"
    ]


@pytest.mark.usefixtures("tracefs_readable")
def test_no_byte_probe_point_is_one_line_and_exit_2(monkeypatch, capsys) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr(tracefs, "ensure_mounted", lambda *a: "/sys/kernel/tracing")
    monkeypatch.setattr(tracefs, "tracepoint_exists", lambda tp, events=None: "length" not in tp)
    monkeypatch.setattr(tracefs, "kprobes_available", lambda *a: False)
    monkeypatch.setattr(btf, "running", lambda: None)  # no BTF: no counters path either
    assert cli.main(["trace", "tcp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "lens-ebpf: error: trace: tcp_flows: bytes: no iter: BTF (/sys/kernel/btf/vmlinux "
        "absent or unreadable) missing; no raw_tracepoint or tracepoint: "
        "sock:sock_send_length, sock:sock_recv_length missing; no kprobe: kprobes (kernel "
        "built without them) missing"
    ]


@pytest.mark.parametrize("what", ["tcp", "exec"])
def test_non_root_is_one_line_and_exit_2(monkeypatch, capsys, what: str) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert cli.main(["trace", what]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs root" in err[0]


@pytest.mark.usefixtures("tracefs_readable")
def test_ebpf_prints_source_and_cflags(capsys) -> None:
    assert cli.main(["trace", "all", "--ebpf"]) == 0
    out = capsys.readouterr().out
    assert "TRACEPOINT_PROBE(sock, inet_sock_set_state)" in out
    assert "TRACEPOINT_PROBE(sched, sched_process_exec)" in out
    assert re.search(r"-DLENS_RTT(_SAMPLED)?=1", out) and "-DMAX_PROCS=65536" in out


def test_trace_all_is_one_table_with_a_kind_column() -> None:
    from lens_ebpf.agent.trace_format import ALL_HEADER, format_any

    proc = {
        "kind": "process_exit",
        "ts_ns": 0,
        "pid": 31,
        "ppid": 1,
        "comm": "sh",
        "exit_code": 3,
        "signal": 0,
    }
    lines = [ALL_HEADER, *(format_any(e, 0.0) for e in [*FLOWS, proc])]
    assert all(len(line) <= 80 for line in lines)
    assert [line.split()[1] for line in lines] == ["EVENT", "flow", "flow", "flow", "exit"]
    # direction, class, remote, bytes sent/received, duration
    assert lines[1].split()[4:] == ["out", "external", "93.184.216.34:443", "517/1.3M", "45ms"]
    assert lines[4].endswith("ppid 1 ret 3")
