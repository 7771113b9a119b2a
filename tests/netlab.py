"""Network namespaces joined by veth pairs, standing in for pods and services.

Sockets are created inside a namespace by a short-lived thread that enters it with
setns(2): the namespace applies to that thread only, and a socket keeps its
namespace for life, so the test can use it from any thread afterwards.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from lens_ebpf.agent.net import netns

T = TypeVar("T")


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def in_netns(ns: str | None, fn: Callable[[], T]) -> T:
    """Run fn in a thread that has entered network namespace ns (None: this one)."""
    if ns is None:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            fd = os.open(netns.NAMED / ns, os.O_RDONLY)
            try:
                netns.enter(fd)
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as exc:  # handed back to the caller
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class Lab:
    """One server namespace on a veth pair with extra addresses routed from the host."""

    def __init__(
        self, tag: str, host_v4: str, peer_v4: str, host_v6: str, peer_v6: str, extra: list[str]
    ) -> None:
        self.ns = f"lenst-{tag}"
        self.host_if, self.peer_if = f"lt{tag}a", f"lt{tag}b"
        self.host_v4, self.peer_v4 = host_v4, peer_v4
        self.host_v6, self.peer_v6 = host_v6, peer_v6
        self.extra = extra

    def up(self) -> Lab:
        """Build the lab; a failed build leaves nothing behind."""
        self.down()
        reap_stale_labs()
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        for addr in self.extra:
            held = subprocess.run(
                ["ip", "-o", "route", "show", f"{addr}/32"], capture_output=True, text=True
            ).stdout.strip()
            if held:
                raise RuntimeError(
                    f"route {held!r} already exists: another test run on this host holds the "
                    "lab's addresses (tests that count traffic cannot share a host)"
                )
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.peer_if)
        sh("ip", "link", "set", self.peer_if, "netns", self.ns)
        sh("ip", "addr", "add", f"{self.host_v4}/24", "dev", self.host_if)
        sh("ip", "-6", "addr", "add", f"{self.host_v6}/64", "dev", self.host_if, "nodad")
        sh("ip", "link", "set", self.host_if, "up")
        nsx = ("ip", "netns", "exec", self.ns)
        sh(*nsx, "ip", "addr", "add", f"{self.peer_v4}/24", "dev", self.peer_if)
        sh(*nsx, "ip", "-6", "addr", "add", f"{self.peer_v6}/64", "dev", self.peer_if, "nodad")
        for addr in self.extra:
            sh(*nsx, "ip", "addr", "add", f"{addr}/32", "dev", self.peer_if)
        sh(*nsx, "ip", "link", "set", self.peer_if, "up")
        sh(*nsx, "ip", "link", "set", "lo", "up")
        sh(*nsx, "ip", "route", "add", "default", "via", self.host_v4)
        for addr in self.extra:
            sh("ip", "route", "add", f"{addr}/32", "via", self.peer_v4, "dev", self.host_if)

    def down(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


def _alive(pid: int) -> bool:
    """Is pid a live test run (a reused pid that is something else does not count)?"""
    try:
        return b"pytest" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def reap_stale_labs() -> list[str]:
    """Remove labs (veth `lt<pid>a`, namespace `lenst-<pid>`) whose test run is gone.

    A run killed before its teardown (SIGKILL, a CI timeout) leaves its veth, its
    namespace and the routes to the lab's addresses; the next run's routes would collide.
    """
    gone: list[str] = []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for m in re.finditer(r"^\d+: lt(\d+)a[@:]", links, re.M):
        if not _alive(int(m.group(1))):
            subprocess.run(["ip", "link", "del", f"lt{m.group(1)}a"], capture_output=True)
            gone.append(f"lt{m.group(1)}a")
    netns = Path("/run/netns")
    names = [p.name for p in netns.iterdir()] if netns.is_dir() else []
    for name in names:
        m = re.fullmatch(r"lenst-(\d+)", name)
        if m and not _alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            gone.append(name)
    return gone


def listener(addr: str, ns: str | None = None, backlog: int = 4096) -> socket.socket:
    """A listening TCP socket on addr (port chosen by the kernel), inside ns."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET

    def make() -> socket.socket:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, 0))
        s.listen(backlog)
        return s

    return in_netns(ns, make)


def recv_exact(conn: socket.socket, n: int) -> int:
    got = 0
    while got < n:
        chunk = conn.recv(min(65536, n - got))
        if not chunk:
            break
        got += len(chunk)
    return got


def exchange(
    srv: socket.socket,
    addr: str,
    send_n: int,
    reply_n: int,
    ns: str | None = None,
    bind: str | None = None,
) -> tuple[int, int]:
    """Client (in ns) sends send_n bytes, the server replies reply_n, both close.

    Returns (server port, client port).
    """
    port = srv.getsockname()[1]
    done: dict[str, int] = {}

    def serve() -> None:
        conn, _ = srv.accept()
        done["server_got"] = recv_exact(conn, send_n)
        conn.sendall(b"y" * reply_n)
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    cli = in_netns(ns, lambda: socket.socket(family, socket.SOCK_STREAM))
    if bind:
        cli.bind((bind, 0))
    cli.connect((addr, port))
    cport = cli.getsockname()[1]
    cli.sendall(b"x" * send_n)
    got = recv_exact(cli, reply_n)
    cli.close()
    t.join(timeout=10)
    assert done.get("server_got") == send_n and got == reply_n
    return port, cport
