"""Listen-queue overflows and SYN drops, per listening pod and port.

A SYN or handshake-completing ACK that finds its listener's accept queue full is not an
skb:kfree_skb drop with a reason on every kernel (6.1 and 6.18 free such a SYN as
consumed), so these come from the kernel's own counters instead, in each network
namespace (each pod has its own):

- ListenOverflows and ListenDrops, the namespace's TcpExt counters as `nstat` reports
  them (/proc/<task>/net/netstat);
- per listening socket, its sk_drops, which tcp_listendrop() raises with each ListenDrop,
  and its accept queue (length and limit), through sock_diag (NETLINK_INET_DIAG, the
  `ss -tlm` query): no BPF program, so every kernel has them.

A namespace is attributed to the pod holding one of its local addresses (the cluster
index); a listener bound to one address, to that address's pod. Counts start from what
the agent first saw (a listener's or a namespace's first sight is its baseline).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

NETLINK_INET_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_LISTEN = 10
INET_DIAG_SKMEMINFO = 7
SK_MEMINFO_DROPS = 8
_NLMSG = struct.Struct("=IHHII")
_REQ = struct.Struct("=BBBxI48s")  # inet_diag_req_v2, its sockid zero (every socket)
_MSG = struct.Struct("=BBBB2s2s16s16sIQIIIII")  # inet_diag_msg
_RTA = struct.Struct("=HH")


@dataclass(frozen=True)
class Listener:
    family: int  # socket.AF_INET or AF_INET6
    addr: str  # "" for a wildcard (0.0.0.0, ::)
    port: int
    queued: int  # connections waiting for accept()
    limit: int  # the accept queue's limit (listen()'s backlog, capped by somaxconn)
    drops: int  # sk_drops: ListenDrops (and backlog drops) on this socket


def parse_diag(data: bytes, family: int) -> tuple[list[Listener], bool]:
    """The listeners in one netlink answer of inet_diag messages, and whether it was the
    last part (NLMSG_DONE). An NLMSG_ERROR raises OSError with its errno."""
    out: list[Listener] = []
    pos = 0
    while pos + _NLMSG.size <= len(data):
        length, mtype, _flags, _seq, _pid = _NLMSG.unpack_from(data, pos)
        if length < _NLMSG.size:
            break
        body = data[pos + _NLMSG.size : pos + length]
        pos += (length + 3) & ~3
        if mtype == NLMSG_DONE:
            return out, True
        if mtype == NLMSG_ERROR:
            err = -struct.unpack_from("=i", body)[0]
            if err:
                raise OSError(err, f"sock_diag: {err}")
            continue
        if mtype != SOCK_DIAG_BY_FAMILY or len(body) < _MSG.size:
            continue
        fam, _state, _t, _r, sport, _dport, src, _dst, _if, _cookie, _exp, rq, wq, _u, _i = (
            _MSG.unpack_from(body)
        )
        drops = 0
        at = _MSG.size
        while at + _RTA.size <= len(body):
            alen, atype = _RTA.unpack_from(body, at)
            if alen < _RTA.size:
                break
            if atype == INET_DIAG_SKMEMINFO and alen >= _RTA.size + 4 * (SK_MEMINFO_DROPS + 1):
                drops = struct.unpack_from("=I", body, at + _RTA.size + 4 * SK_MEMINFO_DROPS)[0]
            at += (alen + 3) & ~3
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address
        ip = ipaddress.IPv4Address(src[:4]) if fam == socket.AF_INET else ipaddress.IPv6Address(src)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # a dual-stack socket's IPv4 address, spelled as IPv4
        addr = "" if ip.is_unspecified else str(ip)
        out.append(Listener(fam or family, addr, struct.unpack("!H", sport)[0], rq, wq, drops))
    return out, False


def listeners() -> list[Listener]:
    """The TCP listeners of the calling thread's network namespace (a netlink socket
    answers for the namespace it was made in)."""
    out: list[Listener] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_INET_DIAG) as s:
        s.settimeout(2.0)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
            req = _REQ.pack(
                family,
                socket.IPPROTO_TCP,
                1 << (INET_DIAG_SKMEMINFO - 1),
                1 << TCP_LISTEN,
                bytes(48),
            )
            s.send(
                _NLMSG.pack(
                    _NLMSG.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
                )
                + req
            )
            done = False
            while not done:
                got, done = parse_diag(s.recv(65536), family)
                out.extend(got)
    return out


def parse_netstat(text: str) -> dict[str, int]:
    """/proc/net/netstat's TcpExt counters (name -> value), as nstat reads them."""
    lines = text.splitlines()
    out: dict[str, int] = {}
    for head, values in zip(lines[::2], lines[1::2], strict=False):
        names, nums = head.split(), values.split()
        if names and names[0] == "TcpExt:" and nums and nums[0] == "TcpExt:":
            out.update((n, int(v)) for n, v in zip(names[1:], nums[1:], strict=False))
    return out


def parse_local_addresses(fib_trie: str, if_inet6: str) -> list[str]:
    """The namespace's own addresses, loopback left out: IPv4 from the local table of
    /proc/net/fib_trie ("/32 host LOCAL" under an address), IPv6 from /proc/net/if_inet6
    (global scope)."""
    out: list[str] = []
    last = ""
    for line in fib_trie.splitlines():
        s = line.strip()
        if s.startswith(("|--", "+--")):
            last = s[3:].strip().split()[0]
        elif "/32 host LOCAL" in s and last and not last.startswith("127.") and last not in out:
            out.append(last)
    for line in if_inet6.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[3] == "00":  # scope global
            addr = str(ipaddress.IPv6Address(bytes.fromhex(parts[0])))
            if addr not in out:
                out.append(addr)
    return out


@dataclass
class Namespace:
    """What one walk of a network namespace found."""

    addresses: list[str]
    netstat: dict[str, int]
    listeners: list[Listener]


def look(net: Path = Path("/proc/thread-self/net"), listen: bool = True) -> Namespace:
    """The calling thread's network namespace: its addresses, and (listen) its counters
    and listeners."""

    def text(name: str) -> str:
        try:
            return (net / name).read_text()
        except OSError:
            return ""

    addresses = parse_local_addresses(text("fib_trie"), text("if_inet6"))
    if not listen:
        return Namespace(addresses, {}, [])
    return Namespace(addresses, parse_netstat(text("netstat")), listeners())


class Deltas:
    """Cumulative counters by key to what grew since the last sight; a key's first sight
    is its baseline, and one that went down (a new socket, a new namespace at the same
    key) starts again from zero. Keys not seen in a round are forgotten."""

    def __init__(self) -> None:
        self._last: dict[object, int] = {}
        self._seen: set[object] = set()

    def take(self, key: object, value: int) -> int:
        self._seen.add(key)
        old = self._last.get(key)
        self._last[key] = value
        if old is None:
            return 0
        return value - old if value >= old else value

    def end_round(self) -> None:
        for key in [k for k in self._last if k not in self._seen]:
            del self._last[key]
        self._seen = set()


Who = tuple[str, str, str, str]
NOBODY: Who = ("", "", "", "")


class ListenCounts:
    """Per read: every namespace walked, its counters' growth handed to the callbacks with
    the pod it belongs to."""

    def __init__(self, who: Callable[[Iterable[str]], Who]) -> None:
        self._who = who
        self.netns = Deltas()
        self.sockets = Deltas()
        self.queues: dict[tuple[Who, int], tuple[int, int]] = {}  # (pod, port) -> queued, limit

    def take(self, ino: int, ns: Namespace) -> tuple[Who, int, int, dict[int, int]]:
        """(pod, ListenOverflows grew, ListenDrops grew, port -> its listeners' drops grew)."""
        pod = self._who(ns.addresses)
        overflows = self.netns.take((ino, "ListenOverflows"), ns.netstat.get("ListenOverflows", 0))
        drops = self.netns.take((ino, "ListenDrops"), ns.netstat.get("ListenDrops", 0))
        ports: dict[int, int] = {}
        for lst in ns.listeners:
            owner = self._who([lst.addr]) if lst.addr else pod
            grew = self.sockets.take((ino, lst.family, lst.addr, lst.port), lst.drops)
            ports[lst.port] = ports.get(lst.port, 0) + grew
            self.queues[(owner, lst.port)] = (lst.queued, lst.limit)
        return pod, overflows, drops, ports

    def end_round(self) -> None:
        self.netns.end_round()
        self.sockets.end_round()
