"""What the BPF compiler leaves in memory once the programs are loaded.

BCC compiles each program with clang and LLVM inside the agent's process: ~80 MB of their
shared libraries' pages are resident after the last compile (libLLVM, libclang-cpp), and
glibc keeps the heap their work freed. Neither is used again until the next compile, so
after start-up the agent gives both back: the libraries' clean pages (a page the process
never wrote: madvise(MADV_DONTNEED) lets it go, and a later compile reads it back from the
page cache) and the heap's free pages (malloc_trim). A mapping with any page of its own
(relocated data, COW) is left alone: dropping it would lose what was written.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

MADV_DONTNEED = 4
# the compiler's libraries, by file name
COMPILER = re.compile(r"/lib(LLVM|clang-cpp|clang)[-.][^/]*\.so[^/]*$")


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library the process runs with (its madvise and malloc_trim), opened once."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    except (OSError, AttributeError):
        return None
    return libc


def clean_compiler_mappings(smaps: str) -> list[tuple[int, int, int]]:
    """(start, end, resident bytes) of the compiler libraries' mappings that hold no page
    of their own (Anonymous 0, Private_Dirty 0), from /proc/<pid>/smaps text."""
    out = []
    cur: list[int] | None = None
    fields: dict[str, int] = {}

    def close() -> None:
        if (
            cur is not None
            and fields.get("Anonymous", 1) == 0
            and fields.get("Private_Dirty", 1) == 0
            and fields.get("Rss", 0) > 0
        ):
            out.append((cur[0], cur[1], fields["Rss"] * 1024))

    for line in smaps.splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:
            close()
            path = head[5] if len(head) > 5 else ""
            lo, hi = head[0].split("-")
            cur = [int(lo, 16), int(hi, 16)] if COMPILER.search(path) else None
            fields = {}
        elif cur is not None and len(head) >= 2 and head[0].endswith(":") and head[1].isdigit():
            fields[head[0][:-1]] = int(head[1])
    close()
    return out


def release_compiler_memory(smaps_path: Path = Path("/proc/self/smaps")) -> int:
    """Give back the compiler libraries' clean resident pages and the heap's free ones;
    the bytes of library pages let go (0 where it cannot: no libc, no smaps)."""
    libc = _libc()
    if libc is None:
        return 0
    try:
        text = smaps_path.read_text()
    except OSError:
        return 0
    freed = 0
    for start, end, rss in clean_compiler_mappings(text):
        if libc.madvise(ctypes.c_void_p(start), end - start, MADV_DONTNEED) == 0:
            freed += rss
        else:
            log.debug("madvise %x-%x: errno %d", start, end, ctypes.get_errno())
    trim_heap()
    return freed


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's malloc_trim): Python's
    allocator and LLVM keep them after many objects are freed."""
    libc = _libc()
    with contextlib.suppress(AttributeError):  # not glibc: nothing to do
        if libc is not None:
            libc.malloc_trim(0)
