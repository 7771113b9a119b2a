"""py-spy (PyPI) run against a host pid: `record` for N seconds (speedscope, flamegraph SVG,
raw) and `dump` (each thread's stack as JSON, locals optional), bounded: one run per
process at a time, a duration cap, an output size cap, runs at once per node. A caller that
goes away (a cancelled task) ends its run: the py-spy process is killed.

Errors are `RefusalError`s: a gRPC status code's name and a sentence for the operator."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

FORMATS = ("speedscope", "flamegraph", "raw")
SUFFIX = {"speedscope": ".json", "flamegraph": ".svg", "raw": ".txt", "dump": ".json"}


class RefusalError(Exception):
    """code: a grpc.StatusCode name (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION,
    RESOURCE_EXHAUSTED, ABORTED, UNAVAILABLE, DEADLINE_EXCEEDED)."""

    def __init__(self, code: str, why: str) -> None:
        super().__init__(why)
        self.code, self.why = code, why


@dataclass
class Result:
    output: bytes
    format: str
    seconds: float
    exited: bool = False


def find_pyspy(configured: str) -> str:
    """The py-spy binary: the configured path, else the one beside this interpreter (the
    venv's, where pip put it), else on PATH; "" when there is none."""
    if configured:
        return configured if os.access(configured, os.X_OK) else ""
    beside = Path(sys.executable).parent / "py-spy"
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy") or ""


def ended(procfs: Path, pid: int) -> bool:
    """The process is gone, or a zombie its parent has not reaped yet."""
    try:
        stat = (procfs / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :][:1] in ("Z", "X")


async def _ended_soon(procfs: Path, pid: int, within: float = 2.0) -> bool:
    """ended(), given an exit under way up to `within` seconds to finish."""
    for _ in range(int(within / 0.02)):
        if ended(procfs, pid):
            return True
        await asyncio.sleep(0.02)
    return ended(procfs, pid)


class PySpy:
    def __init__(
        self,
        binary: str,
        procfs: Path,
        max_duration: int,
        max_output: int,
        max_running: int,
        dump_timeout: float,
    ) -> None:
        self.binary, self.procfs = binary, procfs
        self.max_duration, self.max_output = max_duration, max_output
        self.max_running, self.dump_timeout = max_running, dump_timeout
        self.busy: set[int] = set()
        self.runs: dict[str, int] = {}  # outcome -> count (the metrics)

    def _count(self, outcome: str) -> None:
        self.runs[outcome] = self.runs.get(outcome, 0) + 1

    def check(self, pid: int, action: str, duration: int, rate: int, fmt: str) -> None:
        if action not in ("record", "dump"):
            raise RefusalError("INVALID_ARGUMENT", f"action {action!r}: record or dump")
        if action == "record":
            if fmt not in FORMATS:
                raise RefusalError(
                    "INVALID_ARGUMENT", f"format {fmt!r}: one of {', '.join(FORMATS)}"
                )
            if not 1 <= duration <= self.max_duration:
                raise RefusalError(
                    "INVALID_ARGUMENT",
                    f"duration {duration} s: 1 to "
                    f"{self.max_duration} (collectors.deepdive.max_duration_seconds)",
                )
            if not 1 <= rate <= 1000:
                raise RefusalError("INVALID_ARGUMENT", f"rate {rate}: 1 to 1000 samples a second")
        if not self.binary:
            raise RefusalError(
                "FAILED_PRECONDITION",
                "py-spy is not installed on this node's agent "
                "(pip install py-spy; collectors.deepdive.pyspy names its path)",
            )
        if pid in self.busy:
            raise RefusalError(
                "RESOURCE_EXHAUSTED",
                f"py-spy already runs against pid {pid}: one " "run per process at a time",
            )
        if len(self.busy) >= self.max_running:
            raise RefusalError(
                "RESOURCE_EXHAUSTED",
                f"{len(self.busy)} py-spy runs on this node "
                "already (collectors.deepdive.max_running)",
            )

    async def run(
        self,
        pid: int,
        action: str,
        duration: int = 10,
        rate: int = 100,
        fmt: str = "speedscope",
        native: bool = False,
        subprocesses: bool = False,
        locals_: bool = False,
    ) -> Result:
        """py-spy's output; RefusalError with the reason it could not be had. A dump waits up
        to dump_timeout for a free run (a stall dumps every rank of the node at once)."""
        if action == "dump":
            deadline = time.monotonic() + self.dump_timeout
            while (
                len(self.busy) >= self.max_running
                and pid not in self.busy
                and time.monotonic() < deadline
            ):
                await asyncio.sleep(0.05)
        self.check(pid, action, duration, rate, fmt)
        self.busy.add(pid)
        try:
            got = await self._run(pid, action, duration, rate, fmt, native, subprocesses, locals_)
        except RefusalError as r:
            self._count(r.code.lower())
            raise
        except asyncio.CancelledError:
            self._count("cancelled")
            raise
        finally:
            self.busy.discard(pid)
        self._count("ok")
        return got

    async def _run(
        self,
        pid: int,
        action: str,
        duration: int,
        rate: int,
        fmt: str,
        native: bool,
        subprocesses: bool,
        locals_: bool,
    ) -> Result:
        extra = (["--native"] if native else []) + (["--subprocesses"] if subprocesses else [])
        with tempfile.TemporaryDirectory(prefix="lens-pyspy-") as tmp:
            out = Path(tmp) / ("profile" + SUFFIX[fmt if action == "record" else "dump"])
            if action == "dump":
                args = ["dump", "--pid", str(pid), "--json", *extra] + (
                    ["--locals"] if locals_ else []
                )
                limit = self.dump_timeout
            else:
                args = [
                    "record",
                    "--pid",
                    str(pid),
                    "--duration",
                    str(duration),
                    "--rate",
                    str(rate),
                    "--format",
                    fmt,
                    "--output",
                    str(out),
                    "--nonblocking",
                    *extra,
                ]
                limit = duration + self.dump_timeout + 10  # its start and its write
            start = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                self.binary,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                stdout, stderr = await asyncio.wait_for(self._bounded(proc), limit)
            except TimeoutError:
                raise RefusalError(
                    "DEADLINE_EXCEEDED",
                    f"py-spy {action} of pid {pid} did not " f"end within {limit:.0f} s",
                ) from None
            finally:
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()
            seconds = round(time.monotonic() - start, 3)
            gone = ended(self.procfs, pid)
            if action == "record" and not gone and seconds < duration:
                # a record stops early only when its process ends, and py-spy can see that
                # before the kernel has finished the exit (the state is not Z yet)
                gone = await _ended_soon(self.procfs, pid)
            text = (stderr or stdout).decode(errors="replace").strip()
            if proc.returncode != 0:
                raise self._failure(pid, action, text, gone)
            if action == "dump":
                data = stdout
            else:
                if not out.exists():
                    raise self._failure(pid, action, text, gone)
                if out.stat().st_size > self.max_output:
                    raise RefusalError(
                        "RESOURCE_EXHAUSTED",
                        f"py-spy's {fmt} output is "
                        f"{out.stat().st_size} bytes, over "
                        f"collectors.deepdive.max_output_bytes ({self.max_output})",
                    )
                data = out.read_bytes()
            exited = gone and action == "record"
            if exited:
                raise RefusalError(
                    "ABORTED",
                    f"process {pid} exited during the {duration} s "
                    f"sample (after {seconds:.1f} s)",
                )
            return Result(data, fmt if action == "record" else "dump", seconds)

    async def _bounded(self, proc: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
        """stdout and stderr, stdout at most max_output bytes (then py-spy is killed)."""
        assert proc.stdout is not None and proc.stderr is not None
        err_task = asyncio.ensure_future(proc.stderr.read(64 << 10))
        chunks, size = [], 0
        while chunk := await proc.stdout.read(1 << 16):
            size += len(chunk)
            if size > self.max_output:
                proc.kill()
                err_task.cancel()
                raise RefusalError(
                    "RESOURCE_EXHAUSTED",
                    f"py-spy's output passed "
                    f"collectors.deepdive.max_output_bytes ({self.max_output})",
                )
            chunks.append(chunk)
        await proc.wait()
        return b"".join(chunks), await err_task

    def _failure(self, pid: int, action: str, text: str, gone: bool) -> RefusalError:
        last = text.splitlines()[-1] if text else "no output"
        if gone:
            return RefusalError("ABORTED", f"process {pid} exited during py-spy {action}: {last}")
        lower = text.lower()
        if "python" in lower and ("not" in lower or "failed to find" in lower):
            return RefusalError(
                "FAILED_PRECONDITION",
                f"pid {pid} is not a Python process py-spy " f"can read: {last}",
            )
        if "permission" in lower or "ptrace" in lower:
            return RefusalError(
                "FAILED_PRECONDITION",
                f"py-spy may not read pid {pid} (it needs " f"CAP_SYS_PTRACE): {last}",
            )
        return RefusalError("INTERNAL", f"py-spy {action} of pid {pid} failed: {last}")
