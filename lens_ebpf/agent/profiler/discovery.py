"""Where a process's PyTorch profiler traces are, seen through /proc/<pid>/root.

The directories looked in: the process's cwd, the values of its arguments whose flag names
a profile or trace directory (`--profile-dir X`, `--profile_dir=X`, `--trace-dir`, ...),
the directories its environment names (TORCH_PROFILER_DIR and any variable whose name holds
PROFILE or TRACE_DIR: read here, never passed on), and configured globs; each walked a few
levels deep for names torch.profiler writes (`*.pt.trace.json`, `*.pt.trace.json.gz`, and
configured patterns). No symbolic link is followed, and a path through one is refused: an
absolute link in a container would otherwise resolve on the host through /proc/<pid>/root.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

NAMES = ("*.pt.trace.json", "*.pt.trace.json.gz")  # torch.profiler's tensorboard_trace_handler
FLAG = re.compile(r"^--?[\w-]*(profil|trace)[\w-]*(dir|path|folder|output)[\w-]*$", re.I)
ENV = re.compile(r"^(TORCH_PROFILER_DIR|[A-Z0-9_]*(PROFILE|PROFILER|TRACE)_(DIR|PATH)[A-Z0-9_]*)$")
RANK_NAME = re.compile(r"(?:^|[^a-z])(?:rank|r)[-_]?(\d{1,6})(?:[^0-9]|$)", re.I)
RANK_JSON = re.compile(rb'"distributedInfo"\s*:\s*\{[^}]*?"rank"\s*:\s*(\d{1,7})')
PEEK = 64 << 10  # bytes of a trace read for its rank where its name does not say


class UnsafePathError(Exception):
    """A path that leaves the container's root or passes a symbolic link."""


@dataclass(frozen=True)
class Found:
    path: str  # inside the container
    size: int
    mtime: float
    rank: int
    pid: int
    found_by: str  # cwd, argument, environment, glob


def inside(root: Path, path: str) -> Path:
    """root/path, each component checked: no '..', no symbolic link (UnsafePathError)."""
    p = PurePosixPath(path)
    if not p.is_absolute():
        raise UnsafePathError(f"{path}: not absolute")
    at = root
    for part in p.parts[1:]:
        if part in ("..", "."):
            raise UnsafePathError(f"{path}: {part} in it")
        at = at / part
        try:
            mode = os.lstat(at).st_mode
        except OSError as exc:
            raise FileNotFoundError(path) from exc
        if stat.S_ISLNK(mode):
            raise UnsafePathError(f"{path}: passes a symbolic link")
    return at


def flagged_dirs(argv: list[str], cwd: str) -> list[str]:
    """The directories argv's profile/trace flags name, absolute (relative ones under cwd)."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if not FLAG.match(flag):
            continue
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                continue
            value = argv[i + 1]
        if value:
            out.append(str(PurePosixPath(cwd) / value) if not value.startswith("/") else value)
    return out


def environment_dirs(environ: bytes, cwd: str) -> list[str]:
    """The directories the environment's profiler variables name (their values stay here)."""
    out: list[str] = []
    for entry in environ.split(b"\0"):
        name, eq, value = entry.partition(b"=")
        if not eq or not ENV.match(name.decode("ascii", "replace")):
            continue
        v = value.decode("utf-8", "replace")
        if v:
            out.append(v if v.startswith("/") else str(PurePosixPath(cwd) / v))
    return out


def rank_of(name: str, head: bytes) -> int:
    """The rank a trace's name says (rank-3, rank_3), else its distributedInfo's; -1."""
    m = RANK_NAME.search(name)
    if m:
        return int(m.group(1))
    found = RANK_JSON.search(head)
    return int(found.group(1)) if found else -1


def head_of(path: Path) -> bytes:
    """The first PEEK bytes of the trace as JSON (a .gz one decompressed); b"" where it
    cannot be read."""
    try:
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as f:
            raw = f.read(PEEK)
    except OSError:
        return b""
    if raw[:2] == b"\x1f\x8b":
        try:
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, PEEK)
        except zlib.error:
            return b""
    return raw


def walk(
    root: Path, start: str, patterns: Iterable[str], depth: int, budget: list[int]
) -> Iterator[tuple[str, os.stat_result]]:
    """(path in the container, its lstat) of each regular file under start whose name
    matches, depth levels down, no link followed; budget[0]: entries left to look at."""
    try:
        top = inside(root, start)
    except (UnsafePathError, FileNotFoundError):
        return
    stack = [(top, PurePosixPath(start), 0)]
    pats = tuple(patterns)
    while stack and budget[0] > 0:
        d, rel, level = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in sorted(entries, key=lambda e: e.name):
            budget[0] -= 1
            if budget[0] <= 0:
                return
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and level < depth:
                stack.append((Path(e.path), rel / e.name, level + 1))
            elif stat.S_ISREG(st.st_mode) and any(fnmatch.fnmatch(e.name, p) for p in pats):
                yield str(rel / e.name), st


def glob_files(
    root: Path, globs: Iterable[str], budget: list[int]
) -> Iterator[tuple[str, os.stat_result]]:
    """The regular files the configured globs (absolute, in the container) match."""
    for g in globs:
        if not g.startswith("/"):
            continue
        base = PurePosixPath(g)
        fixed = PurePosixPath("/")
        for part in base.parts[1:]:
            if any(c in part for c in "*?["):
                break
            fixed = fixed / part
        rest = str(base.relative_to(fixed)) if base != fixed else ""
        try:
            top = inside(root, str(fixed))
        except (UnsafePathError, FileNotFoundError):
            continue
        for p in sorted(top.glob(rest)) if rest else [top]:
            budget[0] -= 1
            if budget[0] <= 0:
                return
            path = str(fixed / p.relative_to(top))
            try:
                inside(root, path)
                st = os.lstat(p)
            except (UnsafePathError, OSError):
                continue
            if stat.S_ISREG(st.st_mode):
                yield path, st


def process_dirs(procfs: Path, pid: int) -> tuple[str, list[tuple[str, str]]]:
    """The process's cwd (in its container) and the directories to look in, each with
    what named it."""
    d = procfs / str(pid)
    try:
        cwd = os.readlink(d / "cwd")
    except OSError:
        cwd = "/"
    try:
        argv = [a.decode("utf-8", "replace") for a in (d / "cmdline").read_bytes().split(b"\0")]
    except OSError:
        argv = []
    try:
        environ = (d / "environ").read_bytes()
    except OSError:
        environ = b""
    dirs = [(cwd, "cwd")] + [(x, "argument") for x in flagged_dirs(argv, cwd)]
    dirs += [(x, "environment") for x in environment_dirs(environ, cwd)]
    return cwd, dirs


def find(
    procfs: Path,
    pids: Iterable[int],
    patterns: Iterable[str] = NAMES,
    globs: Iterable[str] = (),
    depth: int = 3,
    max_entries: int = 20000,
) -> list[Found]:
    """The profiler traces of these processes (one container's: one root), newest first,
    each once (the first process that led to it)."""
    pats = tuple(patterns) or NAMES
    seen: dict[str, Found] = {}
    budget = [max_entries]
    for pid in pids:
        root = procfs / str(pid) / "root"
        _, dirs = process_dirs(procfs, pid)
        hits: list[tuple[str, os.stat_result, str]] = []
        for start, why in dirs:
            hits += [(p, st, why) for p, st in walk(root, start, pats, depth, budget)]
        hits += [(p, st, "glob") for p, st in glob_files(root, globs, budget)]
        for path, st, why in hits:
            if path in seen:
                continue
            name = PurePosixPath(path).name
            head = b"" if RANK_NAME.search(name) else head_of(root / path.lstrip("/"))
            seen[path] = Found(path, st.st_size, st.st_mtime, rank_of(name, head), pid, why)
    return sorted(seen.values(), key=lambda f: (-f.mtime, f.path))


def open_trace(root: Path, path: str) -> tuple[int, os.stat_result]:
    """An open descriptor of the trace at path in root (no link anywhere on the way) and
    its stat."""
    at = inside(root, path)
    fd = os.open(at, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePathError(f"{path}: not a regular file")
    return fd, st
