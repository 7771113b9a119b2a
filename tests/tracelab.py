"""`lens-ebpf trace` as a process, its JSON lines read as they come."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import IO

from tests.agentproc import LENS_CMD
from tests.conftest import hang_guard, wait_for


class Trace:
    """`lens-ebpf trace ... --json` running, its lines read as they come."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.p = subprocess.Popen(
            [*LENS_CMD, "trace", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.p.stderr is not None and self.p.stdout is not None
        line = self.p.stderr.readline()  # the ready line, once the programs are attached
        assert "tracing" in line, line + self.p.stderr.read()
        self.events: list[dict] = []
        self.lines: list[str] = []  # without --json: the lines as a person reads them
        self._json = "--json" in args
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.p.stdout, self._event), daemon=True),
            threading.Thread(target=self._read, args=(self.p.stderr, self.err.append), daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _event(self, line: str) -> None:
        if not line.strip():
            return
        if self._json:
            self.events.append(json.loads(line))
        else:
            self.lines.append(line)

    @staticmethod
    def _read(stream: IO[str], take: Callable[[str], None]) -> None:
        for line in stream:
            take(line)

    def until(self, done: Callable[[list[dict]], bool], what: str) -> None:
        wait_for(lambda: done(list(self.events)), lambda: f"{what} in {self.events}")

    def finish(self) -> tuple[list[dict], str]:
        """Ctrl-C, as a person ends it: the rest of the events and the summary."""
        self.p.send_signal(signal.SIGINT)
        self.p.wait(hang_guard(30))
        for t in self._readers:
            t.join(hang_guard(10))
        err = "".join(self.err)
        assert self.p.returncode == 0, err
        return self.events, err
