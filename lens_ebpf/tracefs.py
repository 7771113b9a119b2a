"""Where tracefs lives, mounting it when missing, and which tracepoints exist."""

from __future__ import annotations

import ctypes
import logging
import os
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
