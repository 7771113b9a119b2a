"""What either service's command line shares: one-line usage errors, HOST:PORT flags,
and how a command ends (exit 2 with `lens-ebpf: error: ...` on stderr)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from lens_ebpf.core.settings import ConfigError, split_listen


class CliError(Exception):
    """A usage problem, worded for one line."""


def parse_listen(value: str, flag: str = "--listen") -> tuple[str, int]:
    """HOST:PORT, [V6]:PORT or :PORT."""
    try:
        return split_listen(value)
    except ValueError as exc:
        raise CliError(f"{flag} {value!r}: {exc}") from None


def run_command(fn: Callable[[], int]) -> int:
    """fn's exit status; a CliError or ConfigError is one line on stderr and exit 2."""
    try:
        return fn()
    except (CliError, ConfigError) as exc:
        print(f"lens-ebpf: error: {exc}", file=sys.stderr)
        return 2
