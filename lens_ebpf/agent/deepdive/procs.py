"""A pod's processes from /proc: each container's, found by the pid namespace of its init
process (containerd's init.pid), with host and container pids (NSpid), comm, cmdline,
state, threads, CPU time, RSS, start time, whether it is Python, and the GPU device files
it holds open. Never a process's environment (/proc/<pid>/environ is not read).

The parsers are pure (text in, values out); `container_processes` does the reading under
a procfs root, so tests point it at any tree."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# an interpreter's name: python, python3, python3.11, python3.11d, pypy3
PYTHON_NAME = re.compile(r"^(python|pypy)[0-9.]*[a-z]?$")
# the device files that mean a GPU: AMD's render nodes and KFD, NVIDIA's device files
GPU_FILES = re.compile(r"^/dev/(dri/renderD(\d+)|kfd|nvidia(\d+)|nvidiactl|nvidia-uvm\S*)$")
RENDER_BASE = 128  # /dev/dri/renderD128 is the first GPU's


@dataclass
class HeldDevice:
    path: str
    index: int  # the GPU's index the path names, -1 where it names none (kfd, nvidiactl)
    vendor: str


@dataclass
class Proc:
    host_pid: int
    host_ppid: int = 0
    container_pid: int = 0
    container_ppid: int = 0
    comm: str = ""
    cmdline: str = ""
    exe: str = ""
    state: str = ""
    threads: int = 0
    cpu_seconds: float = 0.0
    rss_bytes: int = 0
    vsize_bytes: int = 0
    start_time: float = 0.0  # Unix seconds
    is_python: bool = False
    devices: list[HeldDevice] = field(default_factory=list)
    gpu_indexes: list[int] = field(default_factory=list)


def parse_status(text: str) -> dict[str, str]:
    """/proc/<pid>/status as {key: value} (values stripped)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def parse_stat(text: str) -> dict[str, int | str]:
    """The fields of /proc/<pid>/stat this module uses: state, ppid, utime, stime,
    num_threads, starttime (ticks since boot), vsize, rss (pages). The comm in parentheses
    may hold spaces and parentheses: the fields start after its last ')'."""
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); field n is rest[n - 3]
    return {
        "state": rest[0],
        "ppid": int(rest[1]),
        "utime": int(rest[11]),
        "stime": int(rest[12]),
        "num_threads": int(rest[17]),
        "starttime": int(rest[19]),
        "vsize": int(rest[20]),
        "rss": int(rest[21]),
    }


def boot_time(stat_text: str) -> float:
    """btime of /proc/stat (Unix seconds)."""
    for line in stat_text.splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def is_python(comm: str, exe: str, maps: str = "") -> bool:
    """An interpreter by its executable's or command's name, or one embedding libpython."""
    names = (os.path.basename(exe), comm)
    return any(PYTHON_NAME.match(n) for n in names if n) or "libpython" in maps


def held_device(target: str) -> HeldDevice | None:
    """The GPU device a /proc/<pid>/fd link names; None for any other file."""
    m = GPU_FILES.match(target)
    if m is None:
        return None
    if m.group(2) is not None:
        return HeldDevice(target, int(m.group(2)) - RENDER_BASE, "amd")
    if m.group(3) is not None:
        return HeldDevice(target, int(m.group(3)), "nvidia")
    return HeldDevice(target, -1, "amd" if target == "/dev/kfd" else "nvidia")


def read_process(procfs: Path, pid: int, btime: float) -> Proc | None:
    """One process as /proc shows it; None when it is gone (or was never there)."""
    d = procfs / str(pid)
    try:
        status = parse_status((d / "status").read_text())
        stat = parse_stat((d / "stat").read_text())
        raw = (d / "cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    try:
        exe = os.readlink(d / "exe")
    except OSError:
        exe = ""  # a kernel thread, or not ours to read
    nspid = [int(x) for x in status.get("NSpid", "").split() if x.isdigit()]
    comm = status.get("Name", "")
    p = Proc(
        host_pid=pid,
        host_ppid=int(stat["ppid"]),
        container_pid=nspid[-1] if len(nspid) > 1 else 0,
        comm=comm,
        cmdline=" ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a),
        exe=exe,
        state=str(stat["state"]),
        threads=int(stat["num_threads"]),
        cpu_seconds=(int(stat["utime"]) + int(stat["stime"])) / CLK_TCK,
        rss_bytes=int(stat["rss"]) * PAGE,
        vsize_bytes=int(stat["vsize"]),
        start_time=round(btime + int(stat["starttime"]) / CLK_TCK, 2),
    )
    maps = ""
    if not p.comm.startswith(("python", "pypy")):
        with contextlib.suppress(OSError):  # an interpreter embedded (libpython linked)
            maps = (d / "maps").read_text(errors="replace")
    p.is_python = is_python(p.comm, exe, maps)
    p.devices = held_devices(d)
    return p


def held_devices(d: Path) -> list[HeldDevice]:
    """The GPU device files a process has open, each path once."""
    seen: dict[str, HeldDevice] = {}
    try:
        fds = list((d / "fd").iterdir())
    except OSError:
        return []
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        dev = held_device(target)
        if dev is not None:
            seen.setdefault(dev.path, dev)
    return sorted(seen.values(), key=lambda h: h.path)


def pid_namespace(procfs: Path, pid: int) -> str:
    """The pid namespace a process is in (the link's text, pid:[inode]); "" when gone."""
    try:
        return os.readlink(procfs / str(pid) / "ns" / "pid")
    except OSError:
        return ""


def pids(procfs: Path) -> list[int]:
    return sorted(int(e.name) for e in procfs.iterdir() if e.name.isdigit())


def container_processes(
    procfs: Path, inits: Iterable[int], gpu_pids: dict[int, list[int]] | None = None
) -> dict[int, list[Proc]]:
    """Each container's processes by its init pid: those in the init's pid namespace, by
    host pid, each with its container parent's pid. A namespace two inits share (a pod
    sharing its process namespace) gives each the same processes."""
    inits = list(inits)
    spaces = {init: pid_namespace(procfs, init) for init in inits}
    out: dict[int, list[Proc]] = {init: [] for init in inits}
    try:
        btime = boot_time((procfs / "stat").read_text())
    except OSError:
        btime = 0.0
    by_ns: dict[str, list[Proc]] = {ns: [] for ns in spaces.values() if ns}
    for pid in pids(procfs):
        ns = pid_namespace(procfs, pid)
        if ns not in by_ns:
            continue
        p = read_process(procfs, pid, btime)
        if p is not None:
            p.gpu_indexes = sorted((gpu_pids or {}).get(pid, []))
            by_ns[ns].append(p)
    for ns, procs in by_ns.items():
        inner = {p.host_pid: p.container_pid for p in procs}
        for p in procs:
            p.container_ppid = inner.get(p.host_ppid, 0)
        for init in inits:
            if spaces[init] == ns:
                out[init] = procs
    return out
