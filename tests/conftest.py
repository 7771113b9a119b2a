"""Shared test switches: BPF and e2e tests need root and BCC, and say why they skip."""

from __future__ import annotations

import os
import shutil

import pytest

# Inside a kernel-matrix guest (tests/vm): QEMU emulates the CPU (TCG), many times slower
# than the host, so waits stretch; counts stay exact.
EMULATED = bool(os.environ.get("KMATRIX_KERNEL"))


def stretch(seconds: float) -> float:
    """A wait long enough here: as given on the host, eight times that in a guest."""
    return seconds * 8 if EMULATED else seconds


def bpf_unavailable() -> str | None:
    """Why real BPF programs cannot be loaded here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (CAP_BPF, CAP_PERFMON) to load BPF programs"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "BCC is not importable (install python3-bpfcc; run from .venv)"
    from lens_ebpf import tracefs

    if tracefs.ensure_mounted() is None:
        return "tracefs is not mounted and cannot be"
    return None


def netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = bpf_unavailable()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "bpf" in item.keywords or "e2e" in item.keywords:
            item.add_marker(skip)
