"""Every network namespace once: a process's, or a bind-mounted one no process is in."""

from __future__ import annotations

from pathlib import Path

from lens_ebpf.agent.net.netns import namespaces


def test_each_namespace_once_from_processes_and_bind_mounts(tmp_path: Path) -> None:
    ns = tmp_path / "nsfs"
    ns.mkdir()
    for name in ("host", "pod", "empty"):
        (ns / name).write_text(name)  # stands in for nsfs inodes
    proc = tmp_path / "proc"
    for pid, target in ((1, "host"), (7, "host"), (42, "pod"), (43, "pod")):
        (proc / str(pid) / "ns").mkdir(parents=True)
        (proc / str(pid) / "ns" / "net").symlink_to(ns / target)
    (proc / "self").mkdir()  # not a pid
    named = tmp_path / "run-netns"
    named.mkdir()
    (named / "cni-1").symlink_to(ns / "pod")  # the pod's, also held by pid 42
    (named / "lab").symlink_to(ns / "empty")  # no process in it
    (named / "stale").symlink_to(ns / "gone")  # a mount whose namespace went away
    got = namespaces(proc, named)
    by_name = {p.resolve().name: p for p in got.values()}
    assert set(by_name) == {"host", "pod", "empty"}
    assert by_name["host"] == proc / "1" / "ns" / "net"  # the lowest pid
    assert by_name["pod"] == proc / "42" / "ns" / "net"
    assert by_name["empty"] == named / "lab"
    assert namespaces(tmp_path / "no-proc", tmp_path / "no-named") == {}
