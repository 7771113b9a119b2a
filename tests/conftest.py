"""Shared test switches: BPF and e2e tests need root and BCC, and say why they skip."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")
# Inside a kernel-matrix guest (tests/vm): QEMU emulates the CPU (TCG), many times slower
# than the host; counts stay exact.
EMULATED = bool(os.environ.get("KMATRIX_KERNEL"))
# No test decides on time (timing figures live in bench/). A wait ends as soon as what
# it waits for happens; its limit is a hang guard that only says when to give up. The
# limits are written for an idle host and multiplied here: a busy machine runs several
# times slower, a TCG guest (about 8 times slower than the host on its own) more again.
SLOWDOWN = 16.0 if EMULATED else 4.0


@contextlib.contextmanager
def flow_flood(exclusive: bool) -> Iterator[None]:
    """make test's two workers share the host's TCP: a flood of distinct flows
    (tests/e2e/test_storm.py) fills every agent's flows map on the host, the node lab's
    too, and a flow made meanwhile lands in a map's overflow slot ("other"). The flood
    holds this lock exclusively; a test that counts its own flows through an agent whose
    map it does not own (the node lab's) holds it shared."""
    with open(Path(tempfile.gettempdir()) / "lens-tests-flow-flood.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def hang_guard(seconds: float) -> float:
    """How long to wait for what takes well under `seconds` on an idle host before
    calling it a hang."""
    return seconds * SLOWDOWN


def wait_for(
    check: Callable[[], T], what: str | Callable[[], str], timeout: float = 10, every: float = 0.1
) -> T:
    """check()'s first truthy value; a hang-guard failure saying what did not come
    (what: text, or a function that describes the state at the failure)."""
    guard = hang_guard(timeout)
    deadline = time.monotonic() + guard
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"hang guard: no {said} after {guard:.0f} s (got {got!r})")
        time.sleep(every)


def bpf_unavailable() -> str | None:
    """Why real BPF programs cannot be loaded here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (CAP_BPF, CAP_PERFMON) to load BPF programs"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "BCC is not importable (install python3-bpfcc; run from .venv)"
    from lens_ebpf.agent import tracefs

    if tracefs.ensure_mounted() is None:
        return "tracefs is not mounted and cannot be"
    return None


def netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    return None


# `make test` runs two pytest-xdist workers (`-n 2 --dist loadgroup --no-loadscope-reorder`)
# over work units, each a group of tests run in order by one worker: a worker takes the
# next unit, in collection order, when it has finished its last. "host" is what loads BPF
# programs or starts agents on this host (their exact counts see the host's traffic, and
# the kernel matrix's wait is theirs), so one worker runs all of it; "kube" is the
# Kubernetes labs (one node lab, API servers) in order; each module of tests/recorder is a
# unit of its own (its own ports, databases and directories), as is each of tests/unit. So
# the first worker takes the host's tests and the second the node, and both then share the
# rest (the recorder's modules, then the unit tests': small units, so both end together).
HOST, KUBE = "host", "kube"
MATRIX = "tests/vm/test_kernel_matrix.py"


def _group(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/kube/"):
        return KUBE
    for folder in ("recorder", "unit"):
        if path.startswith(f"tests/{folder}/"):
            return f"{folder}-{Path(path).stem}"
    return HOST


@pytest.hookimpl(tryfirst=True)  # before xdist names the groups in the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item.nodeid)))
    reason = bpf_unavailable()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "bpf" in item.keywords or "e2e" in item.keywords:
            item.add_marker(skip)


def _worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, the controller names the kernel matrix's directory to the workers
    (they start after this) and starts the guests itself: once, not once per worker."""
    if config.pluginmanager.hasplugin("dsession") and not _worker(config):
        from tests.vm import test_kernel_matrix

        # `make test` names it (scripts/test.sh) and may have booted the guests already
        if not os.environ.get(test_kernel_matrix.OUT_ENV):
            os.environ[test_kernel_matrix.OUT_ENV] = tempfile.mkdtemp(prefix="lens-kmatrix-")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """xdist's controller: a worker collected the kernel matrix, so boot its guests now,
    beside the host's tests (every worker collects the same tests; start() runs once)."""
    if any(i.startswith(MATRIX) for i in ids):
        from tests.vm import background, test_kernel_matrix

        out = Path(os.environ[test_kernel_matrix.OUT_ENV])
        if not background.started(out):
            test_kernel_matrix.start(out)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Boot the kernel matrix's guests as soon as they are collected, so they run beside
    the host's tests instead of after them (tests/vm/test_kernel_matrix.py); under xdist
    the controller does (above)."""
    if _worker(session.config):
        return
    if any(i.nodeid.startswith(MATRIX) for i in session.items):
        from tests.vm import background, test_kernel_matrix

        early = os.environ.get(test_kernel_matrix.OUT_ENV)
        if not (early and background.started(Path(early))):
            test_kernel_matrix.start(Path(tempfile.mkdtemp(prefix="lens-kmatrix-")))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per kernel-matrix guest: kernel, tests passed, seconds."""
    matrix = sys.modules.get("tests.vm.test_kernel_matrix")
    lines = matrix.summary_lines() if matrix is not None else []
    if lines:
        terminalreporter.section("kernel matrix")
        for line in lines:
            terminalreporter.write_line(line)
