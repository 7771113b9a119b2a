"""Debian's prometheus-alertmanager (0.25) for end-to-end tests: its own port and storage,
no cluster peers, every alert routed to the webhook receivers a test gives, grouped per
alert and sent at once (group_wait and group_interval 1 s)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import requests

from tests.agentproc import free_port, stop_process, wait_http_ok

ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"


def available() -> str | None:
    """Why a real Alertmanager cannot run here, or None."""
    if not Path(ALERTMANAGER).exists():
        return (
            "Debian's prometheus-alertmanager is not installed (scripts/setup.sh test "
            "installs it)"
        )
    return None


class Alertmanager:
    def __init__(self, webhooks: list[dict[str, Any]]) -> None:
        """webhooks: Alertmanager webhook_configs ({url, http_config, send_resolved})."""
        self.dir = Path(tempfile.mkdtemp(prefix="lens-am-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = {
            "route": {
                "receiver": "hooks",
                "group_by": ["..."],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [{"name": "hooks", "webhook_configs": webhooks}],
        }
        (self.dir / "alertmanager.yml").write_text(json.dumps(cfg))
        self.log = open(self.dir / "log", "w")  # noqa: SIM115 (open while it runs)
        self.proc = subprocess.Popen(
            [
                ALERTMANAGER,
                f"--config.file={self.dir / 'alertmanager.yml'}",
                f"--storage.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_http_ok(
            self.url + "/-/ready", self.proc, "alertmanager", lambda: (self.dir / "log").read_text()
        )

    def alerts(self) -> list[dict[str, Any]]:
        """Its alerts as its API v2 lists them (status.state: active, suppressed)."""
        r = requests.get(self.url + "/api/v2/alerts", timeout=10)
        r.raise_for_status()
        return list(r.json())

    def silences(self) -> list[dict[str, Any]]:
        r = requests.get(self.url + "/api/v2/silences", timeout=10)
        r.raise_for_status()
        return list(r.json())

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
