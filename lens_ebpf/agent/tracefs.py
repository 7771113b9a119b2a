"""Where tracefs lives, mounting it when missing, and which tracepoints exist."""

from __future__ import annotations

import ctypes
import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

CANDIDATES = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


def events_dir(candidates: tuple[Path, ...] = CANDIDATES) -> Path | None:
    """The mounted tracefs events directory, if any."""
    for root in candidates:
        if (root / "events").is_dir():
            return root / "events"
    return None


def ensure_mounted(target: Path = CANDIDATES[0]) -> Path | None:
    """Mount tracefs at target when no tracefs is visible (needs CAP_SYS_ADMIN)."""
    found = events_dir()
    if found is not None:
        return found.parent
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.mount(b"tracefs", str(target).encode(), b"tracefs", 0, None)
    if rc != 0:
        err = ctypes.get_errno()
        log.warning("cannot mount tracefs at %s: %s", target, os.strerror(err))
        return None
    log.info("mounted tracefs at %s", target)
    return target


def tracepoint_exists(tracepoint: str, events: Path | None = None) -> bool:
    """True when the running kernel describes tracepoint ("category:name") in tracefs."""
    root = events if events is not None else events_dir()
    category, _, name = tracepoint.partition(":")
    return root is not None and (root / category / name / "format").exists()


def kprobes_available(candidates: tuple[Path, ...] = CANDIDATES) -> bool:
    """kprobes need kprobe_events in tracefs (absent on kernels built without them)."""
    return any((root / "kprobe_events").exists() for root in candidates)


def kprobe_profile(candidates: tuple[Path, ...] = CANDIDATES) -> dict[str, tuple[int, int]]:
    """Each kprobe event made through kprobe_events -> (hits, misses), from kprobe_profile
    (a return probe misses when every instance of its maxactive is in use)."""
    for root in candidates:
        try:
            text = (root / "kprobe_profile").read_text()
        except OSError:
            continue
        return parse_kprobe_profile(text)
    return {}


def parse_kprobe_profile(text: str) -> dict[str, tuple[int, int]]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            out[parts[0]] = (int(parts[1]), int(parts[2]))
    return out


def tracepoint_fields(tracepoint: str, events: Path | None = None) -> frozenset[str]:
    """The fields of tracepoint's record as BCC names them (`__data_loc char[] comm` is
    `data_loc_comm`); empty when the kernel does not describe the tracepoint."""
    root = events if events is not None else events_dir()
    if root is None:
        return frozenset()
    category, _, name = tracepoint.partition(":")
    try:
        text = (root / category / name / "format").read_text()
    except OSError:
        return frozenset()
    return parse_format_fields(text)


def parse_format_fields(text: str) -> frozenset[str]:
    """Field names from a tracepoint format file, common_* fields left out."""
    names = set()
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("field:"):
            continue
        decl = line[len("field:") :].split(";", 1)[0].strip()
        ident = re.sub(r"\[[^\]]*\]", "", decl).split()[-1].lstrip("*")
        if ident.startswith("common_"):
            continue
        names.add(f"data_loc_{ident}" if decl.startswith("__data_loc") else ident)
    return frozenset(names)


def kernel_functions(names: set[str], kallsyms: Path = Path("/proc/kallsyms")) -> set[str]:
    """Which of names the running kernel has as functions a kprobe can attach to."""
    found: set[str] = set()
    try:
        with kallsyms.open() as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[1] in "tT" and parts[2] in names:
                    found.add(parts[2])
    except OSError:
        pass
    return found
