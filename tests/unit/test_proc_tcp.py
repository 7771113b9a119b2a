from pathlib import Path

from lens_ebpf.agent.net.proc_tcp import live_sockets, parse_proc_net_tcp

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
