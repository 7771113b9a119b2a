"""Debian's prometheus, scraping given targets every second, for end-to-end tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

from tests.agentproc import free_port, get, stop_process, wait_http_ok
from tests.conftest import wait_for

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def available() -> str | None:
    """Why a real Prometheus cannot run here, or None."""
    if not Path(PROMETHEUS).exists() or not Path(PROMTOOL).exists():
        return "Debian's prometheus package is not installed (scripts/setup.sh test installs it)"
    return None


class Prometheus:
    def __init__(
        self,
        targets: list[str],
        rule_files: list[str] | None = None,
        openmetrics: str | None = None,
        labels: dict[str, str] | None = None,
        flags: list[str] | None = None,
        remote_write: list[dict[str, Any]] | None = None,
        tsdb: Path | None = None,
        alertmanagers: list[str] | None = None,
    ) -> None:
        """openmetrics: series (OpenMetrics text, with timestamps) written into its TSDB
        by `promtool tsdb create-blocks-from openmetrics` before it starts, so a test
        knows every number a query returns; tsdb: a TSDB directory made so already
        (create_blocks), taken as its data. flags: more command-line flags (e.g.
        --web.enable-remote-write-receiver); remote_write: its remote_write section;
        alertmanagers: the Alertmanagers (host:port) its alerts go to."""
        self.dir = Path(tempfile.mkdtemp(prefix="lens-prom-"))
        if tsdb is not None:
            shutil.move(str(tsdb), self.dir / "data")
        if openmetrics is not None:
            (self.dir / "series.om").write_text(openmetrics)
            create_blocks(self.dir / "series.om", self.dir / "data")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": rule_files or [],
            "scrape_configs": [
                {
                    "job_name": "lens-ebpf",
                    "static_configs": [{"targets": targets, "labels": labels or {}}],
                }
            ],
        }
        if remote_write:
            cfg["remote_write"] = remote_write
        if alertmanagers:
            cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": alertmanagers}]}]}
        (self.dir / "prometheus.yml").write_text(json.dumps(cfg))
        self.flags = list(flags or [])
        self.log = open(self.dir / "log", "w")  # noqa: SIM115 (open while prometheus runs)
        self.proc = self._run()

    def _run(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *self.flags,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_http_ok(
            self.base + "/-/ready", proc, "prometheus", lambda: (self.dir / "log").read_text()
        )
        return proc

    def pause(self) -> None:
        """Stopped, its data kept (start() runs it again on the same port)."""
        stop_process(self.proc)

    def start(self) -> None:
        self.proc = self._run()

    def query(self, expr: str) -> dict[str, Any]:
        status, body = get(self.base + "/api/v1/query?query=" + urllib.parse.quote(expr))
        out = json.loads(body)
        assert status == 200 and out["status"] == "success", body
        return out["data"]

    def wait_value(self, expr: str, ok: Any, timeout: float = 20) -> list[dict[str, Any]]:
        """Poll expr until ok(result list) holds; a hang-guard failure otherwise."""
        last: list[list[dict[str, Any]]] = [[]]

        def check() -> list[dict[str, Any]] | None:
            last[0] = self.query(expr)["result"]
            return last[0] if ok(last[0]) else None

        return wait_for(check, lambda: f"result for {expr} (last {last[0]})", timeout, every=0.5)

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def create_blocks(openmetrics: Path, tsdb: Path) -> None:
    """Write an OpenMetrics file's samples into blocks of a TSDB directory (more files,
    more blocks: a large data set goes in a file at a time)."""
    res = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(tsdb)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, f"promtool: {res.stdout[-2000:]}{res.stderr[-2000:]}"


def promtool_check_metrics(text: str) -> tuple[int, list[str]]:
    res = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    problems = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
    return res.returncode, problems
