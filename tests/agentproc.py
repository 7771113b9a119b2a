"""Start `lens-ebpf run` as a process and talk to it over HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import hang_guard

# the venv's entry point; where the package runs from a checkout without one (a lent GPU
# machine's Python), the same command through the interpreter
_SCRIPT = Path(sys.executable).with_name("lens-ebpf")
LENS_CMD = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "lens_ebpf"]


NO_KUBELET = "/nonexistent/lens-test/kubelet.sock"  # a PodResources socket that is never there


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = hang_guard(5)) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_http_ok(
    url: str, proc: subprocess.Popen, what: str, log: Callable[[], str], timeout: float = 30
) -> None:
    """Until url answers 200; a hang-guard failure (with the log's tail) when it does not
    within the guard, and at once when the process exits."""
    guard = hang_guard(timeout)
    deadline = time.monotonic() + guard
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited {proc.returncode}: {log()[-3000:]}")
        try:
            if get(url, timeout=5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"hang guard: {what} was not ready after {guard:.0f} s\n{log()[-3000:]}")


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples exactly as exposed: Prometheus keeps a counter's name as written
    (prometheus_client's parser would add _total to the seed counters)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"unparseable exposition line: {line!r}"
        labels = {
            k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            for k, v in _LABEL.findall(m.group(2) or "")
        }
        out.append((m.group(1), labels, float(m.group(3))))
    return out


class AgentProc:
    """A running agent; stop() sends SIGTERM and returns the exit status."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        full_env = {
            **os.environ,
            "LENS_BPF__READ_INTERVAL_SECONDS": "0.3",
            "LENS_POLICY__WATCH_INTERVAL_SECONDS": "0.3",
            # the host's kubelet is not the test's: make test's other worker runs a real
            # node (tests/kube/node.py) whose PodResources socket is at the default path,
            # and its device plugin offers the GPU fixtures' devices, which an agent
            # reading it would label with that node's pods
            "LENS_KUBERNETES__POD_RESOURCES__SOCKET": NO_KUBELET,
            **(env or {}),
        }
        if "--config" not in args and "LENS_GRPC__LISTEN" not in full_env:
            # a port of its own: the gRPC port is not shared (a taken one stops the agent)
            full_env["LENS_GRPC__LISTEN"] = f"127.0.0.1:{free_port()}"
        self.started = time.monotonic()
        # a file, not a pipe: a pipe nobody reads would block a chatty agent
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [*LENS_CMD, "run", "--listen", f"127.0.0.1:{self.port}", *args],
            env=full_env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_ready(self, timeout: float = 20) -> None:
        """Until /readyz answers 200 (start-up time is bench's to measure, not a test's)."""
        wait_http_ok(self.base + "/readyz", self.proc, "the agent", self.output, timeout)

    def json(self, path: str) -> tuple[int, Any]:
        status, body = get(self.base + path)
        return status, json.loads(body)

    def metrics_text(self) -> str:
        status, body = get(self.base + "/metrics")
        assert status == 200
        return body

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        for sname, slabels, value in parse_samples(self.metrics_text()):
            # an empty label is no label to Prometheus (the remote_* ones when standalone)
            if sname == name and (
                labels is None
                or {k: v for k, v in slabels.items() if v} == {k: v for k, v in labels.items() if v}
            ):
                return value
        return None

    def wait_sample(
        self, name: str, labels: dict[str, str], want: float, timeout: float = 10
    ) -> float | None:
        """The sample once it equals want; a hang-guard failure if it never does."""
        guard = hang_guard(timeout)
        deadline = time.monotonic() + guard
        got = None
        while time.monotonic() < deadline:
            got = self.sample(name, labels)
            if got == want:
                return got
            time.sleep(0.2)
        raise AssertionError(
            f"hang guard: {name}{labels} was {got}, not {want}, " f"after {guard:.0f} s"
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(hang_guard(timeout))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("hang guard: the agent did not stop on its signal") from None

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL if it does not end in time."""
    proc.terminate()
    try:
        proc.wait(hang_guard(timeout))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LENS_CMD, *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=hang_guard(timeout),
    )
