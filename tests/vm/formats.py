"""Refresh tests/fixtures/tracefs/<kernel>/: the format files of every tracepoint the
programs' specs name, as each kernel of the matrix and the host describe them.

    python -m tests.vm.formats
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from pathlib import Path

from lens_ebpf.agent import tracefs
from lens_ebpf.agent.check import SPECS
from tests.vm import kernels, qemu

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "tracefs"


def tracepoints() -> list[str]:
    return sorted({tp for spec in SPECS for tp in spec.all_tracepoints()})


def copy_formats(events: Path, dest: Path) -> int:
    """Copy each named tracepoint's format that exists under events; how many."""
    shutil.rmtree(dest, ignore_errors=True)
    n = 0
    for tp in tracepoints():
        cat, _, name = tp.partition(":")
        src = events / cat / name / "format"
        if src.exists():
            (dest / cat / name).mkdir(parents=True, exist_ok=True)
            (dest / cat / name / "format").write_text(src.read_text())
            n += 1
    return n


def main() -> int:
    if sys.argv[1:] == ["--guest"]:  # inside a matrix guest: copy into the share
        events = Path("/sys/kernel/tracing/events")
        print(copy_formats(events, Path(os.environ["KMATRIX_OUT"]) / "events"))
        return 0
    host = tracefs.events_dir()
    if host is not None:
        series = ".".join(platform.release().split(".")[:2])
        print(f"{series}: {copy_formats(host, FIXTURES / series / 'events')} formats")
    for k in kernels.cached():
        res = qemu.boot(
            k, ".venv/bin/python -m tests.vm.formats --guest", workdir=ROOT, headers="fallback"
        )
        if res.rc != 0:
            print(f"{k.series}: rc={res.rc}\n{res.output}", file=sys.stderr)
            return 1
        dest = FIXTURES / k.series / "events"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(res.out / "events", dest)
        print(f"{k.series}: {res.output.strip()} formats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
