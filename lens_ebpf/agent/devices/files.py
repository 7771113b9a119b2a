"""Reading sysfs and procfs files that may be absent, unreadable or not text."""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path) -> str | None:
    """The file's text, or None: gone, EINVAL (some iWARP and hwmon files), not UTF-8."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def read_bytes(path: Path) -> bytes | None:
    """The file's bytes (binary tables such as amdgpu's gpu_metrics), or None."""
    try:
        return path.read_bytes()
    except OSError:
        return None
