from pathlib import Path

from lens_ebpf.agent.net.proc_tcp import live_sockets, parse_proc_net_tcp, tcp_in_use

FIX = Path(__file__).parent.parent / "fixtures" / "proc"


def test_ipv4_lines_skip_listen_and_time_wait() -> None:
    got = parse_proc_net_tcp((FIX / "net_tcp.txt").read_text())
    assert got == {
        ("127.0.0.1", 41668, "127.0.0.1", 8080),
        ("192.168.77.2", 22, "192.168.77.1", 54321),
    }


def test_ipv6_lines_and_v4_mapped() -> None:
    got = parse_proc_net_tcp((FIX / "net_tcp6.txt").read_text())
    assert got == {
        ("::1", 8080, "::1", 50000),
        ("fdfd::1", 80, "fdfd::2", 40000),
        ("127.0.0.1", 80, "127.0.0.2", 40001),
    }


def test_garbage_lines_are_skipped() -> None:
    assert parse_proc_net_tcp("header\n 0: zz:zz yy:yy 01\nshort\n") == set()


def test_live_sockets_reads_each_namespace_once(tmp_path: Path) -> None:
    for pid, ns in ((10, "net:[1]"), (11, "net:[1]"), (12, "net:[2]")):
        d = tmp_path / str(pid)
        (d / "ns").mkdir(parents=True)
        (d / "ns" / "net").symlink_to(ns)
        (d / "net").mkdir()
    (tmp_path / "10" / "net" / "tcp").write_text((FIX / "net_tcp.txt").read_text())
    (tmp_path / "11" / "net" / "tcp").write_text("header\n")  # same namespace: not read
    (tmp_path / "12" / "net" / "tcp6").write_text((FIX / "net_tcp6.txt").read_text())
    (tmp_path / "self").mkdir()
    got = live_sockets(tmp_path)
    assert ("127.0.0.1", 41668, "127.0.0.1", 8080) in got
    assert ("fdfd::1", 80, "fdfd::2", 40000) in got
    assert len(got) == 5


SOCKSTAT = """sockets: used 8
TCP: inuse 3 orphan 0 tw 5 alloc 9 mem 115
UDP: inuse 0 mem 0
UDPLITE: inuse 0
RAW: inuse 0
FRAG: inuse 0 memory 0
"""
SOCKSTAT6 = """TCP6: inuse 2
UDP6: inuse 0
UDPLITE6: inuse 0
RAW6: inuse 0
FRAG6: inuse 0 memory 0
"""


def test_tcp_in_use_adds_both_families_and_says_none_when_unreadable(tmp_path: Path) -> None:
    (tmp_path / "sockstat").write_text(SOCKSTAT)
    assert tcp_in_use(tmp_path) == 3  # no sockstat6: a kernel without IPv6
    (tmp_path / "sockstat6").write_text(SOCKSTAT6)
    assert tcp_in_use(tmp_path) == 5  # TIME_WAIT (tw) is not a socket to walk
    (tmp_path / "sockstat6").write_text("TCP6: inuse lots\n")
    assert tcp_in_use(tmp_path) is None
    (tmp_path / "sockstat6").write_text("UDP6: inuse 0\n")
    assert tcp_in_use(tmp_path) is None
    assert tcp_in_use(tmp_path / "missing") is None
