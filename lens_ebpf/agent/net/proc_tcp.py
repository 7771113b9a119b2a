"""Live TCP sockets of every network namespace, from /proc/<pid>/net/tcp{,6}.

Used to finish tracked sockets whose CLOSE transition the kernel never ran our
program for: a keyed socket that no namespace lists any more has closed.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from pathlib import Path

TIME_WAIT, LISTEN = "06", "0A"
Tuple = tuple[str, int, str, int]  # local address, local port, remote address, remote port


def _addr(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)
    # each 32-bit word is printed in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def parse_proc_net_tcp(text: str) -> set[Tuple]:
    """Sockets that still hold a full TCP socket (not LISTEN, not TIME_WAIT)."""
    out: set[Tuple] = set()
    for line in text.splitlines()[1:]:
        # only the first fields: under a connection storm most lines are TIME_WAIT
        parts = line.split(None, 4)
        if len(parts) < 4 or parts[3] in (TIME_WAIT, LISTEN):
            continue
        try:
            laddr, lport = parts[1].split(":")
            raddr, rport = parts[2].split(":")
            out.add((_addr(laddr), int(lport, 16), _addr(raddr), int(rport, 16)))
        except ValueError:
            continue
    return out


def tcp_in_use(net: Path = Path("/proc/thread-self/net")) -> int | None:
    """TCP sockets (IPv4 and IPv6) hashed in the calling thread's network namespace:
    listening, connecting, open or closing, not TIME_WAIT; sockstat's `inuse`, a counter
    the kernel keeps per namespace, so reading it walks no socket table. None when it
    cannot be read (no sockstat6 without IPv6: none of those)."""
    total = 0
    for name, prefix in (("sockstat", "TCP: inuse "), ("sockstat6", "TCP6: inuse ")):
        try:
            text = (net / name).read_text()
        except FileNotFoundError:
            if name == "sockstat6":
                continue
            return None
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(prefix):
                field = line[len(prefix) :].split(None, 1)[0]
                if not field.isdigit():
                    return None
                total += int(field)
                break
        else:
            return None
    return total


def netns_pids(proc: Path = Path("/proc")) -> Iterator[int]:
    """One process per network namespace: the lowest pid in it."""
    seen: set[str] = set()
    for pid in sorted(int(e.name) for e in proc.iterdir() if e.name.isdigit()):
        try:
            ns = os.readlink(proc / str(pid) / "ns" / "net")
        except OSError:
            continue
        if ns not in seen:
            seen.add(ns)
            yield pid


def live_sockets(proc: Path = Path("/proc")) -> set[Tuple]:
    """Every full TCP socket of every namespace on the node."""
    out: set[Tuple] = set()
    for pid in netns_pids(proc):
        for name in ("tcp", "tcp6"):
            try:
                out |= parse_proc_net_tcp((proc / str(pid) / "net" / name).read_text())
            except OSError:
                continue
    return out
