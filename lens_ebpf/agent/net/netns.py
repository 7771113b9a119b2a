"""Every network namespace on the node, and running a call inside each.

The TCP socket iterator (bpf_iter__tcp) walks the sockets of the network namespace the
walk was started from: a walk per namespace reaches pods' sockets too.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from lens_ebpf.agent.net.proc_tcp import netns_pids

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
NAMED = Path("/run/netns")  # `ip netns add` and CNI plugins bind-mount namespaces here
T = TypeVar("T")
_libc = ctypes.CDLL(None, use_errno=True)


def namespaces(proc: Path = Path("/proc"), named: Path = NAMED) -> dict[int, Path]:
    """inode -> a path that opens the namespace: one process's /proc/<pid>/ns/net for
    each namespace a process is in, and the bind-mounted ones no process is in yet."""
    out: dict[int, Path] = {}
    try:
        paths = [proc / str(pid) / "ns" / "net" for pid in netns_pids(proc)]
    except OSError:  # no procfs (a container without it): the named ones only
        paths = []
    if named.is_dir():
        paths += sorted(named.iterdir())
    for path in paths:
        try:
            ino = os.stat(path).st_ino
        except OSError:
            continue  # the process ended, or a stale mount
        out.setdefault(ino, path)
    return out


def enter(fd: int) -> None:
    """Move the calling thread into the network namespace open at fd (setns(2))."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def in_each(paths: dict[int, Path], fn: Callable[[], T]) -> Iterator[tuple[int, T | None]]:
    """(inode, fn()) with the calling thread inside each namespace in turn (the thread's
    own namespace, when listed, without leaving it); the thread is back in its own
    namespace after, whatever happens. A namespace gone meanwhile is passed over; one
    that cannot be entered (no CAP_SYS_ADMIN) gives (inode, None)."""
    own_ino = os.stat("/proc/thread-self/ns/net").st_ino
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if own_ino in paths:
            yield own_ino, fn()
        for ino, path in paths.items():
            if ino == own_ino:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                enter(fd)
            except OSError as exc:
                log.debug("cannot enter network namespace %s: %s", path, exc)
                yield ino, None
                continue
            finally:
                os.close(fd)
            try:
                got = fn()
            finally:
                enter(own)
            yield ino, got
    finally:
        os.close(own)
