"""Debian's victoria-metrics (what Primus-Lens runs), scraping given targets every second,
for end-to-end tests of dashboards whose expressions use MetricsQL."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

from tests.agentproc import free_port, get, stop_process, wait_http_ok

VICTORIA = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"


def available() -> str | None:
    """Why a real VictoriaMetrics cannot run here, or None."""
    if not Path(VICTORIA).exists():
        return "Debian's victoria-metrics is not installed (scripts/setup.sh test installs it)"
    return None


class VictoriaMetrics:
    def __init__(self, targets: list[str], labels: dict[str, str]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="lens-vm-"))
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cfg = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "lens-ebpf",
                    "static_configs": [{"targets": targets, "labels": labels}],
                }
            ],
        }
        (self.dir / "scrape.yml").write_text(json.dumps(cfg))
        self.log = open(self.dir / "log", "w")  # noqa: SIM115 (open while it runs)
        self.proc = subprocess.Popen(
            [
                VICTORIA,
                f"-storageDataPath={self.dir / 'data'}",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                f"-promscrape.config={self.dir / 'scrape.yml'}",
                "-search.latencyOffset=0s",
                # a scrape that fails (its 1 s timeout, on a loaded machine) blanks no
                # series: with stale markers every instant query of the target's series
                # came back empty until its next scrape (CI16's test_dashboards)
                "-promscrape.noStaleMarkers",
                "-search.disableCache",
                "-retentionPeriod=1d",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_http_ok(
            self.base + "/health",
            self.proc,
            "victoria-metrics",
            lambda: (self.dir / "log").read_text(),
        )

    def api(self, path: str, **params: str | list[str]) -> Any:
        status, body = get(
            f"{self.base}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
        )
        out = json.loads(body)
        assert status == 200 and out["status"] == "success", (path, params, body)
        return out["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]  # type: ignore[no-any-return]

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
