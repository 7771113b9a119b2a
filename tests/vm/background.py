"""The kernel matrix booted before pytest starts: `make test` (scripts/test.sh) names a
directory in PYTEST_KMATRIX_DIR and scripts/setup.sh starts the guests into it as soon
as the venv, the compiled event path and the kernels are ready, so they run while the
rest of the setup (the node's binaries, the images), lint and the host's tests run.
pytest then reads each guest's result from that directory, as its xdist workers already
do (tests/vm/test_kernel_matrix.py).

    python -m tests.vm.background DIR

returns at once; a process of its own session boots the guests (two at a time) and
exits when the last has stopped. Its process group is in DIR/pgid: one kill of that
group stops it and its guests (scripts/test.sh does so when `make test` ends early).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PGID = "pgid"  # the booting process's group, written before anything boots
LOG = "background.log"


def launch(out: Path) -> int:
    """Detach the booting process; return its pid."""
    out.mkdir(parents=True, exist_ok=True)
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        log = os.open(out / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        (out / PGID).write_text(f"{os.getpgid(0)}\n")
        _run(out)
    except BaseException as e:  # the matrix's test says what the share lacks
        print(f"kernel matrix: the early start failed: {e!r}", file=sys.stderr, flush=True)
    finally:
        # not os._exit: the thread pool's workers finish their result.json first
        sys.stdout.flush()
    sys.exit(0)


def _run(out: Path) -> None:
    from tests.vm import test_kernel_matrix

    matrix = test_kernel_matrix.start(out)
    for series, future in matrix.runs.items():
        try:
            future.result()
        except Exception as e:
            print(f"kernel matrix: {series}: {e!r}", flush=True)


def started(out: Path) -> bool:
    """Whether launch() ran into out (before pytest: its plan follows within a second)."""
    return (out / PGID).exists()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.vm.background DIR", file=sys.stderr)
        return 2
    pid = launch(Path(argv[0]))
    print(f"kernel matrix: guests booting in the background (pid {pid}) into {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
